"""Install a hashed lock file into this interpreter's environment: pip, in as many processes as there are cores.

    python tools/install_lock.py requirements.lock --also "torch==2.13.0"

pip installs one wheel after the other on one core, and most of a clean clone's install is that core unpacking
and byte-compiling: `make install` of requirements.lock and torch took 147 and 152 s on a 2-core CI host while the
other core idled, and 79 s with two pips (docs/contributing.md, "Where the suite's time goes"). The lock is split
into parts, one per core, each installed by its own pip with ``--require-hashes --no-deps``: what is installed is
still exactly the lock, each pin in exactly one part and every file checked against its hashes.

pip does not lock an environment against another pip, so two of them must never write the same file. Distributions
of one family (the names that share their first word: mlflow, mlflow-skinny and mlflow-tracing ship the same modules)
go to one part. That is a guess at which distributions share files, and tests/test_install_lock.py backs it: in the
installed environment, only distributions of one family share a file. pip and setuptools are installed first, alone:
the other pips run pip, and every interpreter that starts reads setuptools' ``.pth`` file.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==\S")
# Installed before the others and alone: what the other pips run, or read as they start.
FIRST = ("pip", "setuptools")


class LockError(ValueError):
    """A lock file this script cannot install exactly."""


def pins(lock_text: str, source: str) -> dict[str, str]:
    """Each pin of a lock file by its canonical name: its ``name==version`` line with its markers and hashes.

    Anything else but comments and blank lines is refused rather than skipped: a line left out would be a package
    left out, and the environment would no longer be the lock.
    """
    found: dict[str, str] = {}
    entry, first_line = "", 0
    for number, line in enumerate(lock_text.splitlines(), start=1):
        if not entry:
            first_line = number
        entry += line.removesuffix("\\") + " "
        if line.endswith("\\"):
            continue
        text, entry = " ".join(entry.split()), ""
        if not text or text.startswith("#"):
            continue
        match = PIN.match(text)
        if not match:
            raise LockError(f"{source}, line {first_line}: {text[:80]!r} is not a name==version pin")
        name = canonical(match[1])
        if name in found:
            raise LockError(f"{source}, line {first_line}: {name} is pinned twice")
        found[name] = text
    if not found:
        raise LockError(f"{source} holds no name==version pin")
    return found


def canonical(name: str) -> str:
    """PEP 503's normalised name (``packaging.utils.canonicalize_name``'s, which a new venv does not hold yet)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def family(name: str) -> str:
    """The first word of a canonical name: distributions of one family may ship the same files."""
    return name.split("-")[0]


def parts(names: Sequence[str], count: int) -> list[list[str]]:
    """``names`` (but those of ``FIRST``) dealt into ``count`` parts, a family at a time and in name order, so that
    a family is in one part."""
    families: dict[str, list[str]] = {}
    for name in sorted(set(names) - set(FIRST)):
        families.setdefault(family(name), []).append(name)
    dealt: list[list[str]] = [[] for _ in range(count)]
    for index, members in enumerate(families.values()):
        dealt[index % count].extend(members)
    return [part for part in dealt if part]


def install(lock: Path, also: Sequence[str], pip_options: Sequence[str], processes: int) -> int:
    """Install ``lock``, and the unhashed ``also`` specs in pips of their own, with ``processes`` pips at once."""
    locked = pins(lock.read_text(), str(lock))
    pip_install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *pip_options]
    with tempfile.TemporaryDirectory(prefix="install-lock-") as scratch:

        def hashed(index: int, names: Sequence[str]) -> list[str]:
            requirements = Path(scratch) / f"part-{index}.txt"
            requirements.write_text("".join(f"{locked[name]}\n" for name in names))
            return [*pip_install, "--require-hashes", "-r", str(requirements)]

        first = [name for name in FIRST if name in locked]
        if first and subprocess.run(hashed(0, first)).returncode:
            return failed(f"{', '.join(first)} from {lock}", "Nothing else was installed")
        # The unhashed specs first: torch's is the largest wheel, and a part can start beside it.
        steps = [(spec, [*pip_install, spec]) for spec in also]
        steps += [
            (f"{', '.join(names)} from {lock}", hashed(index, names))
            for index, names in enumerate(parts(locked, processes), 1)
        ]
        with ThreadPoolExecutor(max_workers=processes) as pool:
            codes = list(pool.map(lambda step: subprocess.run(step[1]).returncode, steps))
    not_installed = [what for (what, _), code in zip(steps, codes) if code]
    return failed("; ".join(not_installed), "Everything else is installed") if not_installed else 0


def failed(what: str, rest: str) -> int:
    """Say what pip could not install, what ``rest`` of the lock is, and how to go on; a failed install's status."""
    print(
        f"error: pip could not install {what} (pip's message above says why). {rest}; once the cause is fixed, run "
        "the same command again (`make install`): pip installs only what is missing.",
        file=sys.stderr,
    )
    return 1


def cores() -> int:
    """The cores this process may run on (where the platform says), else the machine's."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lock", type=Path, help="a lock file of name==version pins with --hash options")
    parser.add_argument("--also", action="append", default=[], help="a spec to install without hashes (torch's)")
    parser.add_argument("--processes", type=int, default=cores(), help="pips at once (default: the cores)")
    parser.add_argument("--pip-option", action="append", default=[], help="an option for every pip (repeatable)")
    arguments = parser.parse_args(argv)
    if not arguments.lock.is_file():
        parser.error(f"{arguments.lock} is not a file: name the lock to install (make install: requirements.lock)")
    try:
        return install(arguments.lock, arguments.also, arguments.pip_option, max(1, arguments.processes))
    except LockError as error:
        parser.error(f"{error}. Write the lock with `make lock`, which pins every package with its hashes.")


if __name__ == "__main__":
    sys.exit(main())
