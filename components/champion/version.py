"""The version a run publishes, as the steps that make and deliver it read it: the run's stage folders, what data,
train, evaluate and export left in them (read once, a missing piece named with the stage to run), the base model
it was trained from (export names its GGUFs after it, store, register and serve their copies) and the copies the
store step recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, TypeVar

from common.errors import UserError
from common.records import (
    DataStats,
    EvaluationResult,
    SampleAnswer,
    SampleAnswers,
    StoredCopies,
    StoredCopy,
    TrainingSummary,
)
from common.run_layout import (
    DATA_STATS,
    EVALUATION,
    LORA_MARKER,
    MODELFILE,
    SAMPLE_RESPONSES,
    STORE,
    STORED,
    TRAINING_SUMMARY,
    UPLOAD,
    stage_dir,
)

Record = TypeVar("Record")
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

    stats: DataStats
    summary: TrainingSummary
    evaluation: EvaluationResult
    samples: tuple[SampleAnswer, ...]
    ggufs: list[Path]
    lora_ggufs: list[Path]

    @property
    def fingerprint(self) -> str:
        """The prepared data's, as the data step wrote it."""
        return self.stats.fingerprint

    @property
    def gate_passed(self) -> bool:
        return self.evaluation.gate.passed


def read_run_outputs(dirs: RunDirs) -> RunOutputs:
    """Read what data, train, evaluate and export left; a missing piece is a clear error."""
    stats = written(DataStats.read, dirs.data / DATA_STATS, "the data stage")
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
    return RunOutputs(
        stats=stats,
        summary=written(TrainingSummary.read, dirs.train / TRAINING_SUMMARY, "the training stage"),
        evaluation=written(EvaluationResult.read, dirs.evaluate / EVALUATION, "the evaluation stage"),
        samples=SampleAnswers.read(dirs.evaluate / SAMPLE_RESPONSES).answers,
        ggufs=models,
        lora_ggufs=[path for path in ggufs if LORA_MARKER in path.name],
    )


def written(read: Callable[[Path], Record | None], path: Path, stage: str) -> Record:
    """What ``read`` (a record's ``read``) finds at ``path``; a clear error naming ``stage`` when it has not written
    the file for this run."""
    if (found := read(path)) is not None:
        return found
    raise UserError(f"{path} does not exist: {stage} has not run for this run (or wrote elsewhere). Run it first.")


def trained_from(train_dir: Path) -> str:
    """The base model in the training summary, when the trainer wrote one."""
    summary = TrainingSummary.read(train_dir / TRAINING_SUMMARY)
    return summary.base_model if summary else ""


def stored_copies(workspace_root: str | Path, run_id: str) -> tuple[StoredCopy, ...]:
    """The copies ``store`` recorded for run ``run_id``; none when the store step has not run."""
    return StoredCopies.read(stage_dir(workspace_root, run_id, STORE) / STORED).copies
