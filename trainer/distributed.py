"""Who this process is in the job, and whether the job is the one that was asked for.

torchrun derives ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` from what the
PyTorchJob controller sets (``PET_NNODES``, ``PET_NPROC_PER_NODE``,
``PET_NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); the Hugging Face Trainer
then initialises the process group from them. A pod started without torchrun,
or a PyTorchJob whose workers never rendezvous, sees no ``WORLD_SIZE`` and
would happily train alone on the whole data set: ``--expected-world-size``
turns that silent waste of GPU hours into an immediate failure.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from common.errors import UserError, one_line


@dataclass(frozen=True)
class Topology:
    """This process's place in the job, read from the environment torchrun sets."""

    rank: int
    local_rank: int
    world_size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environment(cls) -> Topology:
        return cls(
            rank=int(os.environ.get("RANK", 0)),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
        )


def check_world_size(topology: Topology, expected: int) -> None:
    """Fail before any work when the job is not as large as the caller planned (0 skips the check)."""
    if expected and topology.world_size != expected:
        launcher = {
            key: os.environ[key] for key in ("PET_NNODES", "PET_NPROC_PER_NODE", "MASTER_ADDR") if key in os.environ
        }
        raise UserError(
            f"--expected-world-size is {expected} but this process sees WORLD_SIZE={topology.world_size} "
            f"(launcher environment: {launcher or 'none'}). Each rank would train on the wrong share of the data. "
            "Launch with torchrun so that nnodes x nproc_per_node equals the expected world size (in a PyTorchJob: "
            "the Master plus Worker replicas times nprocPerNode), or pass the world size you actually launched."
        )


def backend() -> str:
    """NCCL between GPUs, gloo on CPU (the only backend that works there)."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def barrier() -> None:
    """Wait for every rank; a no-op in a single-process run."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def finish() -> None:
    """Wait for every rank, then leave the process group (every group this process joined).

    torch asks for ``destroy_process_group`` before a process exits: a rank that exits without it may abort in
    the group's C++ teardown (SIGABRT, "terminate called without an active exception"), which fails a job whose
    training finished. Seen once here, on rank 1 of a 2-rank gloo relaunch after it wrote its outputs.
    """
    global _host_group
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        _host_group = None


def exit_process(code: int) -> NoReturn:
    """End this process with ``code`` once the run is over: Python's exit handlers run (logging and every
    ``atexit`` hook), then the process exits without the interpreter's teardown.

    A finished rank could still abort in the C++ part of that teardown, when the interpreter frees what is left:
    SIGABRT, "terminate called without an active exception", exit code -6, and torchrun reports the job failed
    though every output was written. Seen on rank 1 of a 2-rank gloo relaunch (at d1a8bd6) and on rank 3 of a 4-rank
    DDP run after ``finish`` had left the process group (at b36ee09); pytorch/pytorch#179291 describes gloo's worker
    threads holding tensors that are freed during finalization. Nothing is left to do by then, so the teardown is
    skipped: the outputs are on disk, and the pod's files close with the process.
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# A gloo group beside an NCCL one, for the small host-side values ranks share during training (the pre-emption
# flag, token counts): over NCCL each would be a GPU tensor whose .item() waits for every kernel queued before it.
_host_group: dist.ProcessGroup | None = None
# The run's collective_timeout_minutes, set by initialise: every group the trainer creates waits for a lost peer
# this long, not torch's default of 30 minutes.
_collective_timeout: dt.timedelta | None = None
# A rank that could not join exits with this status: a failure (torchrun and the job restart the ranks), not
# common.errors' status 2, which reports say means rejected input or options.
JOIN_FAILED_EXIT_CODE = 1


def _on_host(value: int, op: dist.ReduceOp) -> int:
    """``value`` reduced over every rank on the CPU, without touching any GPU stream. Every rank calls it at the
    same point (it is a collective), so the first call may create the gloo group, another collective."""
    global _host_group
    if not (dist.is_available() and dist.is_initialized()):
        return value
    if _host_group is None and dist.get_backend() != "gloo":
        _host_group = dist.new_group(backend="gloo", timeout=_collective_timeout)
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=op, group=_host_group)
    return int(tensor.item())


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on at least one (e.g. one pod got SIGTERM)."""
    return bool(_on_host(1 if flag else 0, dist.ReduceOp.MAX))


def sum_over_ranks(value: int) -> int:
    """The sum of ``value`` over every rank, on every rank."""
    return _on_host(value, dist.ReduceOp.SUM)


def initialise(topology: Topology, timeout_minutes: float) -> None:
    """Join the job's process group now, before the model is fetched: rank 0 downloads while the others wait in
    a collective. The Trainer (through accelerate) then reuses this group; a single process needs none.

    Joining is bounded by ``timeout_minutes`` like every collective: a rank whose peers do not all arrive exits
    with one line instead of waiting without a word, so that torchrun's or the job's restart acts.
    """
    global _collective_timeout
    _collective_timeout = dt.timedelta(minutes=timeout_minutes)
    if topology.world_size > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(topology.local_rank)  # NCCL collectives run on the current device: this rank's GPU
        with _exit_unless_joined(topology.rank, timeout_minutes):
            dist.init_process_group(
                backend=backend(), timeout=_collective_timeout, **_this_attempts_store(topology, _collective_timeout)
            )
            dist.barrier()  # gloo connects every pair in init_process_group, NCCL only at its first collective


def _this_attempts_store(topology: Topology, timeout: dt.timedelta) -> dict[str, Any]:
    """Under torchrun, the agent's store with the keys of this restart round apart from those of the rounds before.

    torchrun's agent hosts the store the ranks rendezvous in (``TORCHELASTIC_USE_AGENT_STORE``) and keeps it for
    all its restart rounds, and torch 2.13 writes each round's keys under the same names. gloo publishes every
    rank's address there and reads its peers' at once if set: a restarted rank that comes first reads the dead
    rank's address, then dials it (Connection refused, a lost restart) or waits for it to call (gloo waits 5 times
    the group's timeout, 50 minutes at the default 10). A prefix per restart count gives each round its own keys.
    torchrun counts restarts per agent (pytorch/pytorch#108158): one count for all ranks of a single-node job; the
    launcher's multi-pod jobs pass no ``--max-restarts``, so their count stays 0 and Kubernetes restarts the pods.
    Elsewhere torch's own ``env://`` rendezvous, a store per launch, is kept.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    agent_store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return {
        "store": dist.PrefixStore(f"trainer/restart-{attempt}", agent_store),
        "rank": topology.rank,
        "world_size": topology.world_size,
    }


@contextlib.contextmanager
def _exit_unless_joined(rank: int, timeout_minutes: float) -> Iterator[None]:
    """Run the join; end the process with one line when it fails or outlasts ``timeout_minutes``.

    The process exits from a timer thread because the main thread is blocked inside torch's C++ code, where no
    exception or signal handler reaches it (gloo's own wait for a peer that never calls lasts 5 timeouts).
    """
    timer = threading.Timer(timeout_minutes * 60, _could_not_join, (rank, timeout_minutes, None))
    timer.daemon = True
    timer.start()
    try:
        yield
    except RuntimeError as error:  # torch's DistError and gloo's connect errors are RuntimeErrors
        _could_not_join(rank, timeout_minutes, error)
    finally:
        timer.cancel()


def _could_not_join(rank: int, timeout_minutes: float, cause: Exception | None) -> NoReturn:
    """Say in one line why this rank stops, and stop it at once (no interpreter shutdown to hang in)."""
    how = f"({one_line(cause, 300)})" if cause else f"within collective_timeout_minutes ({timeout_minutes:g} min)"
    print(
        f"error: rank {rank} could not join the job's process group {how}: a peer rank is lost, still starting or "
        "stuck. This rank exits so that torchrun's restart policy (--max-restarts) or the job's restart starts all "
        f"ranks again; if ranks only start slowly, raise collective_timeout_minutes (now {timeout_minutes:g}).",
        file=sys.stderr,
        flush=True,
    )
    os._exit(JOIN_FAILED_EXIT_CODE)


def from_main(value: Any, wait_minutes: float) -> Any:
    """Rank 0's ``value`` on every rank (``value`` itself in a single-process run).

    The other ranks wait up to ``wait_minutes`` for it, in a gloo group of its own: rank 0 may be busy for longer
    than the training collectives' timeout allows (a large download), and gloo carries Python objects on the CPU
    whatever backend training uses.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return value
    group = dist.new_group(backend="gloo", timeout=dt.timedelta(minutes=wait_minutes))
    shared = [value]
    dist.broadcast_object_list(shared, src=0, group=group)
    dist.destroy_process_group(group)
    return shared[0]
