"""Ranks restarted by torchrun (``--max-restarts``): a lost rank costs a restart round, never the run, never a hang.

torchrun restarts every rank of its worker group when one dies. Each new round must join the process group
afresh, not with its predecessors' addresses left in torchrun's store (``trainer/distributed.py``,
``_this_attempts_store``), a round that cannot join must end within ``collective_timeout_minutes`` so that the
restart acts, and the trainer must resume from its newest complete checkpoint to the result of a run never
interrupted.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import REPO_ROOT
from test_trainer_run import finish, summary, torchrun, trainer_args, wait_for, worker_pid

from trainer import checkpoints, distributed
from trainer.distributed import Topology

# A torchrun worker that joins the process group as the trainer does, and does nothing else, so that a round takes
# a second, not a model load. argv: collective_timeout_minutes, the number of rounds that lose rank 1 once it has
# joined, and a rank that never joins (-1: none). In a restarted round rank 1 comes a second late, so rank 0 reads
# the store first: before the fix it found rank 1's address of the round before there.
JOINER = """
import os, signal, sys, time
from trainer import distributed

minutes, kills, absent = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
topology = distributed.Topology.from_environment()
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if topology.rank == absent:
    time.sleep(600)
if restart and topology.rank == 1:
    time.sleep(1)
distributed.initialise(topology, minutes)
print(f"round {restart} rank {topology.rank} joined", flush=True)
if restart < kills:
    if topology.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)
"""


@contextmanager
def stopped_at_exit(process: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """``process`` (torchrun) stopped with its workers however the test ends: a failed assertion must not leave
    ranks behind. SIGTERM, which torchrun forwards to its workers, then SIGKILL."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def join_rounds(tmp_path: Path, minutes: float, kills: int, absent: int, *torchrun_flags: str) -> tuple[int, str]:
    """Run JOINER on two ranks under torchrun; its exit status and output."""
    script, log = tmp_path / "joiner.py", tmp_path / "log"
    script.write_text(JOINER)
    args = [str(minutes), str(kills), str(absent)]
    env = {"PYTHONPATH": str(REPO_ROOT)}  # the trainer of this checkout, whatever the script's directory
    with stopped_at_exit(torchrun(args, env, log, 2, *torchrun_flags, entry=(str(script),))) as process:
        return finish(process, timeout=120), log.read_text()


def test_the_host_group_beside_nccl_fails_a_lost_peer_after_the_runs_collective_timeout(monkeypatch):
    """The gloo group for host-side values, made when training runs over another backend (NCCL), waits for a lost
    peer as long as the training collectives (collective_timeout_minutes), not torch's default 30 minutes."""
    from torch.testing._internal.distributed import fake_pg  # noqa: F401  registers "fake": a backend not gloo

    monkeypatch.setattr(distributed, "_host_group", None)
    monkeypatch.setattr(distributed, "_collective_timeout", None)
    distributed.initialise(Topology(rank=0, local_rank=0, world_size=1), timeout_minutes=0.25)
    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert distributed.sum_over_ranks(3) == 3
        host_group = distributed._host_group._get_backend(torch.device("cpu"))
        assert host_group.options._timeout == dt.timedelta(seconds=15)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_rank_whose_peer_never_joins_exits_within_the_collective_timeout_with_one_line(tmp_path):
    """Rank 1 never joins: rank 0 stops after collective_timeout_minutes (0.1: 6 s) with one line that says why
    and what acts next, and torchrun fails the job instead of waiting without a word."""
    started = time.monotonic()
    returncode, text = join_rounds(tmp_path, 0.1, 0, 1)
    elapsed = time.monotonic() - started
    assert returncode != 0 and elapsed < 6 + 20, f"{elapsed:.0f} s\n{text[-3000:]}"
    (line,) = [line for line in text.splitlines() if line.startswith("error: ")]
    assert line.startswith("error: rank 0 could not join the job's process group"), line
    assert "collective_timeout_minutes" in line and "0.1" in line and "restart" in line, line
    assert "Traceback" not in text.split(line)[0], text[-3000:]  # the line, not a trace, from the rank


@pytest.mark.slow
def test_every_restarted_round_joins_afresh(tmp_path):
    """Three rounds lose rank 1 after joining; torchrun's three restarts must each bring both ranks together.
    Before the fix one restart in two failed to join (gloo dialled the lost rank's address, Connection refused)
    or hung (both ranks waiting for the other to call: 5 collective timeouts), and the run ran out of restarts."""
    returncode, text = join_rounds(tmp_path, 0.1, 3, -1, "--max-restarts", "3")
    assert returncode == 0, text[-3000:]
    for restart in range(4):
        for rank in (0, 1):
            assert f"round {restart} rank {rank} joined" in text, text[-3000:]


# Four restart rounds and a reference run of 10 steps, checkpoints every 2: the kills come after checkpoints 2, 4
# and 6, and the run finishes from checkpoint 6.
STEPS, SAVE_STEPS, KILLED_AFTER = 10, 2, (2, 4, 6)

# On the workers' path in the killed run: once rank 0 has marked a checkpoint of $HOLD_AFTER complete, it waits to
# be killed (the first time only; a marker in $HOLD_DIR says it held there), so each kill lands between that
# checkpoint and the next however fast the steps are. A step of the tiny model takes milliseconds: without the
# hold, a round could save the next checkpoint before the kill and be killed again before it logged its resume.
# When torchrun stops the round (SIGTERM), the held rank exits at once, as the trainer's own handler would not.
HOLD_SITECUSTOMIZE = """
import os
if os.environ.get("HOLD_AFTER") and "RANK" in os.environ:
    import signal
    import time
    from pathlib import Path
    import trainer.checkpoints as _checkpoints

    _mark_complete = _checkpoints.mark_complete
    _hold_after = {int(step) for step in os.environ["HOLD_AFTER"].split(",")}

    def mark_complete(checkpoint, step):
        _mark_complete(checkpoint, step)
        held = Path(os.environ["HOLD_DIR"]) / f"held-{step}"
        if step in _hold_after and not held.exists():
            signal.signal(signal.SIGTERM, lambda number, frame: os._exit(128 + number))
            held.touch()
            while True:
                time.sleep(1)

    _checkpoints.mark_complete = mark_complete
"""


def hold_environment(directory: Path) -> dict[str, str]:
    """The workers' environment that holds rank 0 after each checkpoint of KILLED_AFTER (HOLD_SITECUSTOMIZE)."""
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(HOLD_SITECUSTOMIZE)
    hold = {"HOLD_AFTER": ",".join(map(str, KILLED_AFTER)), "HOLD_DIR": str(directory)}
    return {**hold, "PYTHONPATH": f"{directory}{os.pathsep}{REPO_ROOT}"}


def kill_a_rank_after_each(process: subprocess.Popen, output: Path, log: Path, holds: Path) -> None:
    """SIGKILL rank 1, then 0, then 1 (a pod lost to OOM or a node failure), each while rank 0 holds after the next
    checkpoint of KILLED_AFTER, so that every restart round makes progress before it loses a rank."""
    for number, step in enumerate(KILLED_AFTER):
        manifest = output / "checkpoints" / f"checkpoint-{step}" / checkpoints.MANIFEST
        held = holds / f"held-{step}"
        wait_for(lambda: (manifest.exists() and held.exists()) or process.poll() is not None, 120, f"checkpoint-{step}")
        assert process.poll() is None, log.read_text()[-3000:]
        os.kill(worker_pid(process, rank=(number + 1) % 2), signal.SIGKILL)


@pytest.mark.slow
def test_three_killed_ranks_under_torchrun_restarts_end_with_the_weights_of_an_uninterrupted_run(
    tiny_model_dir, prepared_data_dir, tmp_path
):
    """A rank SIGKILLed three times, torchrun restarting the ranks each time (``--max-restarts 3``, no spare):
    every restart joins and resumes from the newest complete checkpoint, and the run ends where a run never
    interrupted ends, to the same weights and eval loss. Rank 0 holds after each checkpoint a kill follows
    (``HOLD_SITECUSTOMIZE``) until that kill, so the rounds go as planned however fast the steps are."""
    runs = {}
    for name in ("uninterrupted", "killed"):
        output, log = tmp_path / name, tmp_path / f"{name}.log"
        args = trainer_args(
            tiny_model_dir,
            prepared_data_dir,
            output,
            *("--max-steps", STEPS, "--save-steps", SAVE_STEPS, "--learning-rate", "1e-3"),
            *("--collective-timeout-minutes", "1"),  # a join that fails ends the round within a minute
        )
        env = hold_environment(tmp_path / "holds") if name == "killed" else None
        with stopped_at_exit(torchrun(args, env, log, 2, "--max-restarts", "3")) as process:
            if name == "killed":
                kill_a_rank_after_each(process, output, log, tmp_path / "holds")
            assert finish(process, timeout=180) == 0, log.read_text()[-3000:]
        runs[name] = summary(output)

    killed, reference = runs["killed"], runs["uninterrupted"]
    assert reference["resumed_from"] is None
    assert killed["resumed_from"] == str(tmp_path / "killed" / "checkpoints" / f"checkpoint-{KILLED_AFTER[-1]}")
    assert killed["global_step"] == reference["global_step"] == STEPS
    assert (tmp_path / "killed.log").read_text().count("resuming from") == len(KILLED_AFTER)
    assert killed["final_eval_loss"] == pytest.approx(reference["final_eval_loss"], rel=1e-6)
    assert [rank["weights_sha256"] for rank in killed["ranks"]] == [
        rank["weights_sha256"] for rank in reference["ranks"]
    ]
