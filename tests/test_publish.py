"""The publish stage without a Hub: the upload folder, the model card, the dry-run record and bad input.

A dry run writes exactly the folder a real publish commits, so these tests check
the layout and the model card on it; ``test_publish_hub.py`` checks the upload.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import run_module
from fake_run import FINGERPRINT, GGUF, LORA_GGUF, SAMPLES, make_run, training_summary
from huggingface_hub import ModelCard

from common.atomic import link_or_copy
from common.errors import UserError
from components.publish.options import PublishOptions
from components.publish.publish import build_upload, publish
from components.publish.stage import run_in_pipeline


class FakeMetrics:
    def __init__(self) -> None:
        self.logged: dict[str, float] = {}

    def log_metric(self, name: str, value: float) -> None:
        self.logged[name] = value


def card_of(run_dir: Path) -> str:
    return (run_dir / "publish" / "upload" / "README.md").read_text(encoding="utf-8")


def test_dry_run_writes_the_folder_and_the_record(tmp_path):
    run_dir = make_run(tmp_path)
    result = publish(str(tmp_path), "run-1", "", PublishOptions(), token="hf_unused_without_repo")
    upload = run_dir / "publish" / "upload"
    assert result.dry_run and result.location == str(upload)
    assert result.files == sorted(p.relative_to(upload).as_posix() for p in upload.rglob("*") if p.is_file())
    assert {
        "README.md",
        GGUF,
        LORA_GGUF,
        "Modelfile",
        "training_summary.json",
        "evaluation/evaluation.json",
        "evaluation/report.md",
        "evaluation/loss_curve.png",
        "evaluation/sample_responses.json",
        "verification/verification.json",
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
    } <= set(result.files)
    assert "config.json" not in result.files  # auto: the adapter is published, the merged checkpoint is not
    assert (upload / GGUF).read_bytes() == (run_dir / "export" / GGUF).read_bytes()
    assert not [p for p in upload.parent.iterdir() if p.name.startswith(".")]  # no staging left behind
    record = json.loads((tmp_path / "published" / "dry-run.json").read_text())
    assert record["data_fingerprint"] == FINGERPRINT and record["uploaded"] is False and record["run_id"] == "run-1"


@pytest.mark.parametrize(
    ("adapter_trained", "options", "merged"),
    [
        (True, PublishOptions(), False),  # auto: the adapter is the loadable weights
        (False, PublishOptions(), True),  # auto after method full: no adapter, so the merged checkpoint
        (True, PublishOptions(publish_adapter=False), True),  # auto, adapter not wanted: the merged checkpoint
        (False, PublishOptions(publish_merged="false"), False),  # an explicit false is kept
        (True, PublishOptions(publish_merged="true"), True),
    ],
)
def test_publish_merged_auto_follows_what_training_made(tmp_path, adapter_trained, options, merged):
    """The repository holds weights the next run's evaluation can load, whatever the method, unless told not to."""
    run_dir = make_run(tmp_path)
    if not adapter_trained:
        for path in (run_dir / "train" / "adapter").iterdir():
            path.unlink()
    result = publish(str(tmp_path), "run-1", "", options, token=None)
    assert ("config.json" in result.files) is merged
    library = yaml.safe_load(card_of(run_dir).split("---")[1])["library_name"]
    assert library == ("transformers" if merged else "llama.cpp")


def test_model_card_metadata_and_sections(tmp_path):
    run_dir = make_run(tmp_path)
    # The folder a publish to me/skills commits, written without a Hub (publish itself needs the token for it).
    build_upload(
        str(tmp_path),
        "run-1",
        "hf://datasets/me/practical-qa",
        PublishOptions(repo_id="me/skills", publish_merged="true"),
        None,
    )
    text = card_of(run_dir)
    metadata = yaml.safe_load(text.split("---")[1])
    assert metadata["base_model"] == "HuggingFaceTB/SmolLM3-3B"
    assert metadata["datasets"] == ["me/practical-qa"]
    assert metadata["license"] == "apache-2.0"
    assert metadata["pipeline_tag"] == "text-generation" and metadata["library_name"] == "transformers"
    assert {"gguf", "lora"} <= set(metadata["tags"])
    assert metadata["data_fingerprint"] == FINGERPRINT
    assert "| eval loss (lower is better) | 2.3456 | 0.9511 | -1.3945 |" in text
    assert "| ROUGE-L (higher is better) | 0.123 | 0.457 | +0.333 |" in text
    # The standard benchmarks: the task x model table with standard errors and the verdict per task.
    assert "| task | Base | Fine-tuned | Change | gate |" in text
    assert (
        "| arc_easy: acc_norm, higher is better, 1000 examples | 0.7120 ± 0.0157 | 0.7050 ± 0.0157 | -0.0070 |" in text
    )
    assert "lm-evaluation-harness 0.4.13, zero-shot, on at most the first 1000 examples" in " ".join(text.split())
    assert "| LoRA rank / alpha / dropout | 16 / 32 / 0.05 |" in text
    assert "| world size (processes) | 2 (2 × NVIDIA H100 80GB HBM3) |" in text
    assert "| throughput | 2,226 non-padding tokens/s |" in text
    assert "| attention / transformer blocks | flex_attention / compiled |" in text
    assert "speed fallback" not in text
    for sample in SAMPLES:
        assert f"### {sample['question']}" in text and f"> {sample['fine_tuned']}" in text
    assert "> Knots are\n> useful." in text  # a multi-line answer stays inside its quote
    assert "llama-cli -hf me/skills:Q8_0" in text and f"hf download me/skills {GGUF} --local-dir ." in text
    assert "ollama run hf.co/me/skills:Q8_0" in text and "ollama create skills -f Modelfile" in text
    assert ModelCard(text).data.data_fingerprint == FINGERPRINT  # huggingface_hub reads the metadata back


def test_the_card_says_when_training_fell_back_to_the_proven_path(tmp_path):
    run_dir = make_run(tmp_path)
    summary_path = run_dir / "train" / "training_summary.json"
    fallback = (
        "compiled blocks, flex_attention failed in the rehearsal of the first evaluation on rank 3 "
        "(BackendCompilerFailed: out of resource); trained on the proven path: eager blocks, sdpa (slower)"
    )
    training_summary(compiled_blocks=False, attention="sdpa", speed_fallback=fallback).write(summary_path)
    build_upload(str(tmp_path), "run-1", "", PublishOptions(repo_id="me/skills"), None)
    text = card_of(run_dir)
    assert "| attention / transformer blocks | sdpa / eager |" in text
    assert f"| speed fallback | {fallback} |" in text


def test_a_qlora_card_says_the_adapter_was_merged_into_the_unquantised_base(tmp_path):
    run_dir = make_run(tmp_path)
    training_summary(config={"method": "qlora"}).write(run_dir / "train" / "training_summary.json")
    build_upload(str(tmp_path), "run-1", "", PublishOptions(repo_id="me/skills"), None)
    text = " ".join(card_of(run_dir).split())
    assert (
        "with QLoRA (LoRA r=16, alpha=32 on the base held in 4-bit NF4), merged into the unquantised base's "
        "weights, not the 4-bit ones." in text
    )
    assert "qlora" in yaml.safe_load(card_of(run_dir).split("---")[1])["tags"]


def test_local_base_model_is_named_by_its_hub_id(tmp_path):
    """Local runs train a copy of SmolLM2 on disk; the card names the Hub model, not the cache path."""
    run_dir = make_run(tmp_path, model=str(tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct"))
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    assert yaml.safe_load(card_of(run_dir).split("---")[1])["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_unknown_local_base_model_is_left_out_of_the_metadata(tmp_path):
    (tmp_path / "my-model").mkdir()
    run_dir = make_run(tmp_path, model=str(tmp_path / "my-model"))
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    metadata = yaml.safe_load(card_of(run_dir).split("---")[1])
    assert "base_model" not in metadata and "base_model_relation" not in metadata
    assert f"`{tmp_path / 'my-model'}` fine-tuned on 270" in card_of(run_dir)


def test_presigned_dataset_url_is_not_copied_into_the_card(tmp_path):
    run_dir = make_run(tmp_path)
    publish(
        str(tmp_path), "run-1", "https://store.example/qa.jsonl?X-Amz-Signature=secret123", PublishOptions(), token=None
    )
    text = card_of(run_dir)
    assert "https://store.example/qa.jsonl" in text and "secret123" not in text


def test_failed_gate_is_not_published(tmp_path):
    run_dir = make_run(tmp_path, gate_passed=False)
    with pytest.raises(UserError, match="gate of this run failed .eval loss got worse by 0.2."):
        publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    assert not (run_dir / "publish").exists() and not (tmp_path / "published").exists()


def test_missing_export_is_a_clear_error_and_keeps_the_previous_folder(tmp_path):
    run_dir = make_run(tmp_path)
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    (run_dir / "export" / GGUF).unlink()
    result = run_module("components.publish.stage", "--workspace-root", tmp_path, "--run-id", "run-1")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "export stage left no model GGUF" in result.stderr and "run the export step" in " ".join(
        result.stderr.split()
    )
    assert (run_dir / "publish" / "upload" / GGUF).is_file()  # the earlier folder is untouched


def test_publish_merged_without_a_checkpoint_is_a_clear_error(tmp_path):
    run_dir = make_run(tmp_path)
    (run_dir / "train" / "merged" / "config.json").unlink()
    with pytest.raises(UserError, match="publish_merged is true but .* holds no checkpoint"):
        publish(str(tmp_path), "run-1", "", PublishOptions(publish_merged="true"), token=None)


@pytest.mark.parametrize("repo_id", ["no-owner", "a/b/c", "bad owner/name"])
def test_malformed_repo_id_is_refused(repo_id):
    with pytest.raises(UserError, match="repo_id"):
        PublishOptions(repo_id=repo_id)


def test_run_in_pipeline_fills_the_kfp_artifacts(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    run_dir = make_run(tmp_path / "ws")
    card = SimpleNamespace(path=str(tmp_path / "artifacts" / "model_card"), metadata={})
    metrics = FakeMetrics()
    location, dry_run = run_in_pipeline(str(tmp_path / "ws"), "run-1", "", PublishOptions(), card, metrics)
    assert dry_run and location == str(run_dir / "publish" / "upload")
    assert Path(card.path).read_text() == card_of(run_dir)
    assert card.metadata == {"repo_id": "", "location": location, "dry_run": True}
    assert metrics.logged["dry_run_files"] == len([p for p in Path(location).rglob("*") if p.is_file()])


def test_the_pipeline_step_refuses_a_repository_without_a_token(tmp_path, monkeypatch, capsys):
    """The publish step in the pipeline, given hub_repo_id and no hf-token Secret: exit 2 with the paragraph, no
    dry run (whose success would let store, register and serve go on), and no folder, record or artifact."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    run_dir = make_run(tmp_path / "ws")
    card = SimpleNamespace(path=str(tmp_path / "artifacts" / "model_card"), metadata={})
    with pytest.raises(SystemExit) as exited:
        run_in_pipeline(str(tmp_path / "ws"), "run-1", "", PublishOptions(repo_id="me/skills"), card, FakeMetrics())
    assert exited.value.code == 2
    output = capsys.readouterr()
    message = " ".join(output.err.split())
    assert message.startswith("error: hub_repo_id is 'me/skills', but no Hugging Face token") and "dry run" not in (
        output.out
    )
    assert "Kubernetes Secret 'hf-token'" in message and "leave hub_repo_id empty" in message
    assert not (run_dir / "publish").exists() and not (tmp_path / "ws" / "published").exists()
    assert not Path(card.path).exists() and card.metadata == {}


def test_upload_folder_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    """A second publish leaves no file of the first behind; one that fails midway leaves the first intact."""
    run_dir = make_run(tmp_path)
    upload = run_dir / "publish" / "upload"
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    assert (upload / "adapter").is_dir()
    publish(str(tmp_path), "run-1", "", PublishOptions(publish_adapter=False), token=None)
    assert not (upload / "adapter").exists()
    before = sorted(p.relative_to(upload) for p in upload.rglob("*"))

    from components.publish import bundle

    def broken_link(source, destination):
        if source.name.endswith(".gguf"):
            raise OSError("disk full")
        return link_or_copy(source, destination)

    monkeypatch.setattr(bundle, "link_or_copy", broken_link)
    with pytest.raises(OSError, match="disk full"):
        publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    assert sorted(p.relative_to(upload) for p in upload.rglob("*")) == before
    # No staging folder left behind; the delivery record is the earlier publishes'.
    assert sorted(p.name for p in upload.parent.iterdir()) == ["delivery.json", "upload"]


@pytest.mark.parametrize(
    ("stage", "name", "says"),
    [("train", "training_summary.json", "the training stage"), ("evaluate", "evaluation.json", "the evaluation stage")],
)
def test_a_stage_that_has_not_run_is_named_with_its_file(tmp_path, stage, name, says):
    """components/champion/version.read_run_outputs: publish reads the typed records, and names the missing one."""
    run_dir = make_run(tmp_path)
    (run_dir / stage / name).unlink()
    with pytest.raises(UserError, match=f"{name} does not exist: {says} has not run for this run"):
        build_upload(str(tmp_path), "run-1", "", PublishOptions(repo_id="me/skills"), None)
