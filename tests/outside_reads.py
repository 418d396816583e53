"""Catch a test opening a file beside the repository (a sibling checkout, a folder of reference data) instead of
one inside it.

A clone of the repository is all CI and a contributor have: a test that reads ``<sibling>/...`` in the repository's
parent directory passes only on machines that happen to have that sibling, and against whatever it holds there. So
``tests/conftest.py`` installs ``OutsideReads.audit`` with ``sys.addaudithook`` and fails the test during which
a file in the repository's parent directory, but not in the repository, was opened. The ``open`` audit event
comes from ``open()``, ``os.open`` and the imports' ``io.open_code``, before the file is opened: opening a sibling
that is absent is caught too, and named, instead of surfacing as a bare FileNotFoundError.

Two kinds of entries beside the repository are not siblings and pass: the interpreter's own folders (a virtualenv
made beside the checkout), and hidden ones: with the checkout in a home directory they are the user's tool state
(``~/.cache`` with the Hugging Face and model caches, ``~/.netrc``, ``~/.pyenv``), and a checkout or a folder of
data is not hidden.

The hook runs for every file the test process opens (thousands of imports), so it compares strings only; a hit,
which should never happen, is resolved (a link into the repository is fine) when it is reported. Subprocesses a
test starts are not covered, so ``paths_beside`` finds such paths in the sources as well, for
``tests/test_vendored_schemas.py`` to fail on.
"""

from __future__ import annotations

import os
import re
import site
import sys
import sysconfig
import tempfile
from collections.abc import Iterable
from pathlib import Path

FIX = (
    "Vendor the file under tests/ (as tests/schemas holds the CRD and API schemas, with where each came from in "
    "tests/schemas/README.md) and read it from there."
)


def interpreter_dirs() -> list[str]:
    """The folders this interpreter reads its standard library and packages from, wherever they are: its
    prefixes, and their library folders by name, which still count where a prefix is the repository's parent
    itself (a checkout at /usr/local/app, with Python in /usr/local)."""
    prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    libraries = [sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")]
    return [*prefixes, *libraries, *site.getsitepackages(), site.getusersitepackages()]


class OutsideReads:
    """The files opened under ``repo_root.parent`` but outside ``repo_root`` since the last ``take()``, less the
    hidden entries there and the ``allowed`` folders."""

    def __init__(self, repo_root: Path, allowed: Iterable[str] = ()) -> None:
        self.repo_root = repo_root
        self._inside = os.path.join(str(repo_root), "")
        parent = str(repo_root.parent)
        # In the filesystem's root or the temp directory, what lies beside the checkout is the system's folders or
        # every test's scratch files (tmp_path, mkdtemp), which the guard cannot tell from a sibling checkout.
        shared_parents = {repo_root.anchor, os.path.normpath(tempfile.gettempdir())}
        self.off_because = (
            f"the checkout's parent, {parent}, is the filesystem's root or the temp directory"
            if parent in shared_parents
            else None
        )
        self._beside = os.path.join(parent, "")
        folders = {os.path.join(os.path.normpath(folder), "") for folder in allowed}
        self._allowed = tuple(
            folder for folder in folders if folder.startswith(self._beside) and folder != self._beside
        )
        self._opened: list[str] = []

    def _in_repository(self, path: str) -> bool:
        return f"{path}{os.sep}".startswith(self._inside)  # the root itself too

    def audit(self, event: str, args: tuple) -> None:
        """The audit hook: records the path of an ``open`` event, normalised, that lies beside the repository."""
        if event != "open" or self.off_because or not isinstance(args[0], (str, bytes, os.PathLike)):
            return  # other events, and os.fdopen's file descriptors
        try:
            path = os.fsdecode(args[0])
            if not os.path.isabs(path):  # os.getcwd() only here: a syscall, and absolute paths are the rule
                path = os.path.join(os.getcwd(), path)
            path = os.path.normpath(path)  # REPO_ROOT / ".." / "x" climbs out too
        except (OSError, TypeError, ValueError):  # a deleted working directory, a bad path-like: open says so
            return  # an exception escaping an audit hook would fail the open it audits, or crash an import
        if (
            path.startswith(self._beside)
            and not self._in_repository(path)
            and not path.startswith(".", len(self._beside))
            and not path.startswith(self._allowed)
        ):
            self._opened.append(path)

    def take(self) -> list[str]:
        """The files opened beside the repository since the last call, each once, less those that resolve into it
        (a symlink beside the repository that points back in)."""
        opened, self._opened = self._opened, []
        return sorted({path for path in opened if not self._in_repository(os.path.realpath(path))})

    def message(self, where: str, paths: list[str]) -> str:
        """One paragraph: what opened which files, why that is wrong, and the fix."""
        return (
            f"{where} opened {', '.join(paths)}, beside the repository ({self.repo_root}) rather than in it: a clone "
            f"of the repository does not have it, so the test passes only on machines that happen to. {FIX}"
        )


NAMED_IN_PROSE = re.compile(r"`\.\./")  # a path in backquotes starting with ../: a docstring naming a sibling
# the root's parent(s), or a ../ string joined to it
FROM_ROOT = re.compile(r"\bREPO_ROOT\b(?:\.parents?\b|.*[\"']\.\./)")
FROM_FILE = re.compile(r"__file__\W.*?\.(?:parents\[(\d+)\]|(parent(?:\.parent)*)\b)")
CLIMB = re.compile(r"(?:^|[\s\"'=:(])\.\./")  # in the Makefile and .ci, which run in the repository root


def _climbs_out(relative: Path, line: str) -> bool:
    """Whether ``line`` of the Python file at ``relative`` climbs from its ``__file__`` past the repository root:
    ``parents[k]`` and ``.parent`` k + 1 times go up k + 1 folders, and the root is len(relative.parts) up."""
    match = FROM_FILE.search(line)
    if not match:
        return False
    levels = int(match[1]) + 1 if match[1] else match[2].count("parent")
    return levels > len(relative.parts)


def paths_beside(relative: Path, text: str) -> list[str]:
    """The lines of the file at ``relative`` (in the repository) that name a path beside the repository, as
    ``file:line: text``: a sibling folder named in backquotes, a path built from ``REPO_ROOT``'s parent or with
    a "../" joined to it, one climbing past the root from a Python file's ``__file__``, or, in the Makefile and
    .ci (which run in the root), any relative path starting with "../".

    Static, for what the audit hook cannot see: a path a subprocess reads (the fake Model Registry's spec), or a
    test not run here. Test data that merely holds a "../" path (one a stage must refuse) is not flagged."""
    runs_in_root = relative.parts[0] in ("Makefile", ".ci")
    return [
        f"{relative}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), start=1)
        if NAMED_IN_PROSE.search(line)
        or FROM_ROOT.search(line)
        or (relative.suffix == ".py" and _climbs_out(relative, line))
        or (runs_in_root and CLIMB.search(line))
    ]
