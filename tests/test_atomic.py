"""Atomic publication: a file under its final name is always a finished file.

Pipeline pods get evicted, OOM-killed and interrupted. The unit tests pin down the
contract of common/atomic.py; the integration tests SIGKILL the real data
stage at many moments and check that nothing it leaves behind under a final name
is partial, and that stats.json (the completion marker) never vouches for files
it does not describe.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import PUBLISHED, REPO_ROOT, qa, read_stats, run_cli, snapshot, write_jsonl

from common import atomic
from common.atomic import STAGING_PREFIX, staging_dir, write_text_atomic


def visible(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if not p.name.startswith(".")}


def stagings(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.startswith(STAGING_PREFIX)]


# --- staging_dir / StagingDir ------------------------------------------------------------------


def test_staged_file_appears_under_final_name_only_when_published(tmp_path):
    """Readers polling the target must never see a half-written file under its final name."""
    target = tmp_path / "out"
    with staging_dir(target) as stage:
        with open(stage.file("data.bin"), "wb") as handle:
            handle.write(b"x" * 1000)
            handle.flush()
            assert visible(target) == set()
            handle.write(b"y" * 1000)
        assert visible(target) == set()
        stage.publish("data.bin")
        assert (target / "data.bin").read_bytes() == b"x" * 1000 + b"y" * 1000
        assert not stage.file("data.bin").exists()
    assert visible(target) == {"data.bin"}


def test_staging_area_is_hidden_inside_the_target_and_removed_on_success(tmp_path):
    """os.replace is only atomic within one filesystem, so staging must live inside the target; it must not linger."""
    target = tmp_path / "deep" / "out"
    with staging_dir(target) as stage:
        assert target.is_dir()
        assert stage.path.parent == target
        assert stage.path.name.startswith(STAGING_PREFIX) and stage.path.name.startswith(".")
        stage.file("a.txt").write_text("a")
        stage.publish("a.txt")
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"]


def test_concurrent_staging_areas_do_not_collide(tmp_path):
    """Two runs into the same directory (a retry overlapping a slow pod) must not write into each other's files."""
    with staging_dir(tmp_path) as one, staging_dir(tmp_path) as two:
        assert one.path != two.path
        one.file("f").write_text("one")
        two.file("f").write_text("two")
        assert one.file("f").read_text() == "one"
    assert stagings(tmp_path) == []


def test_publish_moves_files_in_the_order_given(tmp_path, monkeypatch):
    """The completion marker is only meaningful if it is renamed into place after every other file."""
    renamed = []
    real_replace = os.replace

    def recording_replace(src, dst):
        renamed.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", recording_replace)
    with staging_dir(tmp_path) as stage:
        for name in ("b", "c", "marker", "a"):
            stage.file(name).write_text(name)
        stage.publish("c", "a", "b", "marker")
    assert renamed == ["c", "a", "b", "marker"]
    assert {name: (tmp_path / name).read_text() for name in "abc"} == {"a": "a", "b": "b", "c": "c"}


def test_publish_as_renames_into_the_target(tmp_path):
    """The failure path publishes rejects under another name (rejects.failed.jsonl) without touching rejects.jsonl."""
    (tmp_path / "rejects.jsonl").write_text("old\n")
    with staging_dir(tmp_path) as stage:
        stage.file("rejects.jsonl").write_text("new\n")
        stage.publish_as("rejects.jsonl", "rejects.failed.jsonl")
    assert (tmp_path / "rejects.failed.jsonl").read_text() == "new\n"
    assert (tmp_path / "rejects.jsonl").read_text() == "old\n"


def test_publish_replaces_an_earlier_set_wholly(tmp_path):
    """A rerun into the same directory swaps every file for its new version, leaving nothing of the old one."""
    for name in ("train", "stats"):
        (tmp_path / name).write_text(f"old {name} " * 100)
    with staging_dir(tmp_path) as stage:
        for name in ("train", "stats"):
            stage.file(name).write_text(f"new {name}")
        stage.publish("train", "stats")
    assert {name: (tmp_path / name).read_text() for name in ("train", "stats")} == {
        "train": "new train",
        "stats": "new stats",
    }
    assert stagings(tmp_path) == []


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()], ids=["exception", "ctrl-c"])
def test_failure_inside_staging_leaves_no_final_files_and_no_leftovers(tmp_path, error):
    """A failed run must neither publish half its outputs nor litter the directory; earlier files stay untouched."""
    (tmp_path / "stats.json").write_text('{"old": true}\n')
    with pytest.raises(type(error)):
        with staging_dir(tmp_path) as stage:
            stage.file("train.parquet").write_bytes(b"partial")
            stage.file("stats.json").write_text('{"new": true}\n')
            raise error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.json"]
    assert (tmp_path / "stats.json").read_text() == '{"old": true}\n'


def test_failure_after_a_publish_keeps_only_what_was_published(tmp_path):
    """What the code promises: published files stay, unpublished ones are discarded with the staging area."""
    with pytest.raises(ValueError):
        with staging_dir(tmp_path) as stage:
            stage.file("rejects.failed.jsonl").write_text("r\n")
            stage.file("train.parquet").write_bytes(b"t")
            stage.publish("rejects.failed.jsonl")
            raise ValueError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rejects.failed.jsonl"]


# --- write_text_atomic --------------------------------------------------------------------------


def test_write_text_atomic_replaces_an_existing_file_wholly(tmp_path):
    """A shorter new text must not leave a tail of the old one (the classic in-place truncate bug)."""
    path = tmp_path / "pipeline.yaml"
    path.write_text("old content that is much longer than the new one\n" * 50)
    write_text_atomic(path, "new: 1\n")
    assert path.read_text() == "new: 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.yaml"]


def test_write_text_atomic_creates_parents_and_keeps_unicode(tmp_path):
    path = tmp_path / "a" / "b" / "out.txt"
    write_text_atomic(path, "café ☕ 日本語\n")
    assert path.read_bytes() == "café ☕ 日本語\n".encode("utf-8")


def test_write_text_atomic_file_is_complete_before_it_takes_the_final_name(tmp_path, monkeypatch):
    """At the moment of the rename the old file is still intact and the new content is fully on disk."""
    path = tmp_path / "out.txt"
    path.write_text("old")
    text = "line\n" * 100_000
    seen = {}
    real_replace = os.replace

    def checking_replace(src, dst):
        seen["src"], seen["dst_before"] = Path(src).read_text(), Path(dst).read_text()
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", checking_replace)
    write_text_atomic(path, text)
    assert seen == {"src": text, "dst_before": "old"}
    assert path.read_text() == text


def test_write_text_atomic_failure_keeps_the_old_file_and_no_temp_file(tmp_path):
    """Text that cannot be written (here: a lone surrogate) must leave the previous file exactly as it was."""
    path = tmp_path / "out.txt"
    path.write_text("previous\n")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(path, "fine so far " * 1000 + "\ud800")
    assert path.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


# --- the real data stage, killed ----------------------------------------------------------------


def assert_consistent(output_dir: Path, new: dict[str, bytes], old: dict[str, bytes] | None = None) -> None:
    """What a reader may rely on after any kill.

    Every file under a final name is one complete version (old or new, byte for
    byte), and if stats.json is present it describes exactly the files beside it.
    """
    assert visible(output_dir) <= set(PUBLISHED), visible(output_dir)
    present = snapshot(output_dir)
    for name, data in present.items():
        assert data == new[name] or (old is not None and data == old[name]), (
            f"{name} is neither the old nor the new version"
        )
    if "stats.json" in present:
        assert set(present) == set(PUBLISHED)
        stats = read_stats(output_dir)
        assert pq.read_metadata(output_dir / "train.parquet").num_rows == stats["rows"]["train"]
        assert pq.read_metadata(output_dir / "eval.parquet").num_rows == stats["rows"]["eval"]
        assert len((output_dir / "rejects.jsonl").read_text().splitlines()) == stats["rejected"]
        version = new if present["stats.json"] == new["stats.json"] else old
        assert present == version, "stats.json sits beside files of another run"


def small_dataset(path: Path, start: int, count: int, bad: int) -> Path:
    return write_jsonl(path, [qa(i) for i in range(start, start + count)] + ["{not json"] * bad)


def run_complete(src: Path, output_dir: Path, *extra) -> dict[str, bytes]:
    result = run_cli("--input", src, "--output-dir", output_dir, *extra)
    assert result.returncode == 0, result.stderr
    return snapshot(output_dir)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """An old and a new input, and the complete outputs of each; every output file differs between them."""
    base = tmp_path_factory.mktemp("two_runs")
    old_src = small_dataset(base / "old.jsonl", 0, 300, 1)
    new_src = small_dataset(base / "new.jsonl", 1000, 500, 2)
    old = run_complete(old_src, base / "ref_old")
    new = run_complete(new_src, base / "ref_new", "--eval-fraction", "0.3")
    assert all(old[name] != new[name] for name in PUBLISHED)
    return old_src, old, new_src, new


KILL_BEFORE_REPLACE = """
import os, signal, sys
calls = 0
real_replace = os.replace
def replace(src, dst):
    global calls
    if calls == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    calls += 1
    real_replace(src, dst)
os.replace = replace
from components.data.stage import main
main(sys.argv[2:])
"""


@pytest.mark.parametrize("kill_before", range(5))
def test_kill_between_publishes_never_leaves_a_stale_completion_marker(tmp_path, two_runs, kill_before):
    """Deterministically SIGKILL the stage just before each of its renames, over a previous run's outputs.

    The renames are separate steps, so a kill between them is a real window; the old
    stats.json must not survive next to a new train.parquet and vouch for it.
    """
    old_src, old, new_src, new = two_runs
    out = tmp_path / "out"
    out.mkdir()
    for name, data in old.items():
        (out / name).write_bytes(data)
    cli = ["--input", str(new_src), "--output-dir", str(out), "--eval-fraction", "0.3"]
    proc = subprocess.run(
        [sys.executable, "-c", KILL_BEFORE_REPLACE, str(kill_before), *cli],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=120,
    )
    if kill_before < len(PUBLISHED):
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert "stats.json" not in snapshot(out) or snapshot(out) == old
    else:
        assert proc.returncode == 0, proc.stderr
        assert snapshot(out) == new
    assert_consistent(out, new, old)

    assert run_cli(*cli).returncode == 0
    assert snapshot(out) == new


def big_dataset(path: Path, count: int) -> Path:
    """``count`` small distinct records (plus a few rejects), written fast."""
    path.write_bytes(
        b"".join(b'{"prompt": "p%d", "completion": "c%d"}\n' % (i, i) for i in range(count)) + b'{"prompt": 1}\n' * 3
    )
    return path


def staged_sizes(output_dir: Path) -> dict[str, int]:
    """Name -> size of the files in staging right now (they may vanish while we look)."""
    sizes = {}
    for directory in stagings(output_dir):
        try:
            sizes.update({f.name: f.stat().st_size for f in directory.iterdir()})
        except OSError:
            pass
    return sizes


KILL_MOMENTS = {
    "staging created": (lambda out: bool(stagings(out)), 0.0),
    "parquet being written": (lambda out: staged_sizes(out).get("train.parquet", 0) > 0, 0.0),
    "60% of a run": (None, 0.6),
    "85% of a run": (None, 0.85),
    "end of a run": (None, 1.0),
}


def kill_at(moment: str, duration: float, args: list, output_dir: Path) -> bool:
    """Start the CLI and SIGKILL it at ``moment``; True when it was caught mid-run with work staged."""
    condition, fraction = KILL_MOMENTS[moment]
    proc = subprocess.Popen(
        [sys.executable, "-m", "components.data.stage", *map(str, args)],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + fraction * duration
    while proc.poll() is None and (not condition(output_dir) if condition else time.monotonic() < deadline):
        time.sleep(0.002)
    mid_run = proc.poll() is None and bool(stagings(output_dir))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    return mid_run and proc.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_sigkill_at_any_moment_leaves_only_complete_outputs(tmp_path, two_runs):
    """Kill the real CLI on a large input at moments spread over its whole run.

    First into an empty directory, then over a previous complete run: after every kill
    each final-named file is complete and stats.json agrees with the files beside it.
    A normal rerun afterwards succeeds despite the leftover staging directories.
    """
    count = 400_000
    src = big_dataset(tmp_path / "big.jsonl", count)
    args = ["--input", src, "--eval-fraction", "0.2"]
    started = time.monotonic()
    new = run_complete(src, tmp_path / "ref_new", "--eval-fraction", "0.2")
    duration = time.monotonic() - started
    old = two_runs[1]

    caught = []
    for previous in (None, old):
        for moment in KILL_MOMENTS:
            out = tmp_path / f"out-{'rerun' if previous else 'fresh'}-{moment.replace(' ', '-')}"
            out.mkdir()
            for name, data in (previous or {}).items():
                (out / name).write_bytes(data)
            if kill_at(moment, duration, [*args, "--output-dir", out], out):
                caught.append(moment)
            assert_consistent(out, new, previous)
    # The test is only worth something if kills really landed inside runs.
    assert caught.count("staging created") == caught.count("parquet being written") == 2, caught

    assert run_cli(*args, "--output-dir", out).returncode == 0
    assert snapshot(out) == new
    rows = json.loads(new["stats.json"])["rows"]
    assert rows["train"] + rows["eval"] == count
