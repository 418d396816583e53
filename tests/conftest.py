"""Small helpers shared by the data-stage tests: write JSONL, run the CLI, read outputs."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ("train.parquet", "eval.parquet", "rejects.jsonl", "stats.json")


def write_jsonl(path: Path, lines, *, gz: bool | None = None) -> Path:
    """Write one line per item: dicts/lists/numbers as JSON, str as UTF-8 text, bytes as is.

    Every line ends with a newline. ``gz`` defaults to compressing when the name ends in .gz.
    """
    encoded = []
    for item in lines:
        if isinstance(item, bytes):
            encoded.append(item)
        elif isinstance(item, str):
            encoded.append(item.encode("utf-8"))
        else:
            encoded.append(json.dumps(item, ensure_ascii=False).encode("utf-8"))
    data = b"".join(line + b"\n" for line in encoded)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz if gz is not None else path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def run_module(module: str, *args, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -m module args`` from the repository root in a real subprocess, capturing text output."""
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_cli(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -m components.prepare_dataset`` with ``args`` in a real subprocess."""
    return run_module("components.prepare_dataset", *args, timeout=timeout)


def read_split(output_dir: Path, split: str) -> list[dict]:
    """Rows of ``train`` or ``eval`` Parquet as dicts with ``id`` and ``messages``."""
    return pq.read_table(Path(output_dir) / f"{split}.parquet").to_pylist()


def all_rows(output_dir: Path) -> list[dict]:
    """Train rows then eval rows."""
    return read_split(output_dir, "train") + read_split(output_dir, "eval")


def read_stats(output_dir: Path) -> dict:
    return json.loads((Path(output_dir) / "stats.json").read_text(encoding="utf-8"))


def read_rejects(output_dir: Path, name: str = "rejects.jsonl") -> list[dict]:
    text = (Path(output_dir) / name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def snapshot(output_dir: Path) -> dict[str, bytes]:
    """Bytes of every published output file present in ``output_dir``."""
    return {name: (Path(output_dir) / name).read_bytes() for name in PUBLISHED if (Path(output_dir) / name).exists()}


def qa(i: int, topic: str = "knots") -> dict:
    """A distinct, valid topic/question/answer record."""
    return {"topic": topic, "question": f"question number {i}?", "answer": f"Answer number {i}."}
