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
from components.champion.record import DELIVERY_STEPS, DeliveryRecord, record_completed
from components.publish.change_check import run_step
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


def test_a_repository_without_a_token_is_refused_not_read_from_the_workspace(tmp_path):
    """The Hub holds a repository's published model; without a token the check refuses instead of reading the
    workspace's record (a fresh PVC has none, so every run would look changed and its gate would compare with the
    base alone)."""
    make_run(tmp_path)
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    with pytest.raises(
        UserError, match="hub_repo_id is 'me/skills', but no Hugging Face token.*Secret 'hf-read-token'"
    ):
        compare_with_published(FINGERPRINT, "me/skills", str(tmp_path), force=False, token=None)


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
    with pytest.raises(UserError, match="Secret 'hf-read-token'") as raised:  # what the reading steps get
        compare_with_published(FINGERPRINT, "me/skills", str(tmp_path), False, "hf_expired_token", FAST)
    assert "hf_expired_token" not in str(raised.value)


def test_cli_reads_the_data_stage_stats(tmp_path):
    run_dir = make_run(tmp_path)
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    result = run_module(
        "components.publish.change_check", "--stats", run_dir / "data" / "stats.json", "--workspace-root", tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "data unchanged: training is skipped, and store, register and serve run on the published version (run run-1)."
    )  # the publish above was not followed by them
    for step in DELIVERY_STEPS:
        record_completed(str(tmp_path), "run-1", step)
    again = run_module(
        "components.publish.change_check", "--stats", run_dir / "data" / "stats.json", "--workspace-root", tmp_path
    )
    assert again.stdout.startswith("data unchanged: training is skipped.")
    forced = run_module(
        "components.publish.change_check",
        "--stats",
        run_dir / "data" / "stats.json",
        "--workspace-root",
        tmp_path,
        "--force",
    )
    assert forced.stdout.startswith("data changed: training runs. Why: force is set")


def check(workspace, fingerprint=FINGERPRINT, force=False):
    return compare_with_published(fingerprint, "", str(workspace), force=force, token=None)


def test_a_version_whose_steps_after_publish_did_not_complete_is_finished_on_unchanged_data(tmp_path):
    """The run that published the model failed after publishing: the next run on the same data runs exactly the
    steps its version's delivery record lacks, on that version, and nothing once they have all completed."""
    make_run(tmp_path)
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    # Published as a dry run: nothing after it yet.
    assert DeliveryRecord.read(tmp_path, "run-1") == DeliveryRecord("run-1", {}, repo_id="")
    change = check(tmp_path)
    assert not change.changed and change.finish == ("store", "register", "serve") and change.version_run_id == "run-1"
    assert "Set force to retrain anyway." in change.reason
    assert "Run run-1 published that model but did not complete store, register and serve: those steps run" in (
        change.reason
    )
    record_completed(tmp_path, "run-1", "store")
    record_completed(tmp_path, "run-1", "register")
    change = check(tmp_path)
    assert change.finish == ("serve",) and "did not complete serve: that step runs now on its version" in change.reason
    record_completed(tmp_path, "run-1", "serve")
    done = check(tmp_path)
    assert (done.changed, done.finish, done.version_run_id) == (False, (), "") and "did not complete" not in done.reason
    # A new version supersedes an unfinished one: changed data or force trains, and finishes nothing.
    DeliveryRecord("run-1", repo_id="").write(tmp_path)
    assert check(tmp_path, force=True).finish == () and check(tmp_path, OTHER).finish == ()


def test_the_step_hands_the_pipeline_the_version_to_finish(tmp_path):
    """The check_data_changed component's outputs: the finishing branch runs on that run id and train directory."""
    make_run(tmp_path)
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    inputs = {
        "fingerprint": FINGERPRINT,
        "data_dir": str(tmp_path / "runs" / "run-1" / "data"),
        "repo_id": "",
        "workspace_root": str(tmp_path),
        "force": False,
    }
    changed, reason, finish, run_id, train_dir = run_step(inputs)
    assert (changed, finish, run_id, train_dir) == (False, True, "run-1", str(tmp_path / "runs" / "run-1" / "train"))
    for step in DELIVERY_STEPS:
        record_completed(tmp_path, "run-1", step)
    assert run_step(inputs)[2:] == (False, "", "")


def test_a_version_without_a_delivery_record_or_without_its_files_is_not_finished(tmp_path):
    """A version published before delivery records is not redone; one whose upload folder is gone cannot be
    finished, and the reason says to retrain."""
    make_run(tmp_path)
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    upload = tmp_path / "runs" / "run-1" / "publish" / "upload"
    (upload / "README.md").rename(tmp_path / "card.md")
    gone = check(tmp_path)
    assert not gone.changed and gone.finish == () and f"its upload folder {upload} is gone" in gone.reason
    assert "set force to train and publish again" in gone.reason
    DeliveryRecord.path(tmp_path, "run-1").unlink()
    legacy = check(tmp_path)
    assert not legacy.changed and legacy.finish == () and "did not complete" not in legacy.reason
    (tmp_path / "card.md").rename(upload / "README.md")
    record_completed(tmp_path, "run-1", "store")  # a step after publish started the record: no publish did
    assert check(tmp_path).finish == ()


def test_a_hub_publish_left_unfinished_on_this_workspace_is_finished(hub, tmp_path):
    """With a repository the Hub card names the run that published; its delivery record on this workspace (a
    persistent PVC) says what is left. A workspace without that run (a fresh PVC) cannot tell, and skips."""
    make_run(tmp_path / "ws")
    published = run_module(
        "components.publish.stage",
        *("--workspace-root", tmp_path / "ws", "--run-id", "run-1", "--repo-id", "me/skills"),
        env=hub.client_env(tmp_path / "home", TOKEN),
    )
    assert published.returncode == 0, published.stderr
    change = compare_with_published(FINGERPRINT, "me/skills", str(tmp_path / "ws"), False, TOKEN, FAST)
    assert not change.changed and change.finish == DELIVERY_STEPS and change.version_run_id == "run-1"
    fresh = compare_with_published(FINGERPRINT, "me/skills", str(tmp_path / "fresh"), False, TOKEN, FAST)
    assert not fresh.changed and fresh.finish == ()


def test_a_run_id_that_would_lead_out_of_runs_is_never_finished(tmp_path):
    """A Hub card names the run that published, and anyone who can push to the repository can edit it: a run id that
    is not one plain path component is never used to find, or write, a version's files."""
    from components.champion.published import PublishedModel
    from components.publish.changes import is_run_id, unfinished

    kfp_ids = ("run-1", "3f9c2a7e-1b2c-4d5e-8f90-123456789abc", "llm-finetune-2026-11-27-16-03-40-123456")
    assert all(is_run_id(run_id) for run_id in kfp_ids)
    assert not any(is_run_id(run_id) for run_id in ("", None, ".", "..", "../run-1", "a/run-1", "/run-1", ".run-1"))
    make_run(tmp_path / "ws" / "elsewhere")  # a published version's files outside runs/
    publish(str(tmp_path / "ws" / "elsewhere"), "run-1", "", PublishOptions(), token=None)
    card = PublishedModel("a Hub card", FINGERPRINT, "../elsewhere/runs/run-1", "me/skills", "abc", None, None, None)
    assert unfinished(card, str(tmp_path / "ws"), "unchanged.") is None


def publish_to_hub(workspace, run_id: str, repo_id: str = "me/skills") -> None:
    """Publish run ``run_id`` to the fake Hub in this process (``hub`` points huggingface_hub at it)."""
    publish(str(workspace), run_id, "", PublishOptions(repo_id=repo_id, first_retry_wait_s=0), token=TOKEN)


def compared_with(workspace, repo_id: str = "me/skills") -> dict:
    """What a run's evaluation records as the model it compared with: the one published at ``repo_id`` now."""
    from components.champion.published import find_published

    return find_published(repo_id, str(workspace), TOKEN, FAST).entry()


@pytest.fixture
def classic_lfs(monkeypatch):
    """The fake Hub speaks classic LFS, not Xet (huggingface_hub reads the setting at import)."""
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)


def test_a_publish_that_dies_right_after_its_commit_is_finished_by_the_next_run(
    hub, classic_lfs, tmp_path, monkeypatch
):
    """The commit lands, then the step dies before it can write anything else (no publish record, no commit in the
    delivery record): the delivery record, written before the commit, still lets the next run on the same data
    deliver the version. A publish that completes records its commit too."""
    import components.publish.publish as publishing
    from components.champion.record import read_record

    workspace = tmp_path / "ws"
    make_run(workspace, "run-0", fingerprint=OTHER)
    publish_to_hub(workspace, "run-0")
    for step in DELIVERY_STEPS:
        record_completed(workspace, "run-0", step)
    head = hub.repos[("model", "me/skills")].head
    assert DeliveryRecord.read(workspace, "run-0").revision == head  # a publish that completed recorded its commit

    make_run(workspace, "run-1", published_model=compared_with(workspace))
    commit = publishing.publish_folder

    def commit_then_die(*args, **kwargs):
        commit(*args, **kwargs)
        raise SystemExit("the pod was evicted right after the commit")

    monkeypatch.setattr(publishing, "publish_folder", commit_then_die)
    with pytest.raises(SystemExit):
        publish_to_hub(workspace, "run-1")
    assert hub.repos[("model", "me/skills")].head != head  # the commit landed
    assert read_record(str(workspace), "me/skills").run_id == "run-0"  # and nothing after it was written
    assert DeliveryRecord.read(workspace, "run-1") == DeliveryRecord("run-1", {}, "me/skills", replaces="run-0")

    change = compare_with_published(FINGERPRINT, "me/skills", str(workspace), False, TOKEN, FAST)
    assert not change.changed and change.finish == DELIVERY_STEPS and change.version_run_id == "run-1"


def test_a_card_naming_another_repositorys_run_finishes_nothing(hub, classic_lfs, tmp_path, capsys):
    """The run id comes from the Hub card, which anyone who can push to the repository can edit: a card pointed at a
    run of this workspace that published elsewhere is not finished under this repository's model, and the log says
    why."""
    workspace = tmp_path / "ws"
    make_run(workspace, "run-2")
    publish_to_hub(workspace, "run-2", "them/other")  # published there, and delivered nowhere yet
    card = hub.repos[("model", "them/other")].files["README.md"]
    hub.add_repo("model", "me/skills", {"README.md": card, **MODEL})  # pushed by someone with write access

    change = compare_with_published(FINGERPRINT, "me/skills", str(workspace), False, TOKEN, FAST)
    assert not change.changed and (change.finish, change.version_run_id) == ((), "")
    logged = " ".join(capsys.readouterr().out.split())
    delivery = DeliveryRecord.path(workspace, "run-2")
    assert (
        "not finishing store, register and serve for run run-2: the model card of me/skills at commit "
        f"{hub.repos[('model', 'me/skills')].head[:12]} names run run-2, whose delivery record {delivery} was written "
        "for them/other, not me/skills. Nothing is stored, registered or served for it" in logged
    )
    assert not compare_with_published(FINGERPRINT, "them/other", str(workspace), False, TOKEN, FAST).changed
    assert DeliveryRecord.read(workspace, "run-2").missing == DELIVERY_STEPS  # its own repository's run finishes it


def test_a_card_naming_a_run_whose_commit_never_landed_finishes_nothing(hub, classic_lfs, tmp_path, capsys):
    """A publish refused by the Hub leaves a delivery record for a commit that never landed; no publish record names
    its run, so a card edited to name it (but not the card that run would have committed) finishes nothing."""
    workspace = tmp_path / "ws"
    make_run(workspace, "run-1", fingerprint=OTHER)
    publish_to_hub(workspace, "run-1")
    make_run(workspace, "run-3", published_model=compared_with(workspace))
    hub.fail_next("POST", "/commit/", 412)
    with pytest.raises(UserError, match="HTTP 412"):
        publish_to_hub(workspace, "run-3")
    assert DeliveryRecord.read(workspace, "run-3").replaces == "run-1"  # the record is there, for no commit

    repo = hub.repos[("model", "me/skills")]
    committed = (workspace / "runs" / "run-3" / "publish" / "upload" / "README.md").read_bytes()
    repo.files["README.md"] = committed + b"\nEdited on the Hub.\n"
    hub._commit(repo, "Edit the model card", "", [{"key": "file", "path": "README.md"}], {}, set())
    change = compare_with_published(FINGERPRINT, "me/skills", str(workspace), False, TOKEN, FAST)
    assert not change.changed and change.finish == ()
    logged = " ".join(capsys.readouterr().out.split())
    assert "not finishing store, register and serve for run run-3:" in logged
    assert "but this workspace's publish record" in logged and "names run run-1, and that card is not the one run" in (
        logged
    )


def test_the_records_carry_their_format_and_one_of_another_format_is_read_as_none(tmp_path, capsys):
    """published/<repo>.json and publish/delivery.json: written with their format version; one from before format
    versions is read as it was written; a newer one is said and ignored, like an unreadable one (the run trains)."""
    import json

    from components.champion.record import RECORD_FORMAT, read_record

    make_run(tmp_path)
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    record_path, delivery_path = tmp_path / "published" / "dry-run.json", DeliveryRecord.path(tmp_path, "run-1")
    for path in (record_path, delivery_path):
        assert json.loads(path.read_text())["format_version"] == RECORD_FORMAT
    published, delivery = read_record(str(tmp_path), ""), DeliveryRecord.read(tmp_path, "run-1")
    for path in (record_path, delivery_path):  # as the pipeline wrote them before format versions
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "format_version"}))
    assert (read_record(str(tmp_path), ""), DeliveryRecord.read(tmp_path, "run-1")) == (published, delivery)
    for path in (record_path, delivery_path):
        path.write_text(json.dumps({**json.loads(path.read_text()), "format_version": 2}))
    assert read_record(str(tmp_path), "") is None and DeliveryRecord.read(tmp_path, "run-1") is None
    log = capsys.readouterr().out
    assert f"ignoring the unreadable publish record {record_path} (it is in format 2" in log
    assert f"ignoring the unreadable delivery record {delivery_path} (it is in format 2" in log
    assert compare_with_published(FINGERPRINT, "", str(tmp_path), force=False, token=None).changed
