"""Install a hashed lock file into this interpreter's environment: pip, in as many processes as there are cores.

    python tools/install_lock.py requirements.lock --also "torch==2.13.0"

pip installs one wheel after the other on one core, and most of a clean clone's install is that core unpacking
and byte-compiling: `make install` of requirements.lock and torch took 147 and 152 s on a 2-core CI host, while the
other core idled. Here the lock is split into groups, one per core, each installed by its own pip with
``--require-hashes --no-deps``; the two halves of the same lock took 92 s (issue 42, docs/contributing.md). What is
installed is still exactly the lock: every pin in one group, every file checked against its hashes.

pip does not lock an environment against another pip, so two of them must never write the same file. The
distributions of one family (the names that share their first word: mlflow, mlflow-skinny and mlflow-tracing ship
the same modules) go to one group, and tests/test_install_lock.py checks the installed environment's records for a
file written by two groups. pip itself, when the lock holds it, is installed first and alone: the others run it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==")
PIP_INSTALL = ["-m", "pip", "install", "--quiet", "--no-deps"]


def pins(lock_text: str) -> dict[str, str]:
    """Each pin of a lock file by its canonical name: its ``name==version`` line and its ``--hash`` options."""
    found = {}
    for entry in lock_text.replace("\\\n", " ").splitlines():
        if match := PIN.match(entry):
            found[canonical(match[1])] = " ".join(entry.split())
    return found


def canonical(name: str) -> str:
    """PEP 503's normalised name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def family(name: str) -> str:
    """The first word of a canonical name: distributions of one family may ship the same files."""
    return name.split("-")[0]


def groups(names: Sequence[str], count: int) -> list[list[str]]:
    """``names`` dealt into ``count`` groups, a family at a time and in name order, so that one family is in one
    group (``pip`` is not dealt: it goes first, alone)."""
    families: dict[str, list[str]] = {}
    for name in sorted(names):
        if name != "pip":
            families.setdefault(family(name), []).append(name)
    dealt: list[list[str]] = [[] for _ in range(count)]
    for index, members in enumerate(families.values()):
        dealt[index % count].extend(members)
    return [group for group in dealt if group]


def run_all(commands: list[list[str]], slots: int) -> list[int]:
    """Run ``commands`` with at most ``slots`` at once, in order; each one's exit code."""
    with ThreadPoolExecutor(max_workers=slots) as pool:
        return list(pool.map(lambda command: subprocess.run(command).returncode, commands))


def install(lock: Path, also: Sequence[str], pip_options: Sequence[str], slots: int) -> int:
    """Install ``lock`` (and the unhashed ``also`` specs, in a pip of their own) with ``slots`` pips at once."""
    locked = pins(lock.read_text())
    python = [sys.executable, *PIP_INSTALL, *pip_options]
    with tempfile.TemporaryDirectory(prefix="install-lock-") as scratch:

        def hashed(index: int, names: Sequence[str]) -> list[str]:
            path = Path(scratch) / f"group-{index}.txt"
            path.write_text("".join(f"{locked[name]}\n" for name in names))
            return [*python, "--require-hashes", "-r", str(path)]

        if "pip" in locked and run_all([hashed(0, ["pip"])], 1) != [0]:
            return report_failure(lock, "pip")
        dealt = groups(list(locked), slots)
        commands = [hashed(index + 1, names) for index, names in enumerate(dealt)]
        commands += [[*python, spec] for spec in also]
        codes = run_all(commands, slots)
    failed = [", ".join(names) for names, code in zip([*dealt, *([spec] for spec in also)], codes) if code]
    return report_failure(lock, "; ".join(failed)) if failed else 0


def report_failure(lock: Path, what: str) -> int:
    print(
        f"error: pip could not install {what} from {lock} (its message is above). The environment holds part of "
        f"the lock; run the same command again once the cause is fixed: pip installs only what is missing.",
        file=sys.stderr,
    )
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lock", type=Path, help="a lock file of name==version pins with --hash options")
    parser.add_argument("--also", action="append", default=[], help="a spec to install without hashes (torch's)")
    parser.add_argument(
        "--processes",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="pips at once (default: the cores this process may use)",
    )
    parser.add_argument("--pip-option", action="append", default=[], help="an option for every pip (repeatable)")
    arguments = parser.parse_args(argv)
    return install(arguments.lock, arguments.also, arguments.pip_option, max(1, arguments.processes))


if __name__ == "__main__":
    sys.exit(main())
