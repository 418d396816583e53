"""Skip training on unchanged data: the fingerprint check against the Hub card or the workspace record.

The Hub cases run against ``tests/fake_hub.py``, a fake Hub on 127.0.0.1 (no real
Hub can be reached here); ``huggingface_hub.constants.ENDPOINT`` points at it.
"""

from __future__ import annotations

import pytest
from conftest import run_module
from fake_hub import FakeHub
from fake_run import FINGERPRINT, make_run
from huggingface_hub import ModelCard, ModelCardData, constants

from common.errors import UserError
from components.publish.changes import compare_with_published
from components.publish.options import PublishOptions
from components.publish.publish import publish

TOKEN = "hf_valid_test_token"
OTHER = "sha256:" + "cd" * 32
FAST = PublishOptions(first_retry_wait_s=0)


@pytest.fixture
def hub(monkeypatch):
    with FakeHub({TOKEN}) as fake:
        monkeypatch.setattr(constants, "ENDPOINT", fake.url)
        yield fake


MODEL = {"model-q8_0.gguf": b"GGUF"}  # a repository holds a published model when it holds model files


def card_with(fingerprint: str | None) -> bytes:
    data = ModelCardData(license="apache-2.0", **({"data_fingerprint": fingerprint} if fingerprint else {}))
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n# model\n")).encode()


def test_nothing_published_yet_means_changed(tmp_path):
    change = compare_with_published(FINGERPRINT, "", str(tmp_path), force=False, token=None)
    assert change.changed and "no earlier publish is recorded" in change.reason


def test_same_data_as_the_last_dry_run_is_unchanged_and_force_overrides(tmp_path):
    make_run(tmp_path)
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    same = compare_with_published(FINGERPRINT, "", str(tmp_path), force=False, token=None)
    assert not same.changed
    assert FINGERPRINT in same.reason and "run-1" in same.reason and "Set force" in same.reason
    assert compare_with_published(FINGERPRINT, "", str(tmp_path), force=True, token=None).changed
    other = compare_with_published(OTHER, "", str(tmp_path), force=False, token=None)
    assert other.changed and OTHER in other.reason and FINGERPRINT in other.reason


def test_the_record_is_kept_per_repository(tmp_path):
    """Without a token, a repository's own record on the workspace is what counts."""
    make_run(tmp_path)
    publish(str(tmp_path), "run-1", "", PublishOptions(repo_id="me/skills"), token=None)
    assert not compare_with_published(FINGERPRINT, "me/skills", str(tmp_path), force=False, token=None).changed
    assert compare_with_published(FINGERPRINT, "me/other", str(tmp_path), force=False, token=None).changed


def test_an_unreadable_record_means_changed(tmp_path):
    (tmp_path / "published").mkdir()
    (tmp_path / "published" / "dry-run.json").write_text("{not json")
    assert compare_with_published(FINGERPRINT, "", str(tmp_path), force=False, token=None).changed


def test_hub_card_fingerprint_decides(hub, tmp_path):
    hub.add_repo("model", "me/skills", {"README.md": card_with(FINGERPRINT), **MODEL}, private=True)
    same = compare_with_published(FINGERPRINT, "me/skills", str(tmp_path), force=False, token=TOKEN, options=FAST)
    assert not same.changed and "the model card of me/skills" in same.reason
    assert compare_with_published(OTHER, "me/skills", str(tmp_path), force=False, token=TOKEN, options=FAST).changed


def test_hub_without_repository_card_or_fingerprint_means_changed(hub, tmp_path):
    assert (
        "nothing is published at me/new"
        in compare_with_published(FINGERPRINT, "me/new", str(tmp_path), False, TOKEN, FAST).reason
    )
    hub.add_repo("model", "me/bare", {".gitattributes": b""})
    assert compare_with_published(FINGERPRINT, "me/bare", str(tmp_path), False, TOKEN, FAST).changed
    hub.add_repo("model", "me/card-only", {"README.md": card_with(FINGERPRINT)})
    change = compare_with_published(FINGERPRINT, "me/card-only", str(tmp_path), False, TOKEN, FAST)
    assert change.changed and "nothing is published at me/card-only" in change.reason
    hub.add_repo("model", "me/plain", {"README.md": card_with(None), **MODEL})
    change = compare_with_published(FINGERPRINT, "me/plain", str(tmp_path), False, TOKEN, FAST)
    assert change.changed and "holds no data_fingerprint" in change.reason
    hub.add_repo("model", "me/weights-only", MODEL)
    change = compare_with_published(FINGERPRINT, "me/weights-only", str(tmp_path), False, TOKEN, FAST)
    assert change.changed and "holds no data_fingerprint" in change.reason


def test_hub_5xx_is_retried(hub, tmp_path):
    hub.add_repo("model", "me/skills", {"README.md": card_with(FINGERPRINT), **MODEL})
    hub.fail_next("GET", "/me/skills/resolve/", 502)
    assert not compare_with_published(FINGERPRINT, "me/skills", str(tmp_path), False, TOKEN, FAST).changed
    assert [status for _, _, status in hub.requests_to("/resolve/")] == [502, 200]


def test_hub_rejecting_the_token_is_a_clear_error(hub, tmp_path):
    hub.add_repo("model", "me/skills", {"README.md": card_with(FINGERPRINT), **MODEL}, private=True)
    with pytest.raises(UserError, match="Secret 'hf-token'") as raised:
        compare_with_published(FINGERPRINT, "me/skills", str(tmp_path), False, "hf_expired_token", FAST)
    assert "hf_expired_token" not in str(raised.value)


def test_cli_reads_the_data_stage_stats(tmp_path):
    run_dir = make_run(tmp_path)
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    result = run_module(
        "components.publish.change_check", "--stats", run_dir / "data" / "stats.json", "--workspace-root", tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("data unchanged: training is skipped.")
    forced = run_module(
        "components.publish.change_check",
        "--stats",
        run_dir / "data" / "stats.json",
        "--workspace-root",
        tmp_path,
        "--force",
    )
    assert forced.stdout.startswith("data changed: training runs. Why: force is set")
