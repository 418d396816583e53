"""Publishing to the Hub: one commit, retries, auth errors, and the token kept out of every output.

No real Hugging Face Hub can be reached here, so these tests run the real CLI in
a subprocess against ``tests/fake_hub.py``, a fake Hub on 127.0.0.1 that speaks
the endpoints huggingface_hub uses (``HF_ENDPOINT`` points at it; Xet is
disabled with ``HF_HUB_DISABLE_XET=1`` because the fake speaks classic LFS).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_module
from fake_hub import FakeHub
from fake_run import FINGERPRINT, GGUF, make_run
from huggingface_hub import ModelCard

CANARY = "hf_CANARY_4f1d8e0b7a2c9d3e"
REPO = "me/practical-skills"


@pytest.fixture
def hub():
    with FakeHub({CANARY}) as fake:
        yield fake


def publish_cli(workspace: Path, env: dict[str, str], *extra: str):
    return run_module(
        "components.publish.stage",
        "--workspace-root",
        workspace,
        "--run-id",
        "run-1",
        "--repo-id",
        REPO,
        "--first-retry-wait-s",
        "0",
        *extra,
        env=env,
    )


def assert_no_canary(result, *roots: Path) -> None:
    assert CANARY not in result.stdout + result.stderr
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                assert CANARY.encode() not in path.read_bytes(), path


def test_one_commit_holds_every_file_byte_for_byte(hub, tmp_path):
    """The repository is created private and receives the whole upload folder in a single commit."""
    run_dir = make_run(tmp_path / "ws")
    result = publish_cli(tmp_path / "ws", hub.client_env(tmp_path / "home", CANARY), "--include-merged", "true")
    assert result.returncode == 0, result.stderr
    repo = hub.repos[("model", REPO)]
    assert repo.private
    upload = run_dir / "publish" / "upload"
    local = {p.relative_to(upload).as_posix(): p.read_bytes() for p in upload.rglob("*") if p.is_file()}
    assert {
        "README.md",
        GGUF,
        "Modelfile",
        "training_summary.json",
        "evaluation/evaluation.json",
        "config.json",
        "adapter/adapter_config.json",
    } <= set(local)
    published = repo.commits[1:]  # commits[0] is the repository's creation
    assert len(published) == 1
    assert sorted(op["path"] for op in published[0]["operations"]) == sorted(local)
    assert {name: data for name, data in repo.files.items() if name != ".gitattributes"} == local
    assert (
        GGUF in repo.lfs_paths and "model.safetensors" in repo.lfs_paths
    )  # large files went through LFS, checked by sha256
    assert ModelCard(repo.files["README.md"].decode()).data.data_fingerprint == FINGERPRINT
    record = json.loads((tmp_path / "ws" / "published" / "me--practical-skills.json").read_text())
    assert record["uploaded"] and record["data_fingerprint"] == FINGERPRINT and record["location"].endswith(repo.head)
    assert_no_canary(result, tmp_path / "ws", tmp_path / "home")
    assert all(CANARY.encode() not in data for data in repo.files.values())


def test_a_5xx_on_the_commit_is_retried_and_still_one_commit(hub, tmp_path):
    make_run(tmp_path / "ws")
    hub.fail_next("POST", f"/api/models/{REPO}/commit/", 503)
    result = publish_cli(tmp_path / "ws", hub.client_env(tmp_path / "home", CANARY))
    assert result.returncode == 0, result.stderr
    assert "HTTP 503; retrying" in result.stdout
    assert [status for _, _, status in hub.requests_to("/commit/", "POST")] == [503, 200]
    assert len(hub.repos[("model", REPO)].commits) == 2
    assert_no_canary(result, tmp_path / "ws")


def test_a_lost_commit_response_does_not_commit_twice(hub, tmp_path):
    """The commit lands but its answer is lost: the retry finds this upload's model card at the head (it names the
    run) and adds no commit."""
    make_run(tmp_path / "ws")
    hub.lose_next_response("POST", "/commit/")
    result = publish_cli(tmp_path / "ws", hub.client_env(tmp_path / "home", CANARY))
    assert result.returncode == 0, result.stderr
    assert "HTTP 503; retrying" in result.stdout
    assert [status for _, _, status in hub.requests_to("/commit/", "POST")] == [503]  # the retry had nothing to commit
    assert len(hub.repos[("model", REPO)].commits) == 2


def test_a_new_publish_replaces_the_previous_files(hub, tmp_path):
    """Files of an earlier upload that this one lacks (an old quantisation) are deleted in the same commit."""
    old = hub.add_repo("model", REPO, {".gitattributes": b"", "old-model-q4_0.gguf": b"old", "README.md": b"old card"})
    make_run(tmp_path / "ws", published_model={"description": "the old card", "run_id": None, "revision": old.head})
    result = publish_cli(tmp_path / "ws", hub.client_env(tmp_path / "home", CANARY))
    assert result.returncode == 0, result.stderr
    repo = hub.repos[("model", REPO)]
    assert "old-model-q4_0.gguf" not in repo.files and ".gitattributes" in repo.files
    assert {"key": "deletedFile", "path": "old-model-q4_0.gguf"} in repo.commits[-1]["operations"]
    assert len(repo.commits) == 2


def test_a_rejected_token_names_the_secret(hub, tmp_path):
    make_run(tmp_path / "ws")
    wrong = CANARY[:-4] + "0000"
    result = publish_cli(tmp_path / "ws", hub.client_env(tmp_path / "home", wrong))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    assert "401" in message and "Secret 'hf-token'" in message and "HF_TOKEN" in message
    assert "oc create secret generic hf-token" in message
    assert wrong not in result.stdout + result.stderr
    assert ("model", REPO) not in hub.repos
    assert not (tmp_path / "ws" / "published" / "me--practical-skills.json").exists()


def test_without_a_token_nothing_is_sent(hub, tmp_path):
    """A dry run: the folder is written and recorded, and the Hub sees no request at all."""
    run_dir = make_run(tmp_path / "ws")
    result = publish_cli(tmp_path / "ws", hub.client_env(tmp_path / "home"))
    assert result.returncode == 0, result.stderr
    assert "dry run: no token is in the environment (HF_TOKEN" in " ".join(result.stdout.split())
    assert hub.log == []
    assert (run_dir / "publish" / "upload" / GGUF).is_file()
    record = json.loads((tmp_path / "ws" / "published" / "me--practical-skills.json").read_text())
    assert record["uploaded"] is False and record["location"] == str(run_dir / "publish" / "upload")


def test_metadata_the_hub_rejects_is_a_clear_error(hub, tmp_path):
    make_run(tmp_path / "ws")
    result = publish_cli(tmp_path / "ws", hub.client_env(tmp_path / "home", CANARY), "--license", "my-own-licence")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    assert "The Hub rejected the model card metadata" in message and '"license" must be one of' in message
    assert len(hub.repos[("model", REPO)].commits) == 1  # nothing was committed


def test_a_commit_whose_parent_is_no_longer_the_head_is_refused_and_nothing_lands(hub, tmp_path, monkeypatch):
    """Another publish landed after the evaluation read the head: the Hub answers 412 and the step says why."""
    from huggingface_hub import HfApi, constants

    from common.errors import UserError
    from components.publish.hub import publish_folder
    from components.publish.options import PublishOptions

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # the fake speaks classic LFS (read at import)
    repo = hub.add_repo("model", REPO, {".gitattributes": b"", "README.md": b"---\n---\ncard of run one\n"})
    compared = repo.head
    repo.files["README.md"] = b"---\n---\ncard of run two\n"
    hub._commit(repo, "Publish the model of pipeline run two", "", [{"key": "file", "path": "README.md"}], {}, set())
    folder = tmp_path / "upload"
    folder.mkdir()
    (folder / "README.md").write_text("card of run three\n")
    (folder / GGUF).write_bytes(b"GGUF")
    api = HfApi(endpoint=hub.url, token=CANARY)
    with pytest.raises(UserError) as refused:
        publish_folder(api, REPO, folder, PublishOptions(first_retry_wait_s=0), "three", "", parent_commit=compared)
    message = " ".join(str(refused.value).split())
    assert f"after this run's evaluation compared the new model with the published one (commit {compared[:12]})" in (
        message
    )
    assert "HTTP 412" in message and "nothing was uploaded" in message
    assert repo.files["README.md"] == b"---\n---\ncard of run two\n" and GGUF not in repo.files
    assert [status for _, _, status in hub.requests_to("/commit/", "POST")] == [412]
