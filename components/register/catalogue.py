"""Register a version in the Kubeflow Model Registry with the ``model-registry`` client; again is an update.

The registered model is found by name or created; the version (named after the
pipeline run) is found within it or created, and its properties are replaced by
the ones given; each artifact is found by name within the version and updated,
or created. So a retried step, or the step run again for the same run, changes
what is there and never adds a second version or artifact.

The client's async core (``ModelRegistryAPIClient``) is driven with
``asyncio.run``: its synchronous facade would patch the process's asyncio
globally (nest-asyncio) on construction.

Every request has a timeout (``REQUEST_TIMEOUT_S``; the generated client's own
is five minutes and the model-registry client sets none). A registry that is
restarting, behind a busy proxy or rate-limiting (a connection error, a
timeout, 5xx or 429) is tried ``ATTEMPTS`` times in all, with backoff, each
retry said in the log. The whole operation is tried again, not the one
request: the operation finds everything by name before it creates anything,
so a retried create never makes a second model, version or artifact, even
when the failed attempt did reach the server.

The token is sent only where ``common.http_trust.token_may_go_to`` allows
(https, or loopback, or plain http the user vouched for); anywhere else the
call is refused before the client exists.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

from common.errors import UserError, one_line
from common.http_trust import token_may_go_to
from common.records import Registration

AUTHOR = "llm-finetune-pipeline"
REQUEST_TIMEOUT_S = 30.0  # per request; a registry answers in milliseconds, a hung connection never
ATTEMPTS = 3  # tries in all of an operation that met a transient failure
BACKOFF_S = 2.0  # before the second try; doubled before each further one


@dataclass(frozen=True)
class Connection:
    """How to reach the registry: its URL, the token (kept out of ``repr``, so never in a log or a traceback),
    where the token came from (for a refusal), the CA to trust, and whether plain http may carry the token."""

    url: str
    token: str | None = field(default=None, repr=False)
    token_hint: str = "no token was sent"
    custom_ca: str | None = None
    allow_http: bool = False


@dataclass(frozen=True)
class ArtifactSpec:
    """One place the version went, as a model artifact."""

    name: str
    uri: str
    model_format_name: str
    model_format_version: str
    storage_key: str | None = None  # the data connection (Secret) a deployment reads an s3:// URI with
    storage_path: str | None = None


def register_version(
    connection: Connection, model_name: str, version_name: str, properties: dict, artifacts: list[ArtifactSpec]
) -> Registration:
    """Create or update ``model_name``'s version ``version_name`` with ``properties`` and ``artifacts``."""
    url = connection.url
    return _call(connection, lambda api: _register(api, url, model_name, version_name, properties, artifacts))


def add_version_properties(connection: Connection, version_id: str, properties: dict) -> None:
    """Add ``properties`` to (or replace them in) the version ``version_id``, keeping its others."""
    _call(connection, lambda api: _add_properties(api, version_id, properties))


def _call(connection: Connection, operation: Callable[[Any], Awaitable[Any]]) -> Any:
    """Run ``operation`` on a client of the registry, tried again on transient failures; its refusals and
    network failures as UserErrors."""
    from aiohttp import ClientError
    from mr_openapi.exceptions import ApiException, ForbiddenException, UnauthorizedException

    url = connection.url
    api = _client(connection)
    tries = f"{ATTEMPTS} tries" if ATTEMPTS > 1 else "1 try"
    try:
        return asyncio.run(_with_retries(url, lambda: operation(api)))
    except (UnauthorizedException, ForbiddenException) as error:
        raise UserError(
            f"The Model Registry at {url} refused the step ({error.status} {error.reason}): "
            f"{connection.token_hint}. Give the token's account access to the registry (OpenShift AI: Model "
            "registry settings → Manage permissions)."
        ) from None
    except ApiException as error:
        after = f" (after {tries})" if _transient(error) else ""
        raise UserError(
            f"The Model Registry at {url} answered {error.status} {error.reason}{after}: {one_line(error.body, 500)}"
        ) from None
    except TimeoutError:
        raise UserError(
            f"The Model Registry at {url} did not answer within {REQUEST_TIMEOUT_S:g} s ({tries}). Check "
            "model_registry_url (the registry's REST service or route, with its port) and the registry's health."
        ) from None
    except (ClientError, OSError) as error:
        raise UserError(
            f"Could not reach the Model Registry at {url} ({tries}): {error}. Check model_registry_url (the "
            "registry's REST service or route, with its port) and that this pod's network reaches it."
        ) from None


async def _with_retries(url: str, attempt: Callable[[], Awaitable[Any]]) -> Any:
    """``attempt()``, again after a transient failure, ``ATTEMPTS`` times in all, each retry said in the log."""
    for number in range(1, ATTEMPTS + 1):
        try:
            return await attempt()
        except Exception as error:
            why = _transient(error)
            if why is None or number == ATTEMPTS:
                raise
            delay = BACKOFF_S * 2 ** (number - 1)
            print(
                f"the Model Registry at {url} {why} (try {number} of {ATTEMPTS}); trying again in {delay:g} s",
                flush=True,
            )
            await asyncio.sleep(delay)


def _transient(error: BaseException) -> str | None:
    """What went wrong, when trying again may help (a timeout, a lost connection, 5xx, 429); else None."""
    from aiohttp import ClientConnectionError
    from mr_openapi.exceptions import ApiException

    if isinstance(error, ApiException) and (error.status == 429 or (error.status or 0) >= 500):
        return f"answered {error.status} {error.reason}"
    if isinstance(error, TimeoutError):
        return f"did not answer within {REQUEST_TIMEOUT_S:g} s"
    if isinstance(error, ClientConnectionError):
        return f"could not be reached ({one_line(error, 200) or type(error).__name__})"
    return None


def _client(connection: Connection):
    """The registry's client, once its token may go to its URL; every request it sends has a timeout."""
    from model_registry.core import ModelRegistryAPIClient

    url, token = connection.url, connection.token
    if token and (why := token_may_go_to(url, connection.allow_http)):
        raise UserError(
            f"Refusing to send the Model Registry token to model_registry_url: {why}. Use the registry's https "
            "endpoint, or set model_registry_allow_http to true only when the network encrypts the traffic itself "
            "(a service mesh with mTLS)."
        )
    parts = urlsplit(url)
    proxy = _env_proxy(url) if token and parts.scheme == "http" else None
    if proxy and (why := token_may_go_to(proxy, connection.allow_http)):
        raise UserError(
            f"Refusing to send the Model Registry token to {url}: the environment's proxy settings (HTTP_PROXY) "
            f"send that plain-http request through the proxy {proxy}, and {why}. Add the registry's host to "
            "NO_PROXY, or use the registry's https endpoint."
        )
    address = f"{parts.scheme}://{url_host(parts.hostname)}"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if parts.scheme == "https":
        if not token:
            raise UserError(
                f"No token to present to the Model Registry at {url}: an https registry (OpenShift AI's) takes a "
                "bearer token; set model_registry_secret to a Secret with the key 'token' (or set "
                "model_registry_use_service_account to true to present the pod's service-account token)."
            )
        api = ModelRegistryAPIClient.secure_connection(address, port, user_token=token, custom_ca=connection.custom_ca)
    else:
        api = ModelRegistryAPIClient.insecure_connection(address, port, token)
    return _with_timeouts(api)


def url_host(hostname: str) -> str:
    """``hostname`` (as ``urlsplit`` gives it) as a URL writes it: an IPv6 address in brackets. The client is built
    from scheme and host; ``http://::1`` would read as host ':' and port ':1'."""
    return f"[{hostname}]" if ":" in hostname else hostname


def _env_proxy(url: str) -> str | None:
    """The proxy the client sends a request for ``url`` through, as aiohttp reads it from the environment
    (HTTP_PROXY, NO_PROXY; the client's session trusts the environment), or None. A plain-http request hands its
    token to that proxy, so the proxy's URL must pass the same rule."""
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    try:
        proxy, _ = get_env_proxy_for_url(URL(url))
    except LookupError:
        return None
    return str(proxy)


def _with_timeouts(api):
    """``api`` with ``REQUEST_TIMEOUT_S`` on each request it sends: the model-registry client passes no timeout,
    and its generated REST layer then waits five minutes per request."""
    from aiohttp import ClientTimeout

    opened = api.get_client  # a fresh REST layer per call of the client

    @contextlib.asynccontextmanager
    async def get_client():
        async with opened() as service:
            rest = service.api_client.rest_client
            request = rest.request

            async def timed(method, url, headers=None, body=None, post_params=None, _request_timeout=None):
                timeout = _request_timeout or ClientTimeout(total=REQUEST_TIMEOUT_S)
                return await request(method, url, headers, body, post_params, _request_timeout=timeout)

            rest.request = timed
            yield service

    api.get_client = get_client  # an instance attribute: this client only
    return api


async def _register(api, url, model_name, version_name, properties, artifacts) -> Registration:
    from model_registry.types import ModelArtifact, ModelVersion, RegisteredModel

    model = await api.get_registered_model_by_params(model_name)
    if model is None:
        model = await api.upsert_registered_model(
            RegisteredModel(name=model_name, owner=AUTHOR, description="Fine-tuned by llm-finetune-pipeline.")
        )
    version = await api.get_model_version_by_params(model.id, version_name)
    created = version is None
    if created:
        version = ModelVersion(name=version_name, author=AUTHOR, description=f"Pipeline run {version_name}.")
    version.custom_properties = properties
    version = await api.upsert_model_version(version, model.id)
    existing = {artifact.name: artifact for artifact in await api.get_model_version_artifacts(version.id)}
    ids = {}
    for spec in artifacts:
        fields = {key: value for key, value in vars(spec).items() if key != "name"}
        if isinstance(artifact := existing.get(spec.name), ModelArtifact):
            for key, value in fields.items():
                setattr(artifact, key, value)
            artifact = await api.upsert_model_artifact(artifact)
        else:
            artifact = await api.upsert_model_version_artifact(ModelArtifact(name=spec.name, **fields), version.id)
        ids[spec.name] = artifact.id
    return Registration(url, model.id, version.id, ids, created)


async def _add_properties(api, version_id: str, properties: dict) -> None:
    version = await api.get_model_version_by_id(version_id)
    if version is None:
        raise UserError(f"The Model Registry has no model version {version_id} (deleted since it was registered?).")
    version.custom_properties = {**(version.custom_properties or {}), **properties}
    await api.upsert_model_version(version)
