"""Standard benchmarks in the evaluation: lm-evaluation-harness tasks, loaded before any model runs, then
scored on each model with the same examples and settings.

A fine-tune can lower the held-out loss while the model forgets how to reason or
follow instructions; only a benchmark outside the task shows that. lm-eval is the
field's tool, so its own API does the work (``TaskManager`` loads the tasks,
``simple_evaluate`` scores an ``HFLM`` wrapped around the model the stage has
already loaded): the numbers are the ones anyone running lm-eval gets.

An entry of ``benchmark_tasks`` is a name in lm-eval's registry (a task, group
or tag; its data come from the Hub at run time), the name of a task bundled with
the pipeline (``practical_skills_mc``), or a directory of task YAMLs with their
data files (an entry holding a ``/``), for clusters without the Hub and for the
tests. Every YAML in such a directory is one task. lm-eval reads a relative
``data_files`` path against the working directory; here it is read against the
YAML's directory, which is what its author means.

A task directory is code, not data: lm-eval's YAML loader imports whatever
Python a ``!function`` tag names (a module beside the YAML, or any importable
one), and it renders the templates with Jinja, which outside a sandbox reaches
Python's internals. The evaluate pod holds the Hub write token and the
service-account token, so a directory is confined and inspected before lm-eval
sees it: it must be a relative path inside the workspace (``tasks_root``) that
stays there once symbolic links are followed, as must every YAML it includes and
every file its tasks read (``task_checks``: data files, data directories, a local
``dataset_path``, a prompts file; a URL only ``hf://`` or ``https://``); Python in
it (a ``.py`` or ``.pyc`` file, a ``!function`` tag in a YAML or one it includes,
a metric lm-eval would have the evaluate library load, a dataset's
``trust_remote_code``) is refused unless the run sets ``benchmark_allow_code``;
and templates render in Jinja's immutable sandbox (see ``sandbox_templates``)
whatever the setting. The bundled task is reached by
its name, never by a path into the image, and holds no Python.

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

import dataclasses
import difflib
import functools
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from common.errors import UserError, one_line
from components.benchmark_tasks import registry_names
from components.benchmark_tasks.task_checks import ALLOW_CODE, TaskFile, checked_config
from components.sample_data import SAMPLE_TASK, bundled_task_dir

PREFERRED_METRIC = "acc_norm"
# lm-eval's filter name for a metric computed on the unfiltered responses: its keys read "acc,none".
NO_FILTER = "none"
# On a CPU a model this large generates a few tokens a second: a generative task (ifeval: 541 prompts, up to 1,280
# new tokens each) would take days per model there, so such a list is refused rather than left to run.
CPU_GENERATION_PARAMETERS = 1_000_000_000
# A library's error about a document loses the document's values of at least this many characters (shorter
# ones, "A" or "1", would garble the message if replaced, and say little about the data).
SCRUBBED_VALUE_LENGTH = 4
# Tasks shipped with the pipeline, reached by name: ours, reviewed with the code, and free of Python.
BUNDLED_TASKS = {SAMPLE_TASK: bundled_task_dir}
# Files Python imports from a directory: lm-eval's !function loads a module beside the YAML.
PYTHON_SUFFIXES = frozenset({".py", ".pyc"})


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
    loaded: dict[str, Any] = dataclasses.field(default_factory=dict)  # task -> lm-eval's task object (its documents)


def task_entries(benchmark_tasks: str) -> list[str]:
    """The entries of a benchmark_tasks value, stripped, each once, in order."""
    return list(dict.fromkeys(entry.strip() for entry in benchmark_tasks.split(",") if entry.strip()))


def is_local(entry: str) -> bool:
    """A local task directory or a bundled task, not a registry name: lm-eval's names never hold a '/'."""
    return "/" in entry or entry in BUNDLED_TASKS


def _escape(entry: str) -> str | None:
    """How ``entry``, read as a path, leaves the directory it is relative to (None: it stays inside)."""
    if entry.startswith("~"):
        return "starts with ~ (a home directory)"
    if PurePosixPath(entry).is_absolute():
        return "is an absolute path"
    if ".." in PurePosixPath(entry).parts:
        return "climbs out with .."
    return None


def path_problem(entries: list[str]) -> str | None:
    """What is wrong with ``entries`` as paths inside the workspace, from their text alone (None: nothing).

    The first pipeline step checks this: it has no workspace mounted, so it cannot follow links, but a path that
    is absolute, starts with ~ or climbs out with .. is refused there, before anything runs. The evaluate step
    checks again and follows the links (``_task_directory``).
    """
    bad = {entry: why for entry in entries if (why := _escape(entry))}
    if not bad:
        return None
    named = "; ".join(f"{entry} {why}" for entry, why in bad.items())
    return (
        f"names task directories outside the workspace ({named}): a task directory is code the evaluate step runs "
        "in a pod holding the run's credentials, so it must be a relative path inside the workspace (the run's PVC; "
        "OUTPUT_DIR/workspace in a local run), such as tasks/mine. Copy the task there and name it so, or name the "
        f"bundled task {SAMPLE_TASK}"
    )


def registry_problem(names: list[str], manager: Any = None) -> str | None:
    """What is wrong with ``names`` as lm-eval registry names (None: each is a task, group or tag lm-eval has).

    Cheap enough for the pipeline's first step (the registry's names are indexed once per lm-eval version, see
    ``registry_names``; no data is read), so a misspelt task fails the run before training rather than after it.
    """
    if not names:
        return None
    known = manager.all_tasks if manager is not None else registry_names.known(names)
    unknown = [name for name in names if name not in known]
    if not unknown:
        return None
    close = {name: difflib.get_close_matches(name, known, n=3) for name in unknown}
    hints = "; ".join(f"{name} (did you mean {', '.join(close[name])}?)" if close[name] else name for name in unknown)
    return (
        f"names tasks lm-eval does not have: {hints}. Use lm-eval's task names (`lm-eval ls tasks` lists them), or "
        "a directory of task YAMLs (an entry with a /)"
    )


def _local_configs(entry: str, root: Path, allow_code: bool) -> list[dict[str, Any]]:
    """Each task YAML of a local directory, parsed by lm-eval's own loader, its data files made absolute.

    The directory is confined and inspected first (see the module docstring): nothing in it reaches lm-eval's
    loader before that, and without ``allow_code`` the loader is told not to resolve ``!function`` at all, so a
    file changed between the inspection and the load still imports nothing.
    """
    from lm_eval.tasks._yaml_loader import load_yaml

    directory, scope = _task_directory(entry, root)
    paths = sorted(directory.glob("*.yaml"))
    if not paths:
        raise UserError(
            f"the benchmark task directory {directory} holds no *.yaml file. A local task is an lm-eval task YAML "
            "(task, dataset_path, output_type, doc_to_text, ...) beside its data files."
        )
    code = _code_in(directory, paths, scope, entry)
    if code and not allow_code:
        raise UserError(
            f"benchmark_tasks names the task directory {entry}, which holds Python ({_some(code)}): lm-eval imports "
            "it, so a task directory with Python is code, run in the evaluate pod, which holds the Hub write token "
            "and the service-account token. Remove the Python (a task needs only its YAML and data files, with "
            f"templates for its prompts), or, if you trust everyone who can write {directory}, set {ALLOW_CODE} to "
            "true."
        )
    configs = []
    for path in paths:
        try:
            config = load_yaml(path, resolve_func=allow_code)
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
        configs.append(checked_config(config, TaskFile(path, scope, entry), allow_code))
    return configs


def _task_directory(entry: str, root: Path) -> tuple[Path, Path]:
    """The directory ``entry`` names, and the scope every file the task reads must stay in: a bundled task's own
    directory, or the workspace ``root``. A path leaving the workspace, by its text or through a symbolic link, is
    refused naming benchmark_tasks."""
    if entry in BUNDLED_TASKS:
        directory = BUNDLED_TASKS[entry]().resolve()
        return directory, directory
    problem = path_problem([entry])
    if problem:
        raise UserError(f"benchmark_tasks {problem}.")
    directory = (root / entry).resolve()
    if not directory.is_relative_to(root.resolve()):
        raise UserError(
            f"benchmark_tasks names the task directory {entry}, which a symbolic link leads out of the workspace "
            f"{root} (to {directory}): a task directory is code the evaluate step runs in a pod holding the run's "
            "credentials, so it must lie inside the workspace. Copy the task there instead of linking to it."
        )
    if not directory.is_dir():
        raise UserError(
            f"benchmark_tasks names the local task directory {entry}, but {directory} is not a directory. Put the "
            "task's YAML and data files there (on the workspace PVC for a cluster run), or fix the path."
        )
    return directory, root


def _some(found: list[str], shown: int = 3) -> str:
    """The first few of ``found``, and how many more, for a one-paragraph message."""
    more = f" and {len(found) - shown} more" if len(found) > shown else ""
    return ", ".join(found[:shown]) + more


def _code_in(directory: Path, yamls: list[Path], scope: Path, entry: str) -> list[str]:
    """The Python a task directory holds: its .py and .pyc files (at any depth), and the ``!function`` tags of its
    YAMLs and of the YAMLs they include, each named by its file relative to ``scope``."""
    files = sorted(path for path in directory.rglob("*") if path.suffix in PYTHON_SUFFIXES)
    found = [str(path.relative_to(scope.resolve())) for path in files]
    seen: set[Path] = set()
    for path in yamls:
        found += _function_tags(path, scope, seen, entry)
    return found


def _function_tags(path: Path, scope: Path, seen: set[Path], entry: str) -> list[str]:
    """Each ``!function`` tag of the YAML ``path`` and of the YAMLs it includes, found by reading them as lm-eval's
    loader does (links followed, an include read against the including file's directory) but importing nothing.

    A YAML outside ``scope`` is refused: lm-eval would read it (an include may name any path), and whoever can
    write it could change the task. Any other tag (``!!python/name``, which lm-eval's fallback loader honours)
    is refused as unreadable.
    """
    import yaml

    path = path.expanduser().resolve()
    if path in seen:  # an include cycle: lm-eval's loader names it when it loads the file
        return []
    seen.add(path)
    if not path.is_relative_to(scope.resolve()):
        raise UserError(
            f"benchmark_tasks names the task directory {entry}, whose tasks read the YAML {path}, outside the "
            f"workspace {scope} (a symbolic link or an include leads there): a task's YAMLs are code, and the "
            "evaluate step reads none from outside the workspace. Copy the file into the task directory."
        )
    tags: list[str] = []
    try:
        config = yaml.load(path.read_bytes(), Loader=_tag_recorder(tags))  # noqa: S506 - a SafeLoader subclass
    except Exception as error:  # yaml's parse errors and unknown tags, a missing file
        raise UserError(
            f"the benchmark task file {path} cannot be read ({type(error).__name__}: {one_line(error, 300)}). "
            "Fix the YAML."
        ) from None
    found = [f"{path.relative_to(scope.resolve())}: !function {tag}" for tag in tags]
    includes = config.get("include") if isinstance(config, dict) else None
    for include in includes if isinstance(includes, list) else [includes]:
        if isinstance(include, str):
            found += _function_tags(path.parent / include, scope, seen, entry)
    return found


def _tag_recorder(tags: list[str]) -> type:
    """A safe YAML loader that appends each ``!function`` tag's value to ``tags`` instead of importing it."""
    import yaml

    class Recorder(yaml.SafeLoader):
        pass

    def record(loader: yaml.SafeLoader, node: yaml.Node) -> str:
        value = str(loader.construct_scalar(node))  # type: ignore[arg-type]
        tags.append(value)
        return value

    Recorder.add_constructor("!function", record)
    return Recorder


def sandbox_templates() -> None:
    """Render lm-eval's prompt templates in Jinja's immutable sandbox, for every task in this process.

    lm-eval renders doc_to_text, doc_to_choice and doc_to_target with a plain ``jinja2.Environment``, where a
    template reaches Python's internals (``{{ cycler.__init__.__globals__.os }}``): a task YAML with no Python
    file and no ``!function`` would still run code. The sandbox refuses underscore attributes and mutating
    methods and keeps what templates are for (fields, indexing, filters, ``list.index``). lm-eval looks the
    environment up at each render, so replacing its module attribute is enough; doing it twice changes nothing.
    Its templates also keep the document's values out of their errors (``_value_free_template``): lm-eval renders
    the first document while it builds a task, and quotes its error in the step's message.
    """
    import lm_eval.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    plain = lm_eval.utils.env
    if isinstance(plain, ImmutableSandboxedEnvironment):
        return
    sandboxed = ImmutableSandboxedEnvironment(
        loader=plain.loader, undefined=plain.undefined, keep_trailing_newline=plain.keep_trailing_newline
    )
    sandboxed.filters.update(plain.filters)
    sandboxed.template_class = _value_free_template()
    lm_eval.utils.env = sandboxed


@functools.cache
def _value_free_template() -> type:
    """A Jinja template whose error, raised while rendering a document, loses the document's values (see
    ``_without_values``): ``{{ choices.index(question) }}`` would otherwise quote the question."""
    import jinja2

    class ValueFreeTemplate(jinja2.Template):
        def render(self, *args: Any, **kwargs: Any) -> str:
            try:
                return super().render(*args, **kwargs)
            except Exception as error:
                raise _scrubbed(error, dict(*args, **kwargs)) from None

    return ValueFreeTemplate


def _scrubbed(error: Exception, document: Any) -> Exception:
    """``error``, or one of its type (a ValueError where its type takes no message) without ``document``'s values."""
    message = _without_values(str(error), document)
    if message == str(error):
        return error
    try:
        return type(error)(message)
    except Exception:  # an exception type whose constructor wants more than a message
        return ValueError(message)


def _load_fix(entry: str) -> str:
    if is_local(entry):
        return "Fix the task's YAML or its data files."
    return (
        "Its data come from the Hub at run time: check that the step can reach it (HF_ENDPOINT for a mirror, HF_TOKEN "
        "for a gated dataset, HF_HUB_OFFLINE unset), or copy the task into a directory on the workspace and name that "
        "directory instead."
    )


def _first_document_renders(task: Any, name: str, entry: str) -> int:
    """The task's prompt, choices and target for its first document render; returns how many documents it has.

    The message names what failed and the type of the value, never the value: the data may be anything the task
    reads, and the message goes to the step's log (a library's message loses the document's values too).
    """
    document: Any = None
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
                        f"its target (a {type(one).__name__}) is neither an index into its {len(choices)} choices "
                        "nor one of them"
                    )
    except Exception as error:  # a template naming a missing field (jinja2), a bad index, an empty split
        raise UserError(
            f"the benchmark task {name} ({entry}) loads but cannot render its first example "
            f"({type(error).__name__}: {one_line(_without_values(str(error), document), 300)}). {_load_fix(entry)}"
        ) from None
    return len(documents)


def _without_values(message: str, document: Any) -> str:
    """``message`` with each of ``document``'s values (of SCRUBBED_VALUE_LENGTH characters or more, nested ones
    too) replaced by its field's name in angle brackets: a library's error may quote the data it choked on."""
    for field, value in _values(document):
        for text in dict.fromkeys((repr(value), str(value))):  # the quoted form first, its quotes with it
            if len(text) >= SCRUBBED_VALUE_LENGTH:
                message = message.replace(text, f"<{field}>")
    return message


def _values(value: Any, field: str = "document") -> list[tuple[str, Any]]:
    """Each value in ``value`` with the field holding it, the longest first (so a value inside another is replaced
    after it); a dict's keys name its fields, a list's items are its field's."""
    if isinstance(value, dict):
        found = [pair for key, item in value.items() for pair in _values(item, str(key))]
    elif isinstance(value, (list, tuple)):
        found = [pair for item in value for pair in _values(item, field)]
    else:
        found = []
    if value is not None and not isinstance(value, bool):
        found.append((field, value))
    return sorted(found, key=lambda pair: -len(str(pair[1])))


def load_tasks(entries: list[str], root: Path, limit: int, allow_code: bool = False) -> BenchmarkTasks:
    """Every entry loaded and its first example rendered, or a UserError naming the entry and why.

    ``root``: the workspace, where a relative task directory is and which it must stay inside; ``limit``: examples
    per task (0: all), for the counts; ``allow_code``: benchmark_allow_code, Python in a task directory allowed.
    """
    from lm_eval.tasks import TaskManager

    sandbox_templates()
    local = {entry: _local_configs(entry, root, allow_code) for entry in entries if is_local(entry)}
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
    loaded_tasks: dict[str, Any] = {}
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
                loaded_tasks[name] = task
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
    return BenchmarkTasks(tuple(specs), tuple(names), examples, tuple(generative), manager, loaded_tasks)


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
