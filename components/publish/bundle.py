"""What a publish uploads: the earlier stages' files, read, checked and laid out as the repository.

The folder ``<run>/publish/upload/`` is built first, always; a real publish
commits exactly that folder and a dry run stops there, so what a dry run shows
is what would have been uploaded. Large files are hard-linked into it (same
filesystem: the workspace), so it costs no space; it is swapped in atomically.

Repository layout::

    README.md                      model card
    <model>-<outtype>.gguf         every GGUF of the export stage (LoRA GGUF too)
    Modelfile                      Ollama, FROM ./<model>-<outtype>.gguf
    training_summary.json
    evaluation/                    evaluation.json, report.md, loss_curve.png, sample_responses.json
    verification/                  the GGUF verification report, when present
    config.json, *.safetensors...  merged checkpoint (PublishOptions.publishes_merged), for transformers
    adapter/                       LoRA adapter (publish_adapter)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from common.atomic import link_or_copy, replace_dir
from common.errors import UserError
from common.run_layout import (
    ADAPTER,
    DATA_STATS,
    EVALUATION,
    EVALUATION_MARKDOWN,
    LORA_MARKER,
    LOSS_CURVE,
    MERGED,
    MODELFILE,
    SAMPLE_RESPONSES,
    TRAINING_SUMMARY,
    UPLOAD,
    VERIFICATION_JSON,
    VERIFICATION_MARKDOWN,
    stage_dir,
)
from components.publish.options import PublishOptions

CARD_NAME = "README.md"

# The merged checkpoint's config at the repository root: transformers loads the repository by it.
MERGED_CONFIG = "config.json"


@dataclass(frozen=True)
class RunDirs:
    """The stage directories of one run that a publish reads and writes, each field named after its stage
    (common.run_layout)."""

    data: Path
    train: Path
    evaluate: Path
    export: Path
    publish: Path

    @classmethod
    def of(cls, workspace_root: str, run_id: str) -> "RunDirs":
        return cls(**{spec.name: stage_dir(workspace_root, run_id, spec.name) for spec in fields(cls)})

    @property
    def upload(self) -> Path:
        return self.publish / UPLOAD


@dataclass(frozen=True)
class RunOutputs:
    """The earlier stages' results that the model card and the upload need, read once."""

    fingerprint: str
    summary: dict[str, Any]
    evaluation: dict[str, Any]
    samples: list[dict[str, str]]
    ggufs: list[Path]
    lora_ggufs: list[Path]

    @property
    def gate_passed(self) -> bool:
        return bool(self.evaluation.get("gate", {}).get("passed", True))


def read_run_outputs(dirs: RunDirs) -> RunOutputs:
    """Read what data, train, evaluate and export left; a missing piece is a clear error."""
    stats = read_stage_json(dirs.data / DATA_STATS, "the data stage")
    ggufs = sorted(dirs.export.glob("*.gguf")) if dirs.export.is_dir() else []
    models = [path for path in ggufs if LORA_MARKER not in path.name]
    if not models:
        raise UserError(
            f"The export stage left no model GGUF in {dirs.export} (expected <model-name>-<outtype>.gguf). "
            "Publish runs after export; run the export step for this run first."
        )
    if not (dirs.export / MODELFILE).is_file():
        raise UserError(
            f"The export stage left no {MODELFILE} in {dirs.export}; run the export step for this run again."
        )
    samples_path = dirs.evaluate / SAMPLE_RESPONSES
    return RunOutputs(
        fingerprint=stats["fingerprint"],
        summary=read_stage_json(dirs.train / TRAINING_SUMMARY, "the training stage"),
        evaluation=read_stage_json(dirs.evaluate / EVALUATION, "the evaluation stage"),
        samples=read_stage_json(samples_path, "the evaluation stage") if samples_path.exists() else [],
        ggufs=models,
        lora_ggufs=[path for path in ggufs if LORA_MARKER in path.name],
    )


def read_stage_json(path: Path, stage: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(
            f"{path} does not exist: {stage} has not run for this run (or wrote elsewhere). Run it first."
        ) from None
    except json.JSONDecodeError as error:
        raise UserError(f"{path} is not valid JSON ({error}); run {stage} again to rewrite it.") from None


def upload_plan(dirs: RunDirs, outputs: RunOutputs, options: PublishOptions) -> dict[str, Path]:
    """Path in the repository → local file, for everything except the model card."""
    plan: dict[str, Path] = {}
    adapter = dirs.train / ADAPTER
    adapter_trained = (adapter / "adapter_config.json").is_file()
    if options.publishes_merged(adapter_trained):
        merged = dirs.train / MERGED
        if not (merged / MERGED_CONFIG).is_file():
            raise UserError(
                f"publish_merged is {options.publish_merged} but {merged} holds no checkpoint (no config.json); "
                "the training stage writes it. Set publish_merged to false or rerun training."
            )
        plan.update(_tree(merged, "", skip={CARD_NAME}))
    for path in [*outputs.ggufs, *outputs.lora_ggufs, dirs.export / MODELFILE, dirs.train / TRAINING_SUMMARY]:
        plan[path.name] = path
    for name in (EVALUATION, EVALUATION_MARKDOWN, LOSS_CURVE):
        if (dirs.evaluate / name).is_file():
            plan[f"evaluation/{name}"] = dirs.evaluate / name
    if (dirs.evaluate / SAMPLE_RESPONSES).is_file():
        plan["evaluation/sample_responses.json"] = dirs.evaluate / SAMPLE_RESPONSES
    for name in (VERIFICATION_JSON, VERIFICATION_MARKDOWN):
        if (dirs.export / name).is_file():
            plan[f"verification/{name}"] = dirs.export / name
    if options.publish_adapter and adapter_trained:
        plan.update(_tree(adapter, "adapter/"))
    return plan


def _tree(root: Path, prefix: str, skip: set[str] = frozenset()) -> dict[str, Path]:
    """Every visible file under ``root`` as ``prefix + relative path``."""
    files = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if (
            path.is_file()
            and relative not in skip
            and not any(part.startswith(".") for part in path.relative_to(root).parts)
        ):
            files[prefix + relative] = path
    return files


def write_upload_folder(plan: dict[str, Path], card: str, target: Path) -> None:
    """Lay ``plan`` and the model card out in ``target``, replacing an earlier folder atomically."""

    def fill(folder: Path) -> None:
        for path_in_repo, source in plan.items():
            link_or_copy(source, folder / path_in_repo)
        (folder / CARD_NAME).write_text(card, encoding="utf-8")

    replace_dir(target, fill)
