"""benchmarks/suite_processes.py: the CPU of every process a command starts, by kind, and none of any other."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from suite_processes import kind_of  # noqa: E402 (benchmarks/ is scripts, not a package)

BURN = """
import sys, time
started = time.process_time()
while time.process_time() - started < float(sys.argv[1]):
    pass
"""


def test_descendants_are_counted_by_kind_and_other_processes_are_not(tmp_path):
    """The command's child and grandchild (through a shell) burn CPU as ``python -m burn``; a burner started beside
    the command is no descendant and is left out; the tool exits with the command's code."""
    (tmp_path / "burn.py").write_text(BURN)
    (tmp_path / "beside.py").write_text(BURN)
    beside = subprocess.Popen([sys.executable, "-m", "beside", "3"], cwd=tmp_path)
    command = (
        "import subprocess, sys; "
        "subprocess.run([sys.executable, '-m', 'burn', '0.6'], check=True); "
        "subprocess.run(['sh', '-c', sys.executable + ' -u -m burn 0.6'], check=True); "
        "sys.exit(3)"
    )
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "suite_processes.py"), "--", sys.executable, "-c", command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    beside.wait(timeout=60)

    assert result.returncode == 3, result.stderr
    rows = {line.split(" | ")[-1].rstrip(" |"): line.strip("| ").split(" | ") for line in result.stdout.splitlines()}
    cpu_seconds, processes, _, _ = rows["python -m burn"]
    assert int(processes) == 2 and float(cpu_seconds) >= 2 * 0.6 - 0.2 * 2  # each loses at most one interval
    assert "python -m beside" not in rows and "sh" in rows and "python -c" in rows
    total = next(line for line in result.stdout.splitlines() if "all sampled" in line)
    sampled, counted = float(total.split(" | ")[0].strip("| ")), float(total.split(" of ")[1].split()[0])
    assert 1.0 <= sampled <= counted + 0.05


def test_kinds_name_the_module_the_worker_or_the_program():
    assert kind_of(["/venv/bin/python", "-u", "-m", "trainer", "--model", "m"]) == "python -m trainer"
    assert kind_of(["/venv/bin/python", "-c", "import sys;exec(eval(sys.stdin.readline()))"]) == "pytest-xdist worker"
    assert kind_of(["/venv/bin/python3.11", "-c", "print(1)"]) == "python -c"
    assert kind_of(["/venv/bin/python", "/tmp/joiner.py", "0.1"]) == "python joiner.py"
    assert kind_of(["/usr/bin/llama-server", "-m", "x.gguf"]) == "llama-server"
    assert kind_of([]) == "(no command line)"
