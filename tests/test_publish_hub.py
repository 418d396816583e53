"""Publishing to the Hub: one commit, retries, auth errors, the token kept out of every output, and a repository
without a token refused (by the first step, and by every step that reads or writes the repository).

No real Hugging Face Hub can be reached here, so these tests run the real CLI in
a subprocess against ``tests/fake_hub.py``, a fake Hub on 127.0.0.1 that speaks
the endpoints huggingface_hub uses (``HF_ENDPOINT`` points at it; Xet is
disabled with ``HF_HUB_DISABLE_XET=1`` because the fake speaks classic LFS).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import REPO_ROOT, run_module
from fake_hub import FakeHub
from fake_run import FINGERPRINT, GGUF, data_stats, make_run
from first_step_run import paragraph, run_first_step
from huggingface_hub import ModelCard

from common.errors import UserError
from tests.yaml_files import read_yaml_documents

CANARY = "hf_CANARY_4f1d8e0b7a2c9d3e"
READ_CANARY = "hf_CANARY_read_9b3e2d1c0a"
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
    result = publish_cli(tmp_path / "ws", hub.client_env(tmp_path / "home", CANARY), "--publish-merged", "true")
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


def test_a_repository_without_a_token_is_refused_and_nothing_is_sent(hub, tmp_path):
    """Not a dry run: with hub_repo_id set, a missing hf-token Secret would let the run replace production without
    the champion comparison. The step exits 2 naming the Secret and both fixes; the Hub sees no request, and no
    upload folder or record is written."""
    run_dir = make_run(tmp_path / "ws")
    result = publish_cli(tmp_path / "ws", hub.client_env(tmp_path / "home"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "dry run" not in result.stdout
    message = " ".join(result.stderr.split())
    assert message.startswith(f"error: hub_repo_id is '{REPO}', but no Hugging Face token is in the environment")
    assert "Kubernetes Secret 'hf-token' (key HF_TOKEN)" in message
    assert "oc create secret generic hf-token --from-literal=HF_TOKEN=<token>" in message
    assert "leave hub_repo_id empty for a run that publishes nothing" in message
    assert hub.log == []
    assert not (run_dir / "publish").exists() and not (tmp_path / "ws" / "published").exists()


def test_no_step_looks_for_the_published_model_elsewhere_without_a_token(hub, tmp_path):
    """The data-change check (force or not) and the evaluation's search for the champion refuse too, instead of
    reading the workspace's record and comparing with the base alone."""
    from components.champion.published import find_published

    make_run(tmp_path / "ws")
    stats = tmp_path / "stats.json"
    data_stats(FINGERPRINT).write(stats)
    for force in ((), ("--force",)):
        result = run_module(
            "components.publish.change_check",
            "--stats",
            stats,
            "--workspace-root",
            tmp_path / "ws",
            "--repo-id",
            REPO,
            *force,
            env=hub.client_env(tmp_path / "home"),
        )
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert "Kubernetes Secret 'hf-read-token'" in " ".join(result.stderr.split())  # a reading step's Secret
    with pytest.raises(UserError, match="no Hugging Face token is in the environment variable HF_TOKEN"):
        find_published(REPO, str(tmp_path / "ws"), token=None)
    assert hub.log == []


# The first step's pod gets hf-token as HF_TOKEN and hf-read-token as HF_READ_TOKEN (pipelines/fine_tune.py).
BOTH = {"HF_TOKEN": CANARY, "HF_READ_TOKEN": READ_CANARY}


def test_the_first_step_refuses_a_repository_without_the_secret_in_one_paragraph():
    """The generated first step, as its pod runs it: hub_repo_id without the hf-token Secret, the hf-read-token
    Secret or both ends the run before any data is touched, in one paragraph naming the missing ones, each one's
    command, and the one-token choice said plainly; with both present it passes and never prints them, and the
    default run (no repository) needs neither."""
    refused = run_first_step({"hub_repo_id": REPO})
    assert refused.returncode == 2, refused.stdout + refused.stderr
    message = paragraph(refused.stderr)
    assert message.startswith(
        f"error: The run parameters are invalid: parameter 'hub_repo_id' is '{REPO}', but the Kubernetes Secrets "
        "'hf-token' and 'hf-read-token' (key HF_TOKEN) are missing."
    )
    assert "oc create secret generic hf-token --from-literal=HF_TOKEN=<token>" in message
    assert "oc create secret generic hf-read-token --from-literal=HF_TOKEN=<token>" in message
    assert "or leave hub_repo_id empty for a run that publishes nothing" in message

    for env, missing in (({"HF_TOKEN": CANARY}, "hf-read-token"), ({"HF_READ_TOKEN": READ_CANARY}, "hf-token")):
        one = run_first_step({"hub_repo_id": REPO}, env)
        assert one.returncode == 2, one.stdout + one.stderr
        message = paragraph(one.stderr)
        assert f"but the Kubernetes Secret '{missing}' (key HF_TOKEN) is missing." in message
        assert f"oc create secret generic {missing} --from-literal=HF_TOKEN=<token>" in message
        (present,) = {"hf-token", "hf-read-token"} - {missing}
        assert f"oc create secret generic {present} " not in message  # only the missing one's command
        assert "the same token may go in both Secrets" in message and "less least privilege" in message
        assert CANARY not in message and READ_CANARY not in message

    blank = run_first_step({"hub_repo_id": REPO}, {**BOTH, "HF_READ_TOKEN": "  "})
    assert blank.returncode == 2 and "Secret 'hf-read-token' (key HF_TOKEN) is missing" in paragraph(blank.stderr)

    present = run_first_step({"hub_repo_id": REPO}, BOTH)
    assert present.returncode == 0, present.stderr
    assert "run parameters are valid" in present.stdout
    assert CANARY not in present.stdout + present.stderr and READ_CANARY not in present.stdout + present.stderr
    default = run_first_step({})
    assert default.returncode == 0 and "run parameters are valid" in default.stdout, default.stderr


def test_the_first_step_gets_the_hub_token_secret():
    """The first step can only see the Secrets if its pod mounts them: optional, so a run without a repository
    needs none, by reference, so no token is in the YAML, and under two variables, since both hold HF_TOKEN."""
    _, platform = read_yaml_documents(REPO_ROOT / "compiled" / "fine_tune_pipeline.yaml")
    executor = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-validate-parameters"]
    hub = {secret.get("secretName"): secret for secret in executor["secretAsEnv"] if secret.get("secretName")}
    assert hub["hf-token"]["keyToEnv"] == [{"envVar": "HF_TOKEN", "secretKey": "HF_TOKEN"}]
    assert hub["hf-read-token"]["keyToEnv"] == [{"envVar": "HF_READ_TOKEN", "secretKey": "HF_TOKEN"}]
    assert hub["hf-token"]["optional"] is True and hub["hf-read-token"]["optional"] is True


def test_one_token_stands_for_both_secrets_where_the_shell_is_every_steps_environment():
    """``one_token_for_every_step``: the shell's HF_TOKEN, which every local step reads, is what the first step
    checks for the read Secret too (a stale HF_READ_TOKEN of the shell's is replaced; no HF_TOKEN, both missing)."""
    from components.hub_auth import missing_secrets, one_token_for_every_step

    environ = {"HF_TOKEN": CANARY, "HF_READ_TOKEN": "a stale value from the shell"}
    one_token_for_every_step(environ)
    assert environ == {"HF_TOKEN": CANARY, "HF_READ_TOKEN": CANARY} and missing_secrets(environ) == []
    unset = {"HF_READ_TOKEN": READ_CANARY}
    one_token_for_every_step(unset)
    assert missing_secrets(unset) == ["hf-token", "hf-read-token"]


@pytest.mark.slow
def test_a_local_run_with_a_repository_needs_only_the_shells_hf_token(hub, tmp_path):
    """``python -m pipelines.run`` with hub_repo_id: kfp.local mounts no Secret, so HF_TOKEN alone passes the first
    step, and the next step that reads the Hub uses it (a wrong one here: the fake Hub's 401 is one paragraph
    naming the read Secret, and the run stops there); without HF_TOKEN the first step refuses, naming both."""
    wrong = CANARY[:-4] + "0000"

    def local_run(name: str, token: str | None) -> str:
        output = tmp_path / name
        result = run_module(
            "pipelines.run",
            *("--param", f"hub_repo_id={REPO}", "--param", "benchmark_tasks=", "--output-dir", output),
            env=hub.client_env(tmp_path / "home", token),
            timeout=600,
        )
        assert result.returncode == 1, result.stdout + result.stderr
        assert wrong not in result.stdout + result.stderr
        return " ".join((output / "run.log").read_text().split())

    with_token = local_run("with-token", wrong)
    assert "run parameters are valid" in with_token
    assert "Executing task 'check-data-changed'" in re.sub(r"\x1b\[[0-9;]*m", "", with_token)
    assert "does not accept the token (401" in with_token and "Secret 'hf-read-token'" in with_token
    without = local_run("without-token", None)
    assert "but the Kubernetes Secrets 'hf-token' and 'hf-read-token' (key HF_TOKEN) are missing" in without
    assert "For a local run, export HF_TOKEN, which every step reads" in without
    assert "Executing task 'prepare-dataset'" not in re.sub(r"\x1b\[[0-9;]*m", "", without)


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
