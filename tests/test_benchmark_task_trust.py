"""A benchmark task directory is code: where it may be, and when Python in it may run.

The evaluate pod holds the Hub write token and the service-account token, and lm-eval imports whatever a
``!function`` tag names and renders templates with Jinja. So a task directory must be a relative path inside the
workspace (refused by the first step when its text says otherwise, by the evaluate step when a link leads out),
Python in it is refused unless ``benchmark_allow_code`` is set, and templates render in Jinja's sandbox. Real
directories, real links, lm-eval's own loader; no model runs (test_evaluate_stage.py runs the stage end to end).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from common.errors import UserError
from components.benchmark_tasks.tasks import load_tasks
from components.evaluate.options import EvaluateOptions
from components.run_form.checks import problems
from components.sample_data import SAMPLE_TASK, bundled_task_dir

TASK_YAML = f"{SAMPLE_TASK}.yaml"
# Imported only if lm-eval resolves the tag: the marker file says whether any of it ran.
UTILS = """from pathlib import Path

Path(__file__).with_name("imported").write_text("utils.py ran")


def first_ten(dataset):
    return dataset.select(range(10))
"""


@pytest.fixture
def workspace(tmp_path) -> Path:
    """A workspace holding a copy of the bundled task at tasks/mine."""
    root = tmp_path / "workspace"
    shutil.copytree(bundled_task_dir(), root / "tasks" / "mine")
    return root


def one_paragraph(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def add_to_yaml(task: Path, lines: str) -> None:
    yaml_file = task / TASK_YAML
    yaml_file.write_text(yaml_file.read_text() + lines)


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("/srv/tasks/mine", "is an absolute path"),
        ("../other-run/tasks", "climbs out with .."),
        ("tasks/../../etc", "climbs out with .."),
        ("~/tasks", "starts with ~ (a home directory)"),
    ],
)
def test_a_task_path_leaving_the_workspace_is_refused_by_the_first_step(entry, why, workspace):
    """Its text alone says so: refused before anything runs, by the run form, the stage's options and the loader."""
    found = problems({"benchmark_tasks": f"arc_easy,{entry}"})
    assert found == [
        f"parameter 'benchmark_tasks' names task directories outside the workspace ({entry} {why}): a task directory "
        "is code the evaluate step runs in a pod holding the run's credentials, so it must be a relative path inside "
        "the workspace (the run's PVC; OUTPUT_DIR/workspace in a local run), such as tasks/mine. Copy the task there "
        f"and name it so, or name the bundled task {SAMPLE_TASK}"
    ]
    with pytest.raises(UserError, match=r"^invalid evaluation options: benchmark_tasks names task directories"):
        EvaluateOptions(benchmark_tasks=entry)
    with pytest.raises(UserError) as raised:
        load_tasks([entry], workspace, limit=0)
    assert one_paragraph(raised).startswith(f"benchmark_tasks names task directories outside the workspace ({entry}")


def test_a_symbolic_link_out_of_the_workspace_is_refused(workspace, tmp_path):
    """The path reads as inside, but the directory it reaches is not: only the evaluate step can see that."""
    outside = Path(shutil.copytree(bundled_task_dir(), tmp_path / "elsewhere"))
    (workspace / "tasks" / "linked").symlink_to(outside, target_is_directory=True)
    assert problems({"benchmark_tasks": "tasks/linked"}) == []  # the first step has no workspace to follow it in
    with pytest.raises(UserError) as raised:
        load_tasks(["tasks/linked"], workspace, limit=0)
    assert one_paragraph(raised).startswith(
        f"benchmark_tasks names the task directory tasks/linked, which a symbolic link leads out of the workspace "
        f"{workspace} (to {outside.resolve()})"
    )


@pytest.mark.parametrize(
    ("escape", "reads"),
    [
        ("yaml-link", "the YAML"),
        ("include", "the YAML"),
        ("data-link", f"reads {SAMPLE_TASK}.jsonl, outside the workspace"),
        ("data-path", "reads ../../../elsewhere.jsonl, outside the workspace"),
        ("dataset-path", "reads /etc, outside the workspace"),
    ],
)
def test_a_file_a_task_reads_from_outside_the_workspace_is_refused(escape, reads, workspace, tmp_path):
    """A task inside the workspace may not read a YAML or data file outside it, by a link, an include or a path."""
    task = workspace / "tasks" / "mine"
    outside = tmp_path / "elsewhere"
    shutil.copytree(bundled_task_dir(), outside)
    if escape == "yaml-link":
        (task / TASK_YAML).unlink()
        (task / TASK_YAML).symlink_to(outside / TASK_YAML)
    elif escape == "include":
        add_to_yaml(task, f"include: {outside / TASK_YAML}\n")
    elif escape == "data-link":
        (task / f"{SAMPLE_TASK}.jsonl").unlink()
        (task / f"{SAMPLE_TASK}.jsonl").symlink_to(outside / f"{SAMPLE_TASK}.jsonl")
    elif escape == "data-path":
        shutil.copy(outside / f"{SAMPLE_TASK}.jsonl", tmp_path / "elsewhere.jsonl")
        yaml_file = task / TASK_YAML
        yaml_file.write_text(
            yaml_file.read_text().replace(f"test: {SAMPLE_TASK}.jsonl", "test: ../../../elsewhere.jsonl")
        )
    else:
        yaml_file = task / TASK_YAML
        yaml_file.write_text(yaml_file.read_text().replace("dataset_path: json", "dataset_path: /etc"))
    with pytest.raises(UserError) as raised:
        load_tasks(["tasks/mine"], workspace, limit=0)
    message = one_paragraph(raised)
    assert message.startswith("benchmark_tasks names the task directory tasks/mine, whose task")
    assert reads in message and str(workspace) in message


@pytest.mark.parametrize(
    ("python", "named"),
    [
        ("py-file", "tasks/mine/helpers.py"),
        ("function-tag", f"tasks/mine/{TASK_YAML}: !function utils.first_ten"),
        ("importable-module", f"tasks/mine/{TASK_YAML}: !function os.getcwd"),
        ("included-tag", "tasks/mine/_common_yaml: !function utils.first_ten"),
    ],
)
def test_python_in_a_task_directory_is_refused_without_the_opt_in(python, named, workspace):
    """Refused before lm-eval's loader sees the directory: nothing in it is imported (the marker stays absent)."""
    task = workspace / "tasks" / "mine"
    if python == "py-file":
        (task / "helpers.py").write_text(UTILS)
    elif python == "function-tag":
        (task / "utils.py").write_text(UTILS)
        add_to_yaml(task, "process_docs: !function utils.first_ten\n")
    elif python == "importable-module":  # no file needed: lm-eval imports any module it can
        add_to_yaml(task, "process_docs: !function os.getcwd\n")
    else:  # lm-eval's convention: an included template without the .yaml suffix, so it is no task of its own
        (task / "_common_yaml").write_text("process_docs: !function utils.first_ten\n")
        add_to_yaml(task, "include: _common_yaml\n")
    with pytest.raises(UserError) as raised:
        load_tasks(["tasks/mine"], workspace, limit=0)
    message = one_paragraph(raised)
    assert message.startswith("benchmark_tasks names the task directory tasks/mine, which holds Python (")
    assert named in message
    assert "the Hub write token and the service-account token" in message
    assert message.endswith("set benchmark_allow_code to true.")
    assert not (task / "imported").exists()


def test_with_the_opt_in_a_task_with_python_loads_and_its_function_runs(workspace):
    task = workspace / "tasks" / "mine"
    (task / "utils.py").write_text(UTILS)
    add_to_yaml(task, "process_docs: !function utils.first_ten\n")
    tasks = load_tasks(["tasks/mine"], workspace, limit=0, allow_code=True)
    assert tasks.names == (SAMPLE_TASK,) and tasks.examples == {SAMPLE_TASK: 10}  # first_ten kept 10 of 40
    assert (task / "imported").read_text() == "utils.py ran"


def test_the_opt_in_is_a_run_parameter_off_by_default():
    assert EvaluateOptions().benchmark_allow_code is False
    assert problems({"benchmark_tasks": "tasks/mine", "benchmark_allow_code": True}) == []


def test_a_template_cannot_reach_python_from_a_task_without_python(workspace, tmp_path):
    """lm-eval renders templates with Jinja, which outside its sandbox reaches os through any global's __init__:
    a task YAML alone would run code. The sandbox refuses it, with or without the opt-in."""
    marker = tmp_path / "template-ran"
    yaml_file = workspace / "tasks" / "mine" / TASK_YAML
    yaml_file.write_text(
        yaml_file.read_text().replace(
            "{{question}}", "{{ cycler.__init__.__globals__.os.mkdir('" + str(marker) + "') }}{{question}}"
        )
    )
    for allow_code in (False, True):
        with pytest.raises(UserError) as raised:
            load_tasks(["tasks/mine"], workspace, limit=0, allow_code=allow_code)
        assert "SecurityError" in one_paragraph(raised)
    assert not marker.exists()


def test_the_bundled_task_needs_neither_a_path_nor_the_opt_in(tmp_path):
    """It holds no Python, so benchmark_allow_code false loads it; the run form takes its name."""
    assert not [path for path in bundled_task_dir().rglob("*") if path.suffix in (".py", ".pyc")]
    assert "!function" not in (bundled_task_dir() / TASK_YAML).read_text()
    assert problems({"benchmark_tasks": SAMPLE_TASK}) == []
    assert EvaluateOptions(benchmark_tasks=SAMPLE_TASK).benchmark_entries == [SAMPLE_TASK]
    assert load_tasks([SAMPLE_TASK], tmp_path, limit=0).examples == {SAMPLE_TASK: 40}


# --- Python reached without a .py file in the task directory or a !function tag: lm-eval's metric fallback ---

CANARY = "SECRET-CANARY-123"


def set_metrics(task: Path, metric_list: str | None) -> None:
    """Replace the task YAML's metric_list with ``metric_list`` (YAML text), or drop it (None)."""
    yaml_file = task / TASK_YAML
    text = yaml_file.read_text()
    start, end = text.index("metric_list:"), text.index("metadata:")
    yaml_file.write_text(text[:start] + (metric_list or "") + text[end:])


def set_dataset_kwargs(task: Path, lines: str) -> None:
    """Add ``lines`` (YAML, indented two spaces) to the task YAML's dataset_kwargs."""
    yaml_file = task / TASK_YAML
    yaml_file.write_text(yaml_file.read_text().replace("dataset_kwargs:\n", "dataset_kwargs:\n" + lines))


@pytest.mark.parametrize(
    ("metric", "named"),
    [
        ("script", "the metric {script}, which is not one of lm-eval's"),
        ("hub-id", "the metric someone/metric, which is not one of lm-eval's"),
        ("evaluate-name", "the metric accuracy, which is not one of lm-eval's"),
        ("hf-evaluate", "the metric acc with hf_evaluate: true"),
        ("included", "the metric {script}, which is not one of lm-eval's"),
    ],
)
def test_a_metric_lm_eval_would_load_with_evaluate_is_refused_without_the_opt_in(metric, named, workspace):
    """lm-eval hands a metric name it does not have (or any, with hf_evaluate) to ``evaluate.load``, which runs a
    script from a path or the Hub: Python from a task directory that holds no .py file and no !function tag."""
    task = workspace / "tasks" / "mine"
    script = workspace / "metrics" / "metric.py"  # in the workspace, outside the task directory
    marker = workspace / "metric-ran"
    script.parent.mkdir()
    script.write_text(f"from pathlib import Path\n\nPath({str(marker)!r}).write_text('metric script ran')\n")
    entries = {
        "script": f"  - metric: {script}\n",
        "hub-id": "  - metric: someone/metric\n",
        "evaluate-name": "  - metric: accuracy\n",
        "hf-evaluate": "  - metric: acc\n    hf_evaluate: true\n",
    }
    if metric == "included":  # the YAML's own metric_list would win over the included one: drop it
        set_metrics(task, None)
        (task / "_metrics_yaml").write_text(f"metric_list:\n  - metric: {script}\n")
        add_to_yaml(task, "include: _metrics_yaml\n")
    else:
        set_metrics(task, "metric_list:\n" + entries[metric])
    with pytest.raises(UserError) as raised:
        load_tasks(["tasks/mine"], workspace, limit=0)
    message = one_paragraph(raised)
    assert message.startswith("benchmark_tasks names the task directory tasks/mine, whose task file ")
    assert named.format(script=script) in message
    assert "the Hub write token and the service-account token" in message
    assert message.endswith("set benchmark_allow_code to true.")
    assert not marker.exists()


def test_a_dataset_asking_to_run_its_loading_script_is_refused_without_the_opt_in(workspace):
    task = workspace / "tasks" / "mine"
    set_dataset_kwargs(task, "  trust_remote_code: true\n")
    with pytest.raises(UserError) as raised:
        load_tasks(["tasks/mine"], workspace, limit=0)
    message = one_paragraph(raised)
    assert message.startswith("benchmark_tasks names the task directory tasks/mine, whose task file ")
    assert "sets dataset_kwargs.trust_remote_code" in message
    assert message.endswith("set benchmark_allow_code to true.")
    assert load_tasks(["tasks/mine"], workspace, limit=0, allow_code=True).examples == {SAMPLE_TASK: 40}


def test_lm_evals_own_metrics_and_its_default_ones_need_no_opt_in(workspace):
    task = workspace / "tasks" / "mine"
    set_metrics(task, "metric_list:\n  - metric: acc\n  - metric: brier_score\n")
    assert load_tasks(["tasks/mine"], workspace, limit=0).names == (SAMPLE_TASK,)
    set_metrics(task, None)  # lm-eval's defaults for multiple_choice: acc, acc_norm
    assert load_tasks(["tasks/mine"], workspace, limit=0).names == (SAMPLE_TASK,)


# --- Files outside the workspace reached by a URL, a data_dir, a name or a glob ---


@pytest.mark.parametrize(
    ("reach", "reads"),
    [
        ("file-url", "reads file://{canary}, a URL lm-eval would fetch with file://"),
        ("chained-url", "reads zip://canary::file://{canary}, a URL lm-eval would fetch with zip://"),
        ("bucket-url", "reads s3://bucket/canary, a URL lm-eval would fetch with s3://"),
        ("data-dir", "reads {outside}, outside the workspace"),
        ("relative-data-dir", "reads ../../../elsewhere, outside the workspace"),
        ("name-in-working-directory", "reads elsewhere, outside the workspace"),
        ("glob-through-link", "reads *.jsonl, outside the workspace"),
        ("prompt-file", "reads {outside}/prompts.yaml, outside the workspace"),
    ],
)
def test_a_task_reaching_a_file_outside_the_workspace_is_refused_and_never_quotes_it(
    reach, reads, workspace, tmp_path, monkeypatch
):
    """lm-eval and datasets read a file:// URL, a data_dir, a relative dataset_path (against the pod's working
    directory), a glob's matches and a use_prompt file wherever they lead: each stays inside the workspace, and
    nothing of what lies outside reaches the step's message."""
    task = workspace / "tasks" / "mine"
    yaml_file = task / TASK_YAML
    outside = Path(shutil.copytree(bundled_task_dir(), tmp_path / "elsewhere"))
    canary = tmp_path / "canary"
    canary.write_text(f"{CANARY}\n")
    (outside / "prompts.yaml").write_text(f"prompts:\n  leak: '{CANARY}'\n")
    text = yaml_file.read_text()
    data_files = f"    test: {SAMPLE_TASK}.jsonl\n"
    if reach in ("file-url", "chained-url", "bucket-url"):
        url = {"file-url": f"file://{canary}", "chained-url": f"zip://canary::file://{canary}"}
        text = text.replace("dataset_path: json", "dataset_path: text")
        text = text.replace(data_files, f"    test: {url.get(reach, 's3://bucket/canary')}\n")
    elif reach in ("data-dir", "relative-data-dir"):
        data_dir = outside if reach == "data-dir" else "../../../elsewhere"
        text = text.replace(f"  data_files:\n{data_files}", f"  data_dir: {data_dir}\n")
    elif reach == "name-in-working-directory":  # datasets reads a local directory of this name before the Hub
        monkeypatch.chdir(tmp_path)
        text = text.replace("dataset_path: json", "dataset_path: elsewhere")
        text = text.replace(f"dataset_kwargs:\n  data_files:\n{data_files}", "")
    elif reach == "glob-through-link":
        (task / f"{SAMPLE_TASK}.jsonl").unlink()
        (task / f"{SAMPLE_TASK}.jsonl").symlink_to(outside / f"{SAMPLE_TASK}.jsonl")
        text = text.replace(data_files, "    test: '*.jsonl'\n")
    else:
        text += f"use_prompt: {outside}/prompts.yaml:leak\n"
    yaml_file.write_text(text)
    with pytest.raises(UserError) as raised:
        load_tasks(["tasks/mine"], workspace, limit=0)
    message = one_paragraph(raised)
    assert message.startswith("benchmark_tasks names the task directory tasks/mine, whose task file ")
    assert reads.format(canary=canary, outside=outside) in message
    assert CANARY not in message


@pytest.mark.parametrize(
    ("dataset_path", "named"),
    [
        ("json", "gives the datasets builder json as its dataset_path but no data_files or data_dir"),
        ("someone/sets/data", "gives someone/sets/data as its dataset_path, which is neither a Hub dataset id"),
    ],
)
def test_a_dataset_path_that_is_no_hub_id_and_no_local_path_is_refused(dataset_path, named, workspace):
    """A builder with no data files reads the pod's working directory; a longer relative path is no Hub id, and
    datasets would read it against that directory."""
    yaml_file = workspace / "tasks" / "mine" / TASK_YAML
    text = yaml_file.read_text().replace(f"dataset_kwargs:\n  data_files:\n    test: {SAMPLE_TASK}.jsonl\n", "")
    yaml_file.write_text(text.replace("dataset_path: json", f"dataset_path: {dataset_path}"))
    with pytest.raises(UserError) as raised:
        load_tasks(["tasks/mine"], workspace, limit=0)
    message = one_paragraph(raised)
    assert message.startswith("benchmark_tasks names the task directory tasks/mine, whose task file ")
    assert named in message


@pytest.mark.parametrize(
    "setting",
    ["dataset_path: someone/data", "dataset_path: hf://datasets/someone/data", "data_files: hf://datasets/o/d/t.jsonl"],
)
def test_a_hub_dataset_passes_the_checks_and_is_lm_evals_to_fetch(setting, workspace, no_hub, monkeypatch):
    """Offline, the load fails the Hub's way: the checks let a Hub id and an hf:// URL through."""
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    yaml_file = workspace / "tasks" / "mine" / TASK_YAML
    text = yaml_file.read_text()
    if setting.startswith("dataset_path"):
        text = text.replace(f"dataset_kwargs:\n  data_files:\n    test: {SAMPLE_TASK}.jsonl\n", "")
        text = text.replace("dataset_path: json", setting)
    else:
        text = text.replace(f"test: {SAMPLE_TASK}.jsonl", f"test: {setting.split(': ')[1]}")
    yaml_file.write_text(text)
    with pytest.raises(UserError) as raised:
        load_tasks(["tasks/mine"], workspace, limit=0)
    assert one_paragraph(raised).startswith(f"the benchmark task {SAMPLE_TASK} (tasks/mine) cannot be loaded (")


@pytest.mark.parametrize("key", ["storage_options", "download_config", "token", "cache_dir"])
def test_a_dataset_setting_that_redirects_the_download_or_its_credential_is_refused(key, workspace):
    set_dataset_kwargs(
        workspace / "tasks" / "mine", f"  {key}: {{}}\n" if key != "cache_dir" else "  cache_dir: /tmp\n"
    )
    with pytest.raises(UserError) as raised:
        load_tasks(["tasks/mine"], workspace, limit=0, allow_code=True)
    message = one_paragraph(raised)
    assert message.startswith("benchmark_tasks names the task directory tasks/mine, whose task file ")
    assert f"sets dataset_kwargs.{key}" in message


@pytest.mark.parametrize(
    ("breakage", "named"),
    [
        ("target", "loads but cannot render its first example (ValueError: its target (a str) is neither an index"),
        ("template", "cannot be loaded (ValueError: <question> is not in list)"),
    ],
)
def test_a_document_that_does_not_render_is_named_by_its_fields_never_its_values(breakage, named, workspace):
    """A message that quoted the document would carry the data into the step's log: the step's own message names
    the value's type, and a template's error (lm-eval renders the first document while it builds the task) names
    the field instead of its value."""
    task = workspace / "tasks" / "mine"
    data = task / f"{SAMPLE_TASK}.jsonl"
    lines = data.read_text().splitlines()
    lines[0] = lines[0].replace("tyre pressures", CANARY)
    if breakage == "target":
        lines[0] = lines[0].replace('"answer": 0', f'"answer": "{CANARY}"')
    else:  # list.index, which the sandbox allows, quotes what it did not find
        yaml_file = task / TASK_YAML
        yaml_file.write_text(yaml_file.read_text().replace("{{question}}", "{{question}} {{choices.index(question)}}"))
    data.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError) as raised:
        load_tasks(["tasks/mine"], workspace, limit=0)
    message = one_paragraph(raised)
    assert named in message
    assert CANARY not in message
