"""benchmarks/suite_times.py: the slowest tests and the time by file, from the JUnit XML pytest writes."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from suite_times import read_report  # noqa: E402 (benchmarks/ is scripts, not a package)

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4" time="31.0">
<testcase classname="tests.test_local_run" name="test_make_run" time="20.5" />
<testcase classname="tests.test_local_run.TestSummary" name="test_lines[a]" time="0.25" />
<testcase classname="tests.test_compile" name="test_yaml" time="10.0"><skipped /></testcase>
<testcase classname="tests.test_compile" name="test_spec" time="0.25" />
<testcase classname="tests.test_compile.TestA.TestB" name="test_y[a.b-1]" time="0.0" />
<testcase classname="" name="tests.test_broken" time="0.0"><error message="collection failure" /></testcase>
</testsuite></testsuites>
"""


def test_tables_rank_tests_and_sum_files_with_classes_folded_into_their_file(tmp_path):
    """A test class belongs to its file and is part of the node id; the tables are sorted slowest first and the
    files add up to the whole; a collection error is no test."""
    report = tmp_path / "junit.xml"
    report.write_text(REPORT)
    result = subprocess.run(
        [sys.executable, "benchmarks/suite_times.py", str(report), "--slowest", "3"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    slowest, by_file = result.stdout.split("\n\n")
    assert slowest.splitlines()[2:] == [
        "| 20.5 | `tests/test_local_run.py::test_make_run` |",
        "| 10.0 | `tests/test_compile.py::test_yaml` |",
        "| 0.2 | `tests/test_local_run.py::TestSummary::test_lines[a]` |",
    ]
    assert read_report(report)[-1].node_id == "tests/test_compile.py::TestA::TestB::test_y[a.b-1]"
    assert by_file.splitlines()[2:] == [
        "| 21 | 66.9% | 2 | `tests/test_local_run.py` |",
        "| 10 | 33.1% | 3 | `tests/test_compile.py` |",
        "| 31 | 100% | 5 | all |",
    ]
