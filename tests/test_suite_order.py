"""tests/suite_order.py: the lock's tests first, the waiting ones spread among the slow ones, the rest last."""

from __future__ import annotations

from conftest import inner_pytest_environment, run_module
from suite_order import run_order, spread


def test_the_few_are_spread_evenly_and_each_list_keeps_its_order():
    assert spread(["w1", "w2"], among=["s1", "s2", "s3", "s4"]) == ["s1", "w1", "s2", "s3", "w2", "s4"]
    assert spread(["w1"], among=[]) == ["w1"] and spread([], among=["s1"]) == ["s1"]
    many = spread([f"w{n}" for n in range(6)], among=["s1", "s2"])
    assert many[0] == "w0" and many[-1] == "w5" and [t for t in many if t[0] == "w"] == [f"w{n}" for n in range(6)]


def test_the_run_order_puts_the_lock_first_waiting_modules_between_slow_ones_and_the_rest_last():
    kinds = {"a": "slow", "r": "rest", "w": "waits", "l": "lock", "b": "slow"}
    tests = ["a::1", "r::1", "w::1", "a::2", "l::1", "w::2", "b::1", "r::2", "b::2"]
    order = run_order(tests, lambda test: kinds[test[0]], module_of=lambda test: test.split("::")[0])
    assert order == ["l::1", "a::1", "a::2", "w::1", "w::2", "b::1", "b::2", "r::1", "r::2"]


def test_the_suite_hands_out_its_waiting_tests_among_its_slow_ones():
    """The order conftest.py gives a collection of a module of each kind (PYTEST_ADDOPTS cleared: no xdist)."""
    modules = [
        "test_split.py",
        "test_train_stalls.py",
        "test_compiled_runs.py",
        "test_trainer_dpo.py",
        "test_lock.py",
    ]
    result = run_module(
        "pytest",
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
        *(f"tests/{module}" for module in modules),
        env=inner_pytest_environment(PYTEST_ADDOPTS=""),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    files = [line.split("::")[0].removeprefix("tests/") for line in result.stdout.splitlines() if "::" in line]

    slow = [position for position, name in enumerate(files) if name in ("test_compiled_runs.py", "test_trainer_dpo.py")]
    waits = [position for position, name in enumerate(files) if name == "test_train_stalls.py"]
    assert files[: files.count("test_lock.py")] == ["test_lock.py"] * files.count("test_lock.py")
    assert slow[0] < waits[0] and waits[-1] < slow[-1]  # spread among the slow tests
    assert waits == list(range(waits[0], waits[-1] + 1))  # in one piece: a run without xdist builds its fixtures once
    rest = [position for position, name in enumerate(files) if name == "test_split.py"]
    assert rest[0] > slow[-1]  # the short tests that compute close the run
