"""The one rule for where a bearer token may go (``common.http_trust``), as a table.

The steps and commands that send a token each test that they ask it
(tests/test_registry.py, tests/test_serving.py, tests/test_submit.py); this is
the rule itself, on URLs alone: nothing is resolved or contacted.
"""

from __future__ import annotations

import pytest

from common.http_trust import is_loopback, token_may_go_to


@pytest.mark.parametrize(
    "url",
    [
        "https://registry.example.com",
        "https://my-registry-rest.ns.svc:8443/api",
        "https://Registry.Example.COM:8443",
        "https://10.0.0.5:8443",
        "https://bücher.example",  # urllib3 writes it in IDNA (xn--bcher-kva.example): the same host
        "http://127.0.0.1:8089",
        "http://127.8.9.10:8089",  # all of 127.0.0.0/8 is this machine
        "http://localhost:8089",
        "http://LOCALHOST.:8089",
        "http://[::1]:8089",
        "http://[0:0::1]:8089",
        "http://[::ffff:127.0.0.1]:8080",  # IPv4-mapped: judged by its IPv4 address, whatever the Python version
    ],
)
def test_https_and_loopback_may_carry_a_token(url):
    assert token_may_go_to(url) is None


@pytest.mark.parametrize(
    "url",
    [
        "http://registry.example.com",
        "http://my-registry-rest.ns.svc:8080",
        "http://10.0.0.5:8080",
        "http://192.0.2.2:8080",
        "http://localhost.example.com:8080",  # a name that merely starts like localhost
        "http://localhost.evil.com",
        "http://127.0.0.1.nip.io:8080",  # a name that resolves to loopback is still a name: never resolved
        "http://127.0.0.1.nip.io",
        "http://[::ffff:192.0.2.2]:8080",  # IPv4-mapped: judged by its IPv4 address, which is another host
    ],
)
def test_plain_http_to_another_host_is_refused_unless_the_user_vouches_for_the_network(url):
    why = token_may_go_to(url)
    assert why and "plain http" in why and "not this machine" in why
    assert token_may_go_to(url, allow_http=True) is None


@pytest.mark.parametrize("url", ["ftp://registry.example.com", "registry.example.com:8080", "https://", "", "http://"])
def test_what_is_not_an_http_url_never_carries_a_token(url):
    assert token_may_go_to(url, allow_http=True)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        # urllib.parse reads host 127.0.0.1, urllib3 (kfp's and requests' clients) connects to evil.com
        ("http://evil.com\\@127.0.0.1:8080", "user name or password"),
        ("http://127.0.0.1:8080\\@evil.com", "user name or password"),
        ("http://127.0.0.1@evil.com", "user name or password"),  # user '127.0.0.1' at evil.com
        ("http://user:secret-password@127.0.0.1:8080", "user name or password"),
        ("https://user:secret-password@registry.example.com", "user name or password"),
        ("http://evil.com\\.127.0.0.1", "backslash"),
        ("http://127.0.0.1:80:90", "urllib3"),  # urllib.parse: 127.0.0.1; urllib3: no valid host
        ("http://127.0.0.1 ", "urllib3"),
        ("http://[::1", "not an https URL"),  # urllib.parse cannot read it at all
    ],
)
def test_a_url_whose_host_clients_read_differently_never_carries_a_token(url, reason):
    """The host judged must be the host connected to: a URL two parsers read as two hosts, or one that holds a
    credential, is refused whatever ``allow_http`` says, over https too, and the reason never repeats a
    password."""
    for allow_http in (False, True):
        why = token_may_go_to(url, allow_http)
        assert why and reason in why and "secret-password" not in why


@pytest.mark.parametrize("url", ["http://127.0.0.1:8089", "http://registry.example.com"])
def test_a_token_that_goes_over_https_only_never_goes_over_http(url):
    """The pod's service-account token: https, whatever the host and allow_http say."""
    assert "https only" in token_may_go_to(url, allow_http=True, https_only=True)
    assert token_may_go_to(url.replace("http://", "https://"), https_only=True) is None


def test_loopback_is_addresses_and_localhost_only():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.0.2.2") and not is_loopback("vm")


def test_an_ipv4_mapped_address_is_judged_by_its_ipv4_address():
    """``ipaddress`` answered False for ::ffff:127.0.0.1 before Python 3.13 and True from it; the rule states its
    own answer: a connection to an IPv4-mapped address goes to that IPv4 address."""
    assert is_loopback("::ffff:127.0.0.1") and is_loopback("::ffff:127.1.2.3")
    assert not is_loopback("::ffff:192.0.2.2") and not is_loopback("::ffff:0.0.0.0")
