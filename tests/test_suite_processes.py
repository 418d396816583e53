"""benchmarks/suite_processes.py: the CPU of every process a command starts, by kind, and none of any other."""

from __future__ import annotations

import shlex
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
INTERVAL = 0.05
# What a process whose parent reaps it may lose: the CPU it used after the last sample, an interval and the time a
# sample takes on a busy 2-core host.
LOSS_PER_PROCESS = 0.25


def test_descendants_and_orphans_are_counted_by_kind_and_other_processes_are_not(tmp_path):
    """The command's child and grandchild (through a shell) burn 0.6 s each as ``python -m burn``; an orphan (its
    shell ended at once) burns 0.3 s as ``python -m orphan`` and is counted whole; a process started beside the
    command is no descendant and is left out; the tool exits with the command's code."""
    for name in ("burn", "orphan"):
        (tmp_path / f"{name}.py").write_text(BURN)
    (tmp_path / "beside.py").write_text("import time\ntime.sleep(30)\n")
    python = shlex.quote(sys.executable)
    command = "; ".join(
        [
            "import subprocess, sys, time",
            "subprocess.run([sys.executable, '-m', 'burn', '0.6'], check=True)",
            f"subprocess.run(['sh', '-c', '{python} -u -m burn 0.6; true'], check=True)",
            f"subprocess.run(['sh', '-c', '{python} -m orphan 0.3 &'], check=True)",
            "time.sleep(2)",
            "sys.exit(3)",
        ]
    )
    beside = subprocess.Popen([sys.executable, "-m", "beside"], cwd=tmp_path)
    try:
        result = subprocess.run(
            [sys.executable, str(REPO_ROOT / "benchmarks" / "suite_processes.py"), "--interval", str(INTERVAL)]
            + ["--", sys.executable, "-c", command],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        beside.kill()
        beside.wait()

    assert result.returncode == 3, result.stderr
    rows = {line.split(" | ")[-1].rstrip(" |"): line.strip("| ").split(" | ") for line in result.stdout.splitlines()}
    burned, processes, _, _ = rows["python -m burn"]
    assert int(processes) == 2 and float(burned) >= 2 * (0.6 - LOSS_PER_PROCESS), result.stdout
    orphaned, processes, _, _ = rows["python -m orphan"]
    assert int(processes) == 1 and float(orphaned) >= 0.3 - 0.01, result.stdout  # sampled after it ended
    assert "python -m beside" not in rows and "sh" in rows and "python -c" in rows, result.stdout
    total = next(line for line in result.stdout.splitlines() if "all sampled" in line)
    sampled, counted = float(total.split(" | ")[0].strip("| ")), float(total.split(" of ")[1].split()[0])
    assert float(burned) + float(orphaned) <= sampled <= counted + 0.01, result.stdout


def test_kinds_name_the_module_the_worker_or_the_program():
    assert kind_of(["/venv/bin/python", "-u", "-m", "trainer", "--model", "m"]) == "python -m trainer"
    assert kind_of(["/venv/bin/python", "-X", "importtime", "-W", "ignore", "-m", "kfp.dsl.executor_main"]) == (
        "python -m kfp.dsl.executor_main"
    )
    assert kind_of(["/venv/bin/python", "-c", "import sys;exec(eval(sys.stdin.readline()))"]) == "pytest-xdist worker"
    assert kind_of(["/venv/bin/python3.11", "-c", "print(1)"]) == "python -c"
    assert kind_of(["/venv/bin/python", "/tmp/joiner.py", "0.1"]) == "python joiner.py"
    assert kind_of(["/usr/bin/llama-server", "-m", "x.gguf"]) == "llama-server"
    assert kind_of([]) == "(no command line)"
