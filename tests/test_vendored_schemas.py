"""The repository stands alone (issue 41): the schemas are vendored, unchanged, and no test reads beside the checkout.

The vendored schemas are upstream's files: their sha256 must be the ones ``tests/schemas/README.md`` records, so
an edit by hand fails here. ``tests/outside_reads.py`` fails a test that opens a file beside the repository (the
audit hook ``tests/conftest.py`` installs) and finds such paths in the sources (``paths_beside``); the tests below
show that both fail when they should and not on the paths the tests legitimately use.

This file is the one the source scan skips: proving the guards fail means naming the paths they refuse.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from conftest import REPO_ROOT, inner_pytest_environment
from crd_schemas import SCHEMAS
from outside_reads import FIX, OutsideReads, paths_beside

README_ROW = re.compile(r"^\| `(?P<name>[^`]+)` \|.*\| `(?P<sha256>[0-9a-f]{64})` \|$", re.MULTILINE)


def schema_problems(folder: Path) -> list[str]:
    """How the files in ``folder`` differ from the table of its README.md: missing, unrecorded or changed files."""
    recorded = {row["name"]: row["sha256"] for row in README_ROW.finditer((folder / "README.md").read_text())}
    present = {path.name: path for path in folder.iterdir() if path.name != "README.md"}
    problems = [f"{name} is in the README's table but not in the folder" for name in sorted(recorded.keys() - present)]
    problems += [f"{name} is not in the README's table" for name in sorted(present.keys() - recorded)]
    for name in sorted(present.keys() & recorded.keys()):
        actual = hashlib.sha256(present[name].read_bytes()).hexdigest()
        if actual != recorded[name]:
            problems.append(f"{name} has sha256 {actual}, the README records {recorded[name]}")
    return problems


def test_vendored_schemas_are_the_recorded_upstream_files():
    problems = schema_problems(SCHEMAS)
    assert not problems, (
        f"{SCHEMAS}: {'; '.join(problems)}. A vendored schema is upstream's file unchanged: to move to another "
        "release, refresh it with the command tests/schemas/README.md gives and record the release and the new "
        "sha256 in its table (sha256sum tests/schemas/*.yaml); never edit it by hand."
    )


def test_a_changed_or_unrecorded_schema_is_reported(tmp_path):
    first_copy = hashlib.sha256(b"a: 1\n").hexdigest()
    (tmp_path / "README.md").write_text(
        f"| `a.yaml` | A | a/a | v1 | `a.yaml` | `{first_copy}` |\n"
        f"| `gone.yaml` | G | g/g | v1 | `gone.yaml` | `{'0' * 64}` |\n"
    )
    (tmp_path / "a.yaml").write_text("a: 2\n")
    (tmp_path / "b.yaml").write_text("b: 1\n")

    problems = schema_problems(tmp_path)

    assert problems[:2] == [
        "gone.yaml is in the README's table but not in the folder",
        "b.yaml is not in the README's table",
    ]
    assert problems[2].startswith("a.yaml has sha256 ") and len(problems) == 3


# --- Nothing read beside the repository: the sources ------------------------------------------


THIS_FILE = Path(__file__).resolve()


def scanned_files() -> list[Path]:
    """Everything under tests/ (the vendored schemas too), the Makefile and .ci: all that runs the tests."""
    tests = [path for path in (REPO_ROOT / "tests").rglob("*") if path.is_file() and "__pycache__" not in path.parts]
    return [path for path in [*tests, REPO_ROOT / "Makefile", *(REPO_ROOT / ".ci").rglob("*")] if path != THIS_FILE]


def test_no_source_names_a_path_beside_the_repository():
    found = [
        line
        for path in scanned_files()
        for line in paths_beside(path.relative_to(REPO_ROOT), path.read_text(errors="replace"))
    ]
    assert not found, (
        f"{'; '.join(found)}: a path beside the repository ({REPO_ROOT.parent}), which a clone of it does not "
        f"have. {FIX}"
    )


def test_nothing_under_tests_links_outside_the_repository():
    """A vendored file is a copy: a symlink to the folder beside the checkout would pass the scan and the hook."""
    links = [path for path in (REPO_ROOT / "tests").rglob("*") if path.is_symlink()]
    outside = [f"{path} -> {path.resolve()}" for path in links if not path.resolve().is_relative_to(REPO_ROOT)]
    assert not outside, f"{'; '.join(outside)}: a link out of the repository, which a clone does not follow. {FIX}"


@pytest.mark.parametrize(
    ("file", "line"),
    [
        ("tests/crd_schemas.py", '    return REPO_ROOT.parent / "reference-data"'),
        ("tests/crd_schemas.py", 'crd = yaml.safe_load((REPO_ROOT / "../reference-data/schemas" / name).read_text())'),
        ("tests/fake_model_registry.py", 'SPEC = Path(__file__).resolve().parents[2] / "reference-data" / "spec.yaml"'),
        ("tests/fake_hub.py", 'ROOT = Path(__file__).parent.parent.parent / "other-checkout"'),
        ("tests/sub/helper.py", "ROOT = Path(__file__).resolve().parents[3]"),
        ("tests/crd_schemas.py", '"""Validate against the published CRD schemas in ``../reference-data/schemas``.'),
        ("Makefile", "\tcp ../reference-data/schemas/*.yaml tests/schemas/"),
        (".ci/run", "cd ../other-checkout"),
    ],
)
def test_the_scan_finds_a_path_beside_the_repository(file, line):
    assert paths_beside(Path(file), f"first line\n{line}\n") == [f"{file}:2: {line.strip()}"]


@pytest.mark.parametrize(
    ("file", "line"),
    [
        ("tests/conftest.py", "REPO_ROOT = Path(__file__).resolve().parents[1]"),
        ("tests/crd_schemas.py", 'SCHEMAS = Path(__file__).resolve().parent / "schemas"'),
        ("tests/sub/helper.py", "ROOT = Path(__file__).resolve().parents[2]"),
        ("tests/test_benchmark_task_trust.py", '("../other-run/tasks", "climbs out with ..")'),
        ("tests/test_local_model.py", "monkeypatch.setenv(CACHE_ENV_VAR, str(checkpoint.parent.parent))"),
        ("tests/crd_schemas.py", "Training Operator v1.9.0 (tests/schemas/README.md)"),
        (".ci/run", 'cd "$(dirname "$0")/.."'),
    ],
)
def test_the_scan_passes_paths_inside_the_repository_and_test_data(file, line):
    assert paths_beside(Path(file), line) == []


# --- Nothing read beside the repository: the test process -------------------------------------


@pytest.fixture
def reads(tmp_path) -> OutsideReads:
    """The guard for a repository at tmp_path/repo: tmp_path stands in for the folder the checkout sits in, with a
    virtualenv beside the checkout. Allowing that folder itself, or one above, would allow every sibling: ignored."""
    (tmp_path / "repo").mkdir()
    return OutsideReads(tmp_path / "repo", allowed=[str(tmp_path / "venv"), str(tmp_path), "/"])


def opened(reads: OutsideReads, *paths: object) -> list[str]:
    for path in paths:
        reads.audit("open", (path, "r", 0))
    return reads.take()


def test_the_hook_records_files_opened_beside_the_repository(reads, tmp_path, monkeypatch):
    beside = tmp_path / "sibling" / "schemas" / "crd.yaml"
    monkeypatch.chdir(reads.repo_root)

    assert opened(reads, str(beside)) == [str(beside)]
    assert opened(reads, bytes(beside)) == [str(beside)]
    assert opened(reads, f"{reads.repo_root}/../sibling/schemas/crd.yaml") == [str(beside)]  # pathlib keeps ".."
    assert opened(reads, "../sibling/schemas/crd.yaml") == [str(beside)]  # relative to the working directory
    assert opened(reads, f"{reads.repo_root}-other/x") == [f"{reads.repo_root}-other/x"]  # a sibling, same prefix
    assert reads.take() == []  # each report answers for its own opens


def test_the_hook_passes_files_in_the_repository_and_elsewhere(reads, tmp_path):
    (tmp_path / "into-repo").symlink_to(reads.repo_root)

    inside = [reads.repo_root, reads.repo_root / ".venv" / "lib" / "x.py", tmp_path / "into-repo" / "x"]
    tool_state = [tmp_path / "venv" / "lib" / "x.py", tmp_path / ".cache" / "huggingface" / "x", tmp_path / ".netrc"]
    elsewhere = [Path(sys.executable), "/usr/lib/x", tmp_path]  # the parent folder itself is no file beside
    assert opened(reads, *map(str, [*inside, *tool_state, *elsewhere]), 3) == []  # 3: os.fdopen's file descriptor
    reads.audit("os.listdir", (str(tmp_path / "sibling"),))
    assert reads.take() == []


def test_library_folders_count_where_the_interpreters_prefix_is_the_checkouts_parent(tmp_path):
    """A checkout at /usr/local/app with Python in /usr/local: the prefix is the parent itself, which cannot be
    allowed (every sibling would be), but its library folders by name are."""
    prefix = tmp_path / "usr-local"
    (prefix / "app").mkdir(parents=True)
    reads = OutsideReads(prefix / "app", allowed=[str(prefix), str(prefix / "lib" / "python3.12")])
    library, sibling = prefix / "lib" / "python3.12" / "json" / "__init__.py", prefix / "shared" / "x.yaml"
    assert opened(reads, str(library), str(sibling)) == [str(sibling)]


@pytest.mark.parametrize("parent", ["/", tempfile.gettempdir()], ids=["filesystem-root", "temp-directory"])
def test_a_checkout_in_the_root_or_the_temp_directory_is_not_watched_and_says_so(parent):
    """There every test's scratch files, or the system's folders, lie beside the checkout: the guard stands down
    and says why (the run's header shows it) instead of failing every tmp_path test."""
    reads = OutsideReads(Path(parent) / "main")
    assert reads.off_because == (
        f"the checkout's parent, {os.path.normpath(parent)}, is the filesystem's root or the temp directory"
    )
    assert opened(reads, os.path.join(parent, "shared", "x.yaml")) == []
    assert OutsideReads(Path(parent) / "ci" / "main").off_because is None


class NotAPath:
    def __fspath__(self) -> int:
        return 3


def test_the_hook_never_raises(reads, tmp_path, monkeypatch):
    """An exception escaping an audit hook fails the open it audits (or the import), far from the cause."""
    monkeypatch.chdir(tmp_path / "repo")
    (tmp_path / "repo").rmdir()  # os.getcwd() now raises FileNotFoundError

    assert opened(reads, "relative.txt", NotAPath()) == []


def test_a_test_opening_a_file_beside_the_repository_fails(tmp_path):
    """This conftest, as a plugin, around tests in a temporary folder: a read beside the repository in a test, in a
    fixture and at import fails each with the message; a read in the repository passes."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the temporary folder as rootdir, not this repository
    (tmp_path / "test_beside.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from conftest import REPO_ROOT

            BESIDE = REPO_ROOT.parent / f"{REPO_ROOT.name}-no-such-sibling" / "schema.yaml"


            def read_beside():
                try:
                    BESIDE.read_text()
                except FileNotFoundError:
                    pass  # opened all the same: the guard names the file, the test does not get to pass


            @pytest.fixture
            def beside():
                read_beside()


            def test_in_call():
                read_beside()


            def test_in_setup(beside):
                pass


            def test_inside():
                (REPO_ROOT / "pyproject.toml").read_text()
            """
        )
    )
    (tmp_path / "test_at_import.py").write_text("from test_beside import read_beside\n\nread_beside()\n")

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "--continue-on-collection-errors"],
        cwd=tmp_path,
        env=inner_pytest_environment(PYTHONPATH=str(REPO_ROOT / "tests")),
        capture_output=True,
        text=True,
        timeout=120,
    )

    beside = f"{REPO_ROOT.parent / f'{REPO_ROOT.name}-no-such-sibling' / 'schema.yaml'}"
    sentence = f"opened {beside}, beside the repository ({REPO_ROOT}) rather than in it"
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 1 passed, 2 errors" in result.stdout, result.stdout
    for where in (
        "test_beside.py::test_in_call (call)",
        "test_beside.py::test_in_setup (setup)",
        "collecting test_at_import.py",
    ):
        assert f"{where} {sentence}" in result.stdout, result.stdout
    assert FIX in result.stdout
