"""The trainer as N processes on this machine: what the train step runs under kfp.local.

The same contract as in a training pod: ``torch.distributed.run`` starts the
ranks (gloo on CPU, NCCL on GPUs: the trainer picks), the options come from
``to_args`` with ``--expected-world-size`` set, and HF_TOKEN (if any) comes
from the environment. The output streams into the step's log as it is written;
a failure raises ``TrainingFailed`` with the failing rank, its exit code and the
last lines. SIGTERM (a cancelled local run) is passed on to torchrun, which
passes it to the ranks, and they save a checkpoint before exiting.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
from collections import deque
from typing import TextIO

from components.train.reports import TAIL_LINES, TrainingFailed, exit_code_text, quoted
from components.train.signals import sigterm_raises
from trainer.config import TrainConfig, to_args

STOP_GRACE_SECONDS = 60  # time the ranks get to save a checkpoint after SIGTERM
# When a rank fails, torchrun logs this line, then its own traceback and a summary
# whose "Root Cause" entry names the rank that failed first and its exit code.
AGENT_SAW_FAILURE = re.compile(r"torch/distributed/elastic/.*failed \(exitcode: ")
ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)


def local_command(config: TrainConfig, processes: int) -> list[str]:
    config = dataclasses.replace(config, expected_world_size=processes)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        "-m",
        "trainer",
        *to_args(config),
    ]


def run_local(config: TrainConfig, processes: int, out: TextIO | None = None) -> None:
    """Train with ``processes`` local ranks; return when they all succeeded, else raise TrainingFailed."""
    out = out or sys.stdout  # looked up now: tests and callers may have replaced it
    command = local_command(config, processes)
    print(f"starting the trainer with {processes} local processes: {' '.join(command[1:])}", file=out, flush=True)
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with sigterm_raises():
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        agent_lines: list[str] = []  # torchrun's own account of a failure, after the ranks' output
        try:
            for line in process.stdout:
                out.write(line)
                out.flush()
                if agent_lines or AGENT_SAW_FAILURE.search(line):
                    agent_lines.append(line)
                else:
                    tail.append(line.rstrip("\n"))
            exit_code = process.wait()
        except BaseException:  # Terminated, KeyboardInterrupt: let the ranks checkpoint, then leave
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            raise
    if exit_code:
        raise TrainingFailed(failure_report(exit_code, processes, list(tail), "".join(agent_lines)))


def failure_report(exit_code: int, processes: int, tail: list[str], agent_summary: str) -> str:
    """The failing rank (from torchrun's root cause), the trainer's error line and its last lines before
    torchrun's own traceback.
    """
    lines = [f"the local trainer (torchrun, {processes} processes) exited with code {exit_code}"]
    root_cause = ROOT_CAUSE.search(agent_summary)
    if root_cause:
        lines.append(f"failing rank: {root_cause.group(1)}, exit code {exit_code_text(int(root_cause.group(2)))}")
    lines += [f"the trainer said: {line}" for line in tail if line.startswith("error: ")][:1]
    lines.append(f"last {len(tail)} lines of the trainer:")
    return "\n".join(lines + quoted(tail))
