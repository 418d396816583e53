"""benchmarks/suite_times.py: the slowest tests and the time by file, from the JUnit XML pytest writes."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO_ROOT

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4" time="31.0">
<testcase classname="tests.test_local_run" name="test_make_run" time="20.5" />
<testcase classname="tests.test_local_run.TestSummary" name="test_lines[a]" time="0.25" />
<testcase classname="tests.test_compile" name="test_yaml" time="10.0"><skipped /></testcase>
<testcase classname="tests.test_compile" name="test_spec" time="0.25" />
</testsuite></testsuites>
"""


def test_tables_rank_tests_and_sum_files_with_classes_folded_into_their_file(tmp_path):
    """A test class belongs to its file; the tables are sorted slowest first and the files add up to the whole."""
    report = tmp_path / "junit.xml"
    report.write_text(REPORT)
    result = subprocess.run(
        [sys.executable, "benchmarks/suite_times.py", str(report), "--slowest", "2"],
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
    ]
    assert by_file.splitlines()[2:] == [
        "| 21 | 66.9% | 2 | `tests/test_local_run.py` |",
        "| 10 | 33.1% | 2 | `tests/test_compile.py` |",
        "| 31 | 100% | 4 | all |",
    ]
