"""Where the test suite's time goes: the slowest tests and the time by file, from a JUnit XML report.

pytest's ``--durations`` lists tests but not files, and a file's time is what a shared fixture or a parallel
worker saves. Run the suite with a report, then print both tables as Markdown:

    PYTEST_ADDOPTS=--junitxml=/tmp/junit.xml make test
    python benchmarks/suite_times.py /tmp/junit.xml
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TestTime:
    """One test case of the report: its file, its node id (what pytest takes to run it again) and its seconds
    (setup, call and teardown)."""

    file: str
    node_id: str
    seconds: float


def read_report(path: Path) -> list[TestTime]:
    """Every test case of a JUnit XML report as pytest writes it: ``classname`` is the dotted module path, then
    any test classes (capitalised, as pytest collects them by default). A case of no class name (a collection
    error) is left out: it is no test and took no test time."""
    cases = []
    for case in ElementTree.parse(path).iter("testcase"):
        parts = case.get("classname", "").split(".")
        if parts == [""]:
            continue
        first_class = next((i for i, part in enumerate(parts) if part[:1].isupper()), len(parts))
        file = "/".join(parts[:first_class]) + ".py"
        node_id = "::".join([file, *parts[first_class:], case.get("name", "")])
        cases.append(TestTime(file, node_id, float(case.get("time", 0))))
    return cases


def slowest_table(cases: Sequence[TestTime], count: int) -> list[str]:
    lines = ["| seconds | test |", "| ---: | --- |"]
    for case in sorted(cases, key=lambda case: -case.seconds)[:count]:
        lines.append(f"| {case.seconds:.1f} | `{case.node_id}` |")
    return lines


def by_file_table(cases: Sequence[TestTime]) -> list[str]:
    seconds: dict[str, float] = defaultdict(float)
    tests: dict[str, int] = defaultdict(int)
    for case in cases:
        seconds[case.file] += case.seconds
        tests[case.file] += 1
    total = sum(seconds.values()) or 1.0  # a report of no timed test still prints its table
    lines = ["| seconds | share | tests | file |", "| ---: | ---: | ---: | --- |"]
    for file in sorted(seconds, key=lambda file: -seconds[file]):
        lines.append(f"| {seconds[file]:.0f} | {seconds[file] / total:.1%} | {tests[file]} | `{file}` |")
    lines.append(f"| {sum(seconds.values()):.0f} | 100% | {len(cases)} | all |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/suite_times.py", description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a JUnit XML report (pytest --junitxml)")
    parser.add_argument("--slowest", type=int, default=40, help="how many of the slowest tests (default: %(default)s)")
    args = parser.parse_args(argv)
    cases = read_report(args.report)
    print("\n".join([*slowest_table(cases, args.slowest), "", *by_file_table(cases)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
