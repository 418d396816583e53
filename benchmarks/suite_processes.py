"""Where the suite's CPU goes by kind of process: run a command and sample every process it starts.

Most of the suite's CPU is spent outside pytest's own processes: trainer ranks under torchrun, torchrun's agents,
the evaluation command, kfp.local's steps, llama.cpp. A test's seconds (benchmarks/suite_times.py) cannot split
those, so this runs the command and reads the CPU time of each of its descendants from ``/proc`` every
``--interval`` seconds, then prints a Markdown table of CPU seconds by kind:

    python benchmarks/suite_processes.py -- .venv/bin/python -m pytest -n 2 -q

This process makes itself the subreaper of the command's tree (``PR_SET_CHILD_SUBREAPER``), so a process whose
parent ended (a killed torchrun agent's ranks, a server left running) is re-parented to it and still counted,
and is sampled once more after it ends, before this process reaps it. A process whose parent waits for it is
counted from the last sample that saw it: it loses the CPU it used after that sample, and one that starts and
ends between two samples is missed. The sum is a lower bound; the last line compares it with the CPU the kernel
counted for every descendant that was waited for (``RUSAGE_CHILDREN``). Linux only.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36  # prctl(2)'s option, from linux/prctl.h
# How execnet starts pytest-xdist's workers: execnet.gateway_io.popen_bootstrapline.
XDIST_WORKER = "import sys;exec(eval(sys.stdin.readline()))"
PYTHON_OPTIONS_WITH_A_VALUE = ("-X", "-W", "-Q")


@dataclass
class Sampled:
    """One process as last seen: its command line and the CPU seconds (user and system) it had used."""

    command: list[str]
    cpu_seconds: float = 0.0


def kind_of(command: Sequence[str]) -> str:
    """The row a process is counted in: ``python -m <module>`` for a module, the xdist worker, ``python -c`` for
    inline code, else the program's or script's file name."""
    if not command:
        return "(no command line)"
    program = Path(command[0]).name
    if not program.startswith("python"):
        return program
    arguments = list(command[1:])
    while arguments and arguments[0].startswith("-") and arguments[0] not in ("-m", "-c"):
        arguments = arguments[2:] if arguments[0] in PYTHON_OPTIONS_WITH_A_VALUE else arguments[1:]
    if len(arguments) >= 2 and arguments[0] == "-m":
        return f"python -m {arguments[1]}"
    if len(arguments) >= 2 and arguments[0] == "-c":
        return "pytest-xdist worker" if arguments[1] == XDIST_WORKER else "python -c"
    return f"python {Path(arguments[0]).name}" if arguments else "python"


def read_stat(pid: int) -> tuple[int, int, float] | None:
    """(parent pid, start time in ticks, CPU seconds) of ``pid``, or None when it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name in parentheses may hold spaces
    return int(fields[1]), int(fields[19]), (int(fields[11]) + int(fields[12])) / TICKS


def read_command(pid: int) -> list[str]:
    """The command line of ``pid``, or an empty one when it is gone or is a zombie."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def sample(root: int, seen: dict[tuple[int, int], Sampled]) -> None:
    """Update ``seen`` (keyed by pid and start time, since pids are reused) with every descendant of ``root``.

    The command line is read again while the process lives: a process seen between its fork and its exec, or a
    wrapper that execs what it wraps, is counted as what it became."""
    stats = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := read_stat(int(entry.name))) is not None:
            stats[int(entry.name)] = stat
    descendants = {root}
    added = True
    while added:  # parents before children, however /proc lists them
        fresh = {pid for pid, (parent, _, _) in stats.items() if parent in descendants and pid not in descendants}
        descendants |= fresh
        added = bool(fresh)
    for pid in descendants - {root}:
        if pid not in stats:
            continue
        _, started, cpu_seconds = stats[pid]
        process = seen.setdefault((pid, started), Sampled([]))
        process.command = read_command(pid) or process.command
        process.cpu_seconds = cpu_seconds


def reap(root: int) -> int | None:
    """Wait for every child of this process that has ended (the command, and the orphans re-parented here): the
    command's exit code once it has ended."""
    code = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code
        if pid == 0:
            return code
        if pid == root:
            code = os.waitstatus_to_exitcode(status)


def run(command: Sequence[str], interval: float) -> tuple[int, dict[tuple[int, int], Sampled], float]:
    """Run ``command`` to its end while sampling; its exit code, what was sampled, and the CPU seconds of every
    descendant the kernel counted."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seen: dict[tuple[int, int], Sampled] = {}
    process = subprocess.Popen(command)
    code = None
    while code is None:
        sample(os.getpid(), seen)  # before reaping: an ended child is a zombie whose CPU is still readable
        code = reap(process.pid)
        try:
            time.sleep(interval)
        except KeyboardInterrupt:  # the command got the interrupt too: count what it did until it ends
            pass
    process.returncode = code  # reaped here, not by Popen
    sample(os.getpid(), seen)  # what the command left running, once more
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    counted = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return code, seen, counted


def table(seen: dict[tuple[int, int], Sampled], counted: float) -> list[str]:
    """The Markdown table: CPU seconds, processes and seconds each, by kind, largest first, then the whole."""
    seconds: dict[str, float] = defaultdict(float)
    processes: dict[str, int] = defaultdict(int)
    for process in seen.values():
        kind = kind_of(process.command)
        seconds[kind] += process.cpu_seconds
        processes[kind] += 1
    lines = ["| CPU seconds | processes | each | kind |", "| ---: | ---: | ---: | --- |"]
    for kind in sorted(seconds, key=lambda kind: -seconds[kind]):
        lines.append(f"| {seconds[kind]:.2f} | {processes[kind]} | {seconds[kind] / processes[kind]:.2f} | {kind} |")
    sampled = sum(seconds.values())
    lines.append(f"| {sampled:.2f} | {len(seen)} | | all sampled, of {counted:.2f} the kernel counted |")
    return lines


def positive_seconds(text: str) -> float:
    seconds = float(text)
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/suite_processes.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--interval", type=positive_seconds, default=0.2, help="seconds between samples (default: %(default)s)"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. -- .venv/bin/python -m pytest -n 2 -q")
    code, seen, counted = run(command, args.interval)
    print("\n".join(table(seen, counted)), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
