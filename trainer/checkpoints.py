"""Which checkpoints are complete, and which one a restarted job resumes from.

The Hugging Face Trainer writes ``checkpoint-N/`` file by file, so a pod killed
mid-save leaves a directory that looks like a checkpoint but holds a truncated
optimizer state or no weights at all. Loading it would crash the restarted job
(or worse, resume from garbage). After every save, once all ranks have written
their part, rank 0 adds ``checkpoint_complete.json`` listing every file and its
size; only a checkpoint whose manifest exists and still matches the files on
disk is ever resumed from.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from common.atomic import write_json

MANIFEST = "checkpoint_complete.json"
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def _file_sizes(checkpoint: Path) -> dict[str, int]:
    return {
        str(path.relative_to(checkpoint)): path.stat().st_size
        for path in sorted(checkpoint.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }


def mark_complete(checkpoint: Path, step: int) -> None:
    """Record that ``checkpoint`` is fully written (rank 0, after every rank saved its part)."""
    manifest = {"step": step, "files": _file_sizes(checkpoint)}
    write_json(checkpoint / MANIFEST, manifest)


@dataclass(frozen=True)
class CheckpointVerdict:
    path: Path
    step: int
    problem: str | None

    @property
    def complete(self) -> bool:
        return self.problem is None


def inspect(checkpoint: Path, step: int) -> CheckpointVerdict:
    """Whether ``checkpoint`` matches its manifest, and what is wrong if not."""
    manifest_path = checkpoint / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return CheckpointVerdict(checkpoint, step, "no completion manifest (the save was interrupted)")
    except (OSError, ValueError) as error:
        return CheckpointVerdict(checkpoint, step, f"unreadable completion manifest ({error})")
    actual = _file_sizes(checkpoint)
    for name, size in manifest.get("files", {}).items():
        if name not in actual:
            return CheckpointVerdict(checkpoint, step, f"{name} is missing")
        if actual[name] != size:
            return CheckpointVerdict(checkpoint, step, f"{name} has {actual[name]} bytes, the manifest says {size}")
    if not manifest.get("files"):
        return CheckpointVerdict(checkpoint, step, "the manifest lists no files")
    return CheckpointVerdict(checkpoint, step, None)


def inspect_all(checkpoints_dir: Path) -> list[CheckpointVerdict]:
    """Every ``checkpoint-N`` under ``checkpoints_dir``, newest first."""
    if not checkpoints_dir.is_dir():
        return []
    found = []
    for path in checkpoints_dir.iterdir():
        match = _CHECKPOINT_NAME.match(path.name)
        if match and path.is_dir():
            found.append(inspect(path, int(match.group(1))))
    return sorted(found, key=lambda verdict: verdict.step, reverse=True)


def newest_complete(verdicts: list[CheckpointVerdict]) -> Path | None:
    """The checkpoint to resume from: the newest of ``inspect_all``'s verdicts that is complete."""
    return next((verdict.path for verdict in verdicts if verdict.complete), None)
