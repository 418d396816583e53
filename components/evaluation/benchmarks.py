"""Standard benchmarks in the evaluation: lm-evaluation-harness tasks, loaded before any model runs, then
scored on each model with the same examples and settings.

A fine-tune can lower the held-out loss while the model forgets how to reason or
follow instructions; only a benchmark outside the task shows that. lm-eval is the
field's tool, so its own API does the work (``TaskManager`` loads the tasks,
``simple_evaluate`` scores an ``HFLM`` wrapped around the model the stage has
already loaded): the numbers are the ones anyone running lm-eval gets.

An entry of ``benchmark_tasks`` is either a name in lm-eval's registry (a task,
group or tag; its data come from the Hub at run time) or a directory of task
YAMLs with their data files (an entry holding a ``/``), for clusters without the
Hub and for the tests. Every YAML in such a directory is one task. lm-eval reads
a relative ``data_files`` path against the working directory; here it is read
against the YAML's directory, which is what its author means.

Every task is loaded, and its first document rendered, before any model is
scored, so an unknown name, a missing file, a broken template, a group without a
score of its own or a task listed twice stops the step in seconds with the task's
name, not after the first model's hour. (``simple_evaluate`` loads the tasks again
for each model, from the datasets cache; only the ``TaskManager`` is shared.)

Each task is judged on one number, its main metric: ``acc_norm`` where the task
reports it (arc, hellaswag: length-normalised accuracy, as the Open LLM
Leaderboard reports them), else the first metric it reports (the first of its
``metric_list``), with the standard error lm-eval gives beside it.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import UserError, one_line

PREFERRED_METRIC = "acc_norm"
# lm-eval's filter name for a metric computed on the unfiltered responses: its keys read "acc,none".
NO_FILTER = "none"
# On a CPU a model this large generates a few tokens a second: a generative task (ifeval: 541 prompts, up to 1,280
# new tokens each) would take days per model there, so such a list is refused rather than left to run.
CPU_GENERATION_PARAMETERS = 1_000_000_000


@dataclass(frozen=True)
class BenchmarkSettings:
    """What every model is scored with: the same for each, so their numbers compare."""

    limit: int  # examples per task; 0: all
    num_fewshot: int
    batch_size: int


@dataclass(frozen=True)
class BenchmarkTasks:
    """The loaded tasks: what lm-eval is given for each model, and the rows of the report."""

    specs: tuple[str | dict[str, Any], ...]  # registry names and local task configs, as lm-eval takes them
    names: tuple[str, ...]  # one per row: a task, or a group with its aggregate score
    examples: dict[str, int]  # task -> examples scored per model (after the limit)
    generative: tuple[str, ...]  # the tasks that generate text, not only score choices
    manager: Any  # lm_eval.tasks.TaskManager, shared by every model's simple_evaluate


def is_local(entry: str) -> bool:
    """A local task directory, not a registry name: lm-eval's names never hold a '/'."""
    return "/" in entry


@functools.cache
def _registry_names() -> tuple[str, ...]:
    """Every task, group and tag name in lm-eval's registry, indexed once per process (seconds on two cores)."""
    from lm_eval.tasks import TaskManager

    return tuple(TaskManager().all_tasks)


def registry_problem(names: list[str], manager: Any = None) -> str | None:
    """What is wrong with ``names`` as lm-eval registry names (None: each is a task, group or tag lm-eval has).

    Cheap enough for the pipeline's first step (indexing the registry takes seconds, no data is read), so a
    misspelt task fails the run before training rather than after it.
    """
    if not names:
        return None
    known = manager.all_tasks if manager is not None else _registry_names()
    unknown = [name for name in names if name not in known]
    if not unknown:
        return None
    close = {name: difflib.get_close_matches(name, known, n=3) for name in unknown}
    hints = "; ".join(f"{name} (did you mean {', '.join(close[name])}?)" if close[name] else name for name in unknown)
    return (
        f"names tasks lm-eval does not have: {hints}. Use lm-eval's task names (`lm-eval ls tasks` lists them), or "
        "a directory of task YAMLs (an entry with a /)"
    )


def _local_configs(entry: str, root: Path) -> list[dict[str, Any]]:
    """Each task YAML of a local directory, parsed by lm-eval's own loader, its data files made absolute."""
    from lm_eval.tasks._yaml_loader import load_yaml

    directory = (root / Path(entry).expanduser()).resolve()
    if not directory.is_dir():
        raise UserError(
            f"benchmark_tasks names the local task directory {entry}, but {directory} is not a directory. Put the "
            "task's YAML and data files there (on the workspace PVC for a cluster run), or fix the path."
        )
    paths = sorted(directory.glob("*.yaml"))
    if not paths:
        raise UserError(
            f"the benchmark task directory {directory} holds no *.yaml file. A local task is an lm-eval task YAML "
            "(task, dataset_path, output_type, doc_to_text, ...) beside its data files."
        )
    configs = []
    for path in paths:
        try:
            config = load_yaml(path)
        except Exception as error:  # yaml's parse errors, a missing include or !function module
            raise UserError(
                f"the benchmark task file {path} cannot be read ({type(error).__name__}: {one_line(error, 300)}). "
                "Fix the YAML."
            ) from None
        if not isinstance(config.get("task"), str) or "group" in config:
            raise UserError(
                f"{path} is not an lm-eval task YAML: it needs a 'task' name (groups are not read from a local "
                "directory; list each task's directory instead)."
            )
        configs.append(_absolute_data_files(config, path.parent))
    return configs


def _absolute_data_files(config: dict[str, Any], directory: Path) -> dict[str, Any]:
    """``config`` with each relative ``dataset_kwargs.data_files`` path read against the YAML's directory."""
    files = (config.get("dataset_kwargs") or {}).get("data_files")
    if files is None:
        return config

    def absolute(value: Any) -> Any:
        if isinstance(value, str):
            return str(directory / value) if "://" not in value else value
        if isinstance(value, list):
            return [absolute(item) for item in value]
        if isinstance(value, dict):
            return {key: absolute(item) for key, item in value.items()}
        return value

    return {**config, "dataset_kwargs": {**config["dataset_kwargs"], "data_files": absolute(files)}}


def _load_fix(entry: str) -> str:
    if is_local(entry):
        return "Fix the task's YAML or its data files."
    return (
        "Its data come from the Hub at run time: check that the step can reach it (HF_ENDPOINT for a mirror, HF_TOKEN "
        "for a gated dataset, HF_HUB_OFFLINE unset), or copy the task into a directory on the workspace and name that "
        "directory instead."
    )


def _first_document_renders(task: Any, name: str, entry: str) -> int:
    """The task's prompt, choices and target for its first document render; returns how many documents it has."""
    try:
        documents = task.eval_docs  # a datasets.Dataset or a list: counted and indexed, never copied
        if not len(documents):
            raise ValueError("its evaluation split holds no documents")
        document = documents[0]
        task.doc_to_text(document)
        target = task.doc_to_target(document)
        if task.OUTPUT_TYPE == "multiple_choice":
            choices = task.doc_to_choice(document)
            for one in target if isinstance(target, list) else [target]:
                if not (isinstance(one, int) and 0 <= one < len(choices)) and one not in choices:
                    raise ValueError(
                        f"its target {one!r} is neither an index into its {len(choices)} choices nor one of them"
                    )
    except Exception as error:  # a template naming a missing field (jinja2), a bad index, an empty split
        raise UserError(
            f"the benchmark task {name} ({entry}) loads but cannot render its first example "
            f"({type(error).__name__}: {one_line(error, 300)}). {_load_fix(entry)}"
        ) from None
    return len(documents)


def load_tasks(entries: list[str], root: Path, limit: int) -> BenchmarkTasks:
    """Every entry loaded and its first example rendered, or a UserError naming the entry and why.

    ``root``: where a relative task directory is; ``limit``: examples per task (0: all), for the counts.
    """
    from lm_eval.tasks import TaskManager

    local = {entry: _local_configs(entry, root) for entry in entries if is_local(entry)}
    named = [entry for entry in entries if not is_local(entry)]
    # Indexing lm-eval's registry reads thousands of YAMLs: only when a registry name needs it.
    manager = TaskManager(include_defaults=bool(named))
    problem = registry_problem(named, manager)
    if problem:
        raise UserError(f"benchmark_tasks {problem}.")
    specs: list[str | dict[str, Any]] = []
    names: list[str] = []
    examples: dict[str, int] = {}
    generative: list[str] = []
    listed_by: dict[str, str] = {}  # task -> the entry that brought it, to refuse a task listed twice
    for entry in entries:
        for spec in local.get(entry, [entry]):
            try:
                loaded = manager.load([spec])
            except Exception as error:  # lm-eval and datasets raise many types for a task that cannot load
                label = f"{spec['task']} ({entry})" if isinstance(spec, dict) else entry
                raise UserError(
                    f"the benchmark task {label} cannot be loaded ({type(error).__name__}: {one_line(error, 300)}). "
                    f"{_load_fix(entry)}"
                ) from None
            for name, task in loaded["tasks"].items():
                if name in listed_by:
                    raise UserError(
                        f"benchmark_tasks lists the task {name} twice: in {listed_by[name]} and in {entry} (a group "
                        "or tag holds its tasks). Keep one of them."
                    )
                listed_by[name] = entry
                count = _first_document_renders(task, name, entry)
                examples[name] = min(count, limit) if limit else count
                if task.OUTPUT_TYPE == "generate_until":
                    generative.append(name)
            group = loaded["groups"].get(spec) if isinstance(spec, str) else None
            if group is not None and not group.has_aggregation:
                raise UserError(
                    f"the benchmark group {spec} has no score of its own (no aggregate_metric_list), so it cannot be "
                    f"gated on. Name its tasks in benchmark_tasks instead: {', '.join(loaded['tasks'])}."
                )
            if group is not None:
                examples[spec] = sum(examples[name] for name in loaded["tasks"])
            names += [spec] if group is not None else list(loaded["tasks"])
            specs.append(spec)
    return BenchmarkTasks(tuple(specs), tuple(names), examples, tuple(generative), manager)


def check_placement(tasks: BenchmarkTasks, on_gpu: bool, parameters: int, model: str) -> None:
    """Refuse generative tasks for a large model on a CPU, where they would run for days (see the constant)."""
    if on_gpu or not tasks.generative or parameters <= CPU_GENERATION_PARAMETERS:
        return
    raise UserError(
        f"the benchmark tasks {', '.join(tasks.generative)} generate text, and this evaluation runs on the CPU with "
        f"{model} ({parameters / 1e9:.1f}B parameters), which generates a few tokens a second there: they would "
        "take days. Give the training pods GPUs (gpus_per_node) so the evaluate step gets one, or keep to "
        "multiple-choice tasks (arc_easy, hellaswag) in benchmark_tasks."
    )


def score(model: Any, tokenizer: Any, tasks: BenchmarkTasks, settings: BenchmarkSettings) -> dict[str, dict]:
    """Each task's main metric for ``model``, scored by lm-eval on the loaded model: task -> entry for
    evaluation.json (metric, value, stderr, higher_is_better, examples)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    # No max_length: lm-eval takes the model's own context length, as its command line does, so generative tasks
    # keep room for their max_gen_toks and long few-shot prompts are not cut.
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=settings.batch_size)
    results = simple_evaluate(
        model=lm,
        tasks=list(tasks.specs),
        task_manager=tasks.manager,
        num_fewshot=settings.num_fewshot,
        limit=settings.limit or None,
        log_samples=False,
    )
    return {name: main_metric(results, name, tasks.examples.get(name)) for name in tasks.names}


def main_metric(results: dict[str, Any], name: str, examples: int | None) -> dict[str, Any]:
    """The task's main metric from ``simple_evaluate``'s results (see the module docstring for which)."""
    reported = results["results"][name]
    metrics = [key.split(",", 1)[0] for key in reported if "," in key and "_stderr," not in key]
    if not metrics:
        raise UserError(f"lm-eval reports no score for {name}. Name its tasks in benchmark_tasks instead.")
    metric = PREFERRED_METRIC if PREFERRED_METRIC in metrics else metrics[0]
    key = next(key for key in reported if key.split(",", 1)[0] == metric)
    filter_name = key.split(",", 1)[1]
    stderr = reported.get(f"{metric}_stderr,{filter_name}")
    higher = results.get("higher_is_better", {}).get(name, {}).get(metric, True)
    if higher is None:  # a group whose tasks disagree on the metric's direction
        raise UserError(
            f"lm-eval reports no direction for {name}'s {metric} (its tasks disagree on whether higher is better). "
            "Name its tasks in benchmark_tasks instead."
        )
    samples = results.get("n-samples", {}).get(name, {}).get("effective", examples)
    return {
        "metric": metric if filter_name == NO_FILTER else f"{metric} ({filter_name})",
        "value": float(reported[key]),
        "stderr": float(stderr) if isinstance(stderr, (int, float)) else None,
        "higher_is_better": bool(higher),
        "examples": samples,
    }
