"""What a local benchmark task's YAML may name: the checks the evaluate step runs on each task config that
lm-eval's loader returns (its includes merged), before lm-eval builds the task from it.

A task YAML runs Python without a ``.py`` file or a ``!function`` tag in two ways, so without
``benchmark_allow_code`` both are refused: a ``metric_list`` metric that is not in lm-eval's metric registry (or
any metric with ``hf_evaluate: true``), which lm-eval hands to ``evaluate.load``, which imports the script it
names, a file or one from the Hub; and ``dataset_kwargs.trust_remote_code``, which asks for a dataset's own
loading script.

A task YAML reads files wherever its paths lead, so whatever the setting every path it names is confined to the
workspace: ``data_files`` and ``data_dir`` (read against the YAML's directory, made absolute; a glob's matches
and a directory's entries followed through their links), ``dataset_path`` when it is a local path, and a
``use_prompt`` YAML file. A URL is either ``hf://`` or ``https://``: ``file://`` reads the pod's own files, and
fsspec's other schemes (``zip::file``, ``s3``) reach files or stores the run never named. The load arguments
that send the download elsewhere, or with another credential (``storage_options``, ``download_config``,
``token``, ``cache_dir``), are refused. A ``dataset_path`` is one of: a datasets builder (``json``, ``csv``, ...)
with ``data_files`` or ``data_dir`` (with neither, datasets reads the pod's working directory); an ``hf://`` or
``https://`` URL; a local path, when it starts with ``/``, ``~`` or ``.``, or a file or directory of that name
exists beside the YAML or in the pod's working directory (where datasets looks first); or else a Hub dataset id,
``name`` or ``owner/name``. Anything else is refused.
"""

from __future__ import annotations

import functools
import glob
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import UserError

ALLOW_CODE = "benchmark_allow_code"
# The URL schemes a task may fetch its data from: the Hub, and a web server. Neither reads the pod's files.
URL_SCHEMES = frozenset({"hf", "https"})
# load_dataset arguments that change where the data are fetched from or written, or the credential sent for them.
REDIRECTING_KWARGS = ("storage_options", "download_config", "token", "cache_dir")
# A Hub dataset id: a name, or an owner and a name (datasets reads a longer relative path as a local one).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
CREDENTIALS = "the evaluate pod, which holds the Hub write token and the service-account token"


@dataclass(frozen=True)
class TaskFile:
    """A task YAML as the checks see it: its path (relative paths are read against its directory), the scope every
    file it reads must stay in, and the ``benchmark_tasks`` entry that named its directory, for the messages."""

    path: Path
    scope: Path
    entry: str

    def refused(self, what: str) -> UserError:
        """One paragraph: the entry and the task file, then ``what`` (the setting, why, and the fix)."""
        return UserError(f"benchmark_tasks names the task directory {self.entry}, whose task file {self.path} {what}")

    def code_refused(self, what: str, fix: str) -> UserError:
        """A setting that runs Python (``what`` says how, and that it runs in the pod holding the credentials):
        ``fix`` without it, or the opt-in, as for a .py file in the directory."""
        return self.refused(
            f"{what}. {fix}, or, if you trust everyone who can write {self.path.parent}, set {ALLOW_CODE} to true."
        )

    def outside(self, value: str, culprit: Path | None = None) -> UserError:
        """A path that leads out of the scope, by its text or through a symbolic link (``culprit``: the entry that
        does, when it is not the path itself)."""
        how = f"{culprit} leads there" if culprit is not None else "a symbolic link or the path leads there"
        return self.refused(
            f"reads {value}, outside the workspace {self.scope} ({how}): a task reads its data from inside the "
            "workspace only. Copy the file into the task directory and name it relative to the YAML."
        )


def checked_config(config: dict[str, Any], task: TaskFile, allow_code: bool) -> dict[str, Any]:
    """``config`` with its local paths made absolute, or a UserError: without ``allow_code`` for a setting that
    runs Python, whatever the setting for a file outside the scope."""
    if not allow_code:
        _refuse_code(config, task)
    return _confined_data(config, task)


def _refuse_code(config: dict[str, Any], task: TaskFile) -> None:
    """Refuse the settings through which lm-eval or datasets would run Python that no .py file or !function shows."""
    metrics = config.get("metric_list")
    for metric in metrics if isinstance(metrics, list) else []:
        if not isinstance(metric, dict) or "metric" not in metric:
            continue  # lm-eval names a malformed entry when it builds the task
        name = metric["metric"]
        if metric.get("hf_evaluate") is True:
            raise task.code_refused(
                f"scores with the metric {name} with hf_evaluate: true, which has the evaluate library load it, a "
                f"Python script from the Hub, and run it in {CREDENTIALS}",
                "Drop hf_evaluate to score with lm-eval's own metric",
            )
        if not (isinstance(name, str) and name in _lm_eval_metrics()):
            raise task.code_refused(
                f"scores with the metric {name}, which is not one of lm-eval's ({', '.join(_lm_eval_metrics())}): "
                "lm-eval hands such a name to the evaluate library, which runs the Python script it names (a file, "
                f"or one from the Hub) in {CREDENTIALS}",
                "Score with one of lm-eval's metrics",
            )
    if _dataset_kwargs(config).get("trust_remote_code"):
        raise task.code_refused(
            "sets dataset_kwargs.trust_remote_code, which asks datasets to run the dataset's own loading script, "
            f"Python, in {CREDENTIALS} (datasets 4 and later run none, and lm-eval drops the setting for them)",
            "Remove the setting",
        )


@functools.cache
def _lm_eval_metrics() -> tuple[str, ...]:
    """The names in lm-eval's metric registry: what it scores with itself, without the evaluate library."""
    import lm_eval.api.metrics  # noqa: F401 - registers the metrics
    from lm_eval.api.registry import metric_registry

    return tuple(sorted(metric_registry))


def _dataset_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """The task's load_dataset arguments; a malformed value is lm-eval's to name, so it reads as none here."""
    kwargs = config.get("dataset_kwargs")
    return kwargs if isinstance(kwargs, dict) else {}


def _confined_data(config: dict[str, Any], task: TaskFile) -> dict[str, Any]:
    """``config`` with every local path it reads made absolute and confined (see the module docstring)."""
    kwargs = dict(_dataset_kwargs(config))
    for key in REDIRECTING_KWARGS:
        if key in kwargs:
            raise task.refused(
                f"sets dataset_kwargs.{key}, which changes where datasets fetches or writes the data, or the "
                "credential it sends with them: a task's data come from the workspace, the Hub or an https:// URL, "
                "with the step's own settings. Remove the setting."
            )
    dataset_path, directory = _dataset_path(config.get("dataset_path"), kwargs, task)
    if "data_files" in kwargs:
        kwargs["data_files"] = _data_files(kwargs["data_files"], task)
    if isinstance(kwargs.get("data_dir"), str):
        kwargs["data_dir"] = _data_dir(kwargs["data_dir"], config.get("dataset_path"), directory, task)
    checked = {**config, "dataset_path": dataset_path} if "dataset_path" in config else dict(config)
    if "dataset_kwargs" in config:
        checked["dataset_kwargs"] = kwargs
    if isinstance(config.get("use_prompt"), str):
        checked["use_prompt"] = _use_prompt(config["use_prompt"], task)
    return checked


def _dataset_path(value: Any, kwargs: dict[str, Any], task: TaskFile) -> tuple[Any, Path | None]:
    """The dataset_path to give lm-eval, and the local directory it names (None: a builder, a URL, a Hub id)."""
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    if not isinstance(value, str):
        return value, None  # absent or malformed: lm-eval names it when it builds the task
    if "://" in value:
        _check_url(value, task)
        return value, None
    if value in _PACKAGED_DATASETS_MODULES:  # datasets looks for a builder of this name first
        if not kwargs.get("data_files") and not kwargs.get("data_dir"):
            raise task.refused(
                f"gives the datasets builder {value} as its dataset_path but no data_files or data_dir: datasets "
                "would then read every file in the pod's working directory. Name the task's data files in "
                "dataset_kwargs.data_files, relative to the YAML."
            )
        return value, None
    local = _local_dataset(value, task.path.parent)
    if local is not None:
        return str(_confined_tree(local, value, task)), local
    if HUB_ID.fullmatch(value) and ".." not in value:
        return value, None
    raise task.refused(
        f"gives {value} as its dataset_path, which is neither a Hub dataset id (owner/name), nor a datasets builder, "
        "nor a path that exists: datasets would read it as a path against the pod's working directory. Name a Hub "
        "dataset as owner/name, or put the data beside the YAML and name them in dataset_kwargs.data_files."
    )


def _local_dataset(value: str, base: Path) -> Path | None:
    """The local path a dataset_path names, or None: it starts with /, ~ or ., or that name exists beside the YAML
    (read there) or in the pod's working directory (where datasets would read it)."""
    if value.startswith("~"):
        return Path(value).expanduser()
    if value.startswith(("/", ".")) or (base / value).exists() or (base / value).is_symlink():
        return base / value
    working = Path.cwd() / value
    return working if working.exists() or working.is_symlink() else None


def _data_files(value: Any, task: TaskFile) -> Any:
    """data_files (a path, a list, or a split -> paths mapping) with each local path made absolute and confined."""
    if isinstance(value, str):
        return _data_file(value, task)
    if isinstance(value, list):
        return [_data_files(item, task) for item in value]
    if isinstance(value, dict):
        return {key: _data_files(item, task) for key, item in value.items()}
    return value


def _data_file(value: str, task: TaskFile) -> str:
    """One data_files entry: a URL checked, a local path (or glob) read against the YAML's directory and confined,
    every match of a glob too, since datasets reads each one wherever its links lead."""
    if "://" in value:
        _check_url(value, task)
        return value
    local = _local_path(value, task.path.parent)
    if not glob.has_magic(str(local)):
        return str(_confined_tree(local, value, task))
    if not _inside(_glob_root(local), task.scope):
        raise task.outside(value)
    for match in glob.glob(str(local), recursive=True, include_hidden=True):
        _confined_tree(Path(match), value, task)
    return str(local)


def _glob_root(pattern: Path) -> Path:
    """The directory a glob searches: its path up to the first part holding a wildcard."""
    parts = pattern.parts
    fixed = next(index for index, part in enumerate(parts) if glob.has_magic(part))
    return Path(*parts[:fixed])


def _data_dir(value: str, dataset_path: Any, directory: Path | None, task: TaskFile) -> str:
    """data_dir: for a builder a local directory (read against the YAML's, made absolute, confined); for a local
    dataset a directory inside it (datasets takes it relative); for a Hub dataset a folder of its repository."""
    if "://" in value:
        _check_url(value, task)
        return value
    if directory is not None:
        _confined_tree(directory / value, value, task)
        return value
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    if dataset_path in _PACKAGED_DATASETS_MODULES:
        return str(_confined_tree(_local_path(value, task.path.parent), value, task))
    return value  # a folder of the Hub dataset's repository, fetched, not read from this machine


def _use_prompt(value: str, task: TaskFile) -> str:
    """use_prompt: a YAML file of prompts (lm-eval opens it against the working directory) is read against the
    task YAML's directory and confined; lm-eval's own prompt names are kept."""
    category, separator, name = value.partition(":")
    if ".yaml" not in category:
        return value
    return f"{_confined_tree(_local_path(category, task.path.parent), category, task)}{separator}{name}"


def _local_path(value: str, base: Path) -> Path:
    """``value`` as a local path: ~ expanded, a relative path read against ``base``."""
    return Path(value).expanduser() if value.startswith("~") else base / value


def _check_url(value: str, task: TaskFile) -> None:
    """Refuse a URL that is not one hf:// or https:// URL: fsspec reads file://, chains (zip://a::file://b) and its
    other schemes from the pod's disk or from stores the run never named."""
    schemes = re.findall(r"([A-Za-z][\w+.-]*)://", value)
    if len(schemes) == 1 and "::" not in value and value.startswith(f"{schemes[0]}://") and schemes[0] in URL_SCHEMES:
        return
    named = " and ".join(f"{scheme}://" for scheme in schemes) or value.split("://", 1)[0] + "://"
    raise task.refused(
        f"reads {value}, a URL lm-eval would fetch with {named}: a task reads its data from inside the workspace, "
        "the Hub (hf://) or an https:// URL only, and file:// and the other schemes read the pod's own files or "
        "stores the run never named. Copy the file into the task directory and name it relative to the YAML."
    )


def _confined_tree(local: Path, value: str, task: TaskFile) -> Path:
    """``local`` made absolute, or a UserError naming ``value`` when it, or anything under it, leads out of the
    scope: datasets reads a directory's every file, through its links."""
    if not _inside(local, task.scope):
        raise task.outside(value)
    escape = next(_escapes(local.resolve(), task.scope), None) if local.resolve().is_dir() else None
    if escape is not None:
        raise task.outside(value, escape)
    return local


def _escapes(directory: Path, scope: Path) -> Iterator[Path]:
    """The entries under ``directory``, links followed, that resolve outside ``scope``."""
    pending, seen = [directory], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for child in current.iterdir():
            if not _inside(child, scope):
                yield child
            elif child.resolve().is_dir():
                pending.append(child.resolve())


def _inside(path: Path, scope: Path) -> bool:
    """``path``, its symbolic links followed, lies in ``scope``."""
    return path.resolve().is_relative_to(scope.resolve())
