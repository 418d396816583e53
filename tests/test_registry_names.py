"""lm-eval's registry names are indexed once per lm-eval version and trusted only to say a name exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import lm_eval.tasks
import pytest
from conftest import REPO_ROOT

from components.benchmark_tasks import registry_names
from components.benchmark_tasks.tasks import registry_problem
from components.local_model import CACHE_ENV_VAR


class CountingTaskManager:
    """Stands in for lm-eval's TaskManager, whose real index takes seconds: counts the indexes made."""

    made = 0

    def __init__(self) -> None:
        CountingTaskManager.made += 1
        self.all_tasks = ["arc_easy", "hellaswag", "mmlu"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", CountingTaskManager)
    CountingTaskManager.made = 0
    registry_names._indexed.cache_clear()
    yield registry_names.saved_index_path()
    registry_names._indexed.cache_clear()


def test_a_later_process_reads_the_saved_names_instead_of_indexing(cache):
    assert registry_problem(["arc_easy"]) is None and CountingTaskManager.made == 1
    assert json.loads(cache.read_text()) == ["arc_easy", "hellaswag", "mmlu"]
    assert cache.stat().st_mode & 0o777 == 0o644  # readable by everyone who shares the cache
    registry_names._indexed.cache_clear()  # as in a new process
    assert registry_problem(["hellaswag", "mmlu"]) is None and CountingTaskManager.made == 1


def test_a_name_the_saved_index_lacks_is_looked_up_afresh_before_it_is_refused(cache):
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps(["hellaswag"]))  # saved before arc_easy existed
    assert registry_problem(["arc_easy"]) is None and CountingTaskManager.made == 1
    assert "arc_eazy" in registry_problem(["arc_eazy"]) and CountingTaskManager.made == 1  # once per process
    assert json.loads(cache.read_text()) == ["arc_easy", "hellaswag", "mmlu"]


@pytest.mark.parametrize("saved", ["not json", '{"arc_easy": 1}', "[1, 2]"])
def test_a_damaged_saved_index_is_replaced(cache, saved):
    cache.parent.mkdir(parents=True)
    cache.write_text(saved)
    assert registry_problem(["mmlu"]) is None and CountingTaskManager.made == 1
    assert json.loads(cache.read_text()) == ["arc_easy", "hellaswag", "mmlu"]


def test_a_cache_that_cannot_be_written_costs_time_and_says_so(tmp_path, cache, monkeypatch, capsys):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv(CACHE_ENV_VAR, str(blocked))  # the cache root is a file: nothing can be made below it
    assert registry_problem(["mmlu"]) is None and registry_problem(["arc_easy"]) is None
    assert CountingTaskManager.made == 1  # indexed once in this process all the same
    assert (
        f"note: lm-eval's task names were not saved to {registry_names.saved_index_path()}" in capsys.readouterr().err
    )


def test_the_real_index_is_saved_under_lm_evals_version(tmp_path):
    """lm-eval's own TaskManager in a process of its own saves its names; a second process, which could not index
    (its TaskManager is gone), checks names against them."""
    env = {**os.environ, CACHE_ENV_VAR: str(tmp_path)}
    check = "from components.benchmark_tasks.tasks import registry_problem; print(registry_problem(['arc_easy']))"
    for prelude in ("", "import lm_eval.tasks; lm_eval.tasks.TaskManager = None; "):
        result = subprocess.run(
            [sys.executable, "-c", prelude + check], cwd=REPO_ROOT, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0 and result.stdout == "None\n", result.stderr
    (saved,) = (tmp_path / "lm-eval").glob("registry-names-*.json")
    assert saved.name == f"registry-names-{metadata.version('lm_eval')}.json"
    assert {"arc_easy", "hellaswag"} <= set(json.loads(saved.read_text()))
