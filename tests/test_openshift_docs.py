"""docs/getting-started/openshift-ai.md against the code it describes: its Secrets, its first run, its commands.

The page is a newcomer's one path to a first run on a cluster, and nearly every
line of it restates something the code decides: which Secrets the compiled
pipeline mounts and with which keys, which run parameters exist and what they
accept, which modules, flags and make targets exist, what the launcher's Role
grants. Each test reads the page and the code and fails where they disagree, so
a change to the pipeline that the page does not follow is caught here, not by
someone on a cluster at 3 a.m.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT

from components.run_form.command_line import checked_overrides
from components.run_form.table import RUN_PARAMETERS
from components.serving.options import pull_secret_volume
from pipelines.compile import DEFAULT_OUTPUT
from pipelines.cron import validate_cron

PAGE = REPO_ROOT / "docs" / "getting-started" / "openshift-ai.md"
COMPILED = sorted((REPO_ROOT / "compiled").glob("*.yaml"))
RBAC = REPO_ROOT / "pipelines" / "rbac.yaml"
SECRETS_HEADER = "| Secret: default name (parameter that names it) |"
RBAC_HEADER = "| API group | resources | verbs | why |"
FIRST_RUN = re.compile(r"^FIRST_RUN=\((.*?)^\)", re.S | re.M)
FIRST_RUN_USE = '"${FIRST_RUN[@]}"'
PYTHON_MODULE = re.compile(r"(?:^|\s)(?:\S*/)?python3?\s+-m\s+([\w.]+)(.*)$", re.M)
MAKE_TARGET = re.compile(r"(?:^|\s)make\s+([\w.-]+)", re.M)
SHELL_OPERATORS = ("|", "||", "&&", ";", ">", ">>", "2>&1", "2>/dev/null")
# A Secret whose name is not a run parameter but the output of a step, and the run parameter it passes on. The
# first step turns model_oci_pull_secret into the Secret the serve step mounts: the parameter itself, or a
# placeholder name when it is empty (KFP cannot mount a Secret of no name).
DERIVED_SECRET_NAMES = {"validate-parameters-pull_secret_volume": "model_oci_pull_secret"}


def backticked(text: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", text))


# --- (a) The Secrets table -------------------------------------------------------------------------------------


@dataclass
class Mount:
    """One Secret as the compiled pipeline mounts it, over every step that does."""

    keys: set[str] = field(default_factory=set)  # the keys mapped to environment variables (none for a file mount)
    steps: set[str] = field(default_factory=set)  # the steps' names as the run graph shows them
    optional: bool = True


@dataclass(frozen=True)
class Row:
    line: str
    names: frozenset[str]  # the first cell's names: the default Secret name and the parameter that names it
    keys: frozenset[str]
    steps: frozenset[str]


def secret_identity(entry: dict, defaults: dict[str, object]) -> tuple[str, str]:
    """(the run parameter that names the Secret, or "" for a fixed name; the Secret's name by default)."""
    source = entry.get("secretNameParameter") or {}
    if "runtimeValue" in source:
        return "", source["runtimeValue"]["constant"]
    if "componentInputParameter" in source:
        channel = source["componentInputParameter"].removeprefix("pipelinechannel--")
        parameter = DERIVED_SECRET_NAMES.get(channel, channel)
        assert parameter in defaults, (
            f"a Secret is named by {channel!r}, neither a run parameter nor a step output this test knows "
            "(DERIVED_SECRET_NAMES): say on the page which Secret it is, then teach this test"
        )
        return parameter, str(defaults[parameter])
    return "", entry["secretName"]


def compiled_mounts(path: Path) -> dict[tuple[str, str], Mount]:
    """Every Secret the compiled pipeline at ``path`` mounts in a step: the platform spec's secretAsEnv and
    secretAsVolume of each executor, the name resolved to its run parameter's default."""
    documents = [document for document in yaml.safe_load_all(path.read_text()) if document]
    spec = next(document for document in documents if "root" in document)
    platform = next(document for document in documents if "platforms" in document)
    defaults = {
        name: definition.get("defaultValue", "")
        for name, definition in spec["root"]["inputDefinitions"]["parameters"].items()
    }
    mounts: dict[tuple[str, str], Mount] = {}
    for executor, config in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].items():
        step = re.sub(r"-\d+$", "", executor.removeprefix("exec-"))  # store-model-2: the second store-model
        for kind in ("secretAsEnv", "secretAsVolume"):
            for entry in config.get(kind) or []:
                mount = mounts.setdefault(secret_identity(entry, defaults), Mount())
                mount.keys |= {pair["secretKey"] for pair in entry.get("keyToEnv") or []}
                mount.steps.add(step)
                mount.optional &= bool(entry.get("optional"))
    return mounts


def secrets_table(text: str) -> list[Row]:
    """The rows of the page's Secrets table (the one under ``SECRETS_HEADER``)."""
    lines = text.split(SECRETS_HEADER, 1)[1].splitlines()[2:]  # the rest of the header line, the separator
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows.append(Row(line, *(frozenset(backticked(cell)) for cell in cells[:3])))
    return rows


def table_problems(mounts: dict[tuple[str, str], Mount], rows: list[Row]) -> list[str]:
    """What the table gets wrong about ``mounts``: a Secret with no row, a key or a step a row lacks, a row for
    no Secret the pipeline mounts."""
    problems = []
    matched = set()
    for (parameter, name), mount in sorted(mounts.items()):
        wanted = {token for token in (parameter, name) if token}
        what = f"the Secret {name or '(none by default)'}" + (f" named by {parameter}" if parameter else "")
        rows_for = [row for row in rows if wanted <= row.names]
        if len(rows_for) != 1:
            problems.append(f"{what}: {len(rows_for)} rows name {sorted(wanted)}, one should")
            continue
        (row,) = rows_for
        matched.add(row.line)
        if missing := mount.keys - row.keys:
            problems.append(f"{what}: the row lacks the keys {sorted(missing)}")
        if missing := mount.steps - row.steps:
            problems.append(f"{what}: the row lacks the steps {sorted(missing)}")
    problems += [f"a row names no Secret the pipeline mounts: {row.line}" for row in rows if row.line not in matched]
    return problems


@functools.cache
def page() -> str:
    return PAGE.read_text()


@pytest.mark.parametrize("compiled", COMPILED, ids=lambda path: path.name)
def test_the_page_names_every_secret_the_compiled_pipeline_mounts(compiled):
    """A newcomer creates the Secrets the table lists and no others: one the pipeline mounts but the table leaves
    out (or a key it leaves out) is one that leaves a step in CreateContainerConfigError on OpenShift AI 2.x."""
    mounts = compiled_mounts(compiled)
    assert mounts, f"no Secret mounts found in {compiled}: has the compiled YAML's layout changed?"
    assert table_problems(mounts, secrets_table(page())) == []


def test_the_serve_steps_pull_secret_is_model_oci_pull_secret():
    """The table lists the serve step's mount under model_oci_pull_secret (DERIVED_SECRET_NAMES): true while the
    first step passes a non-empty value on as it is."""
    assert pull_secret_volume("oci-pull-models") == "oci-pull-models"


def test_the_table_check_fails_without_any_one_row():
    """The check above proves something only if it notices a Secret dropped from the page: remove each row in
    turn from the page's text and the check must name a problem."""
    mounts = compiled_mounts(COMPILED[0])
    rows = secrets_table(page())
    assert len(rows) == len(mounts)
    for row in rows:
        without = page().replace(row.line + "\n", "", 1)
        assert table_problems(mounts, secrets_table(without)), f"nothing noticed without the row {row.line}"


def test_the_table_check_fails_without_any_one_key():
    """Likewise for a key: remove each key the pipeline maps from its row, and the check must name it."""
    mounts = compiled_mounts(COMPILED[0])
    for row in secrets_table(page()):
        (mount,) = [mount for identity, mount in mounts.items() if {token for token in identity if token} <= row.names]
        for key in mount.keys:
            without = page().replace(row.line, row.line.replace(f"`{key}`", "a key", 1), 1)
            problems = table_problems(mounts, secrets_table(without))
            assert any(key in problem for problem in problems), f"nothing noticed without {key} in {row.line}"


def test_every_secret_mount_is_optional_as_the_page_says_for_openshift_ai_3():
    """The page tells 3.x users that a missing Secret does not stop a step from starting: every mount must be
    optional in the compiled YAML for that to hold."""
    for compiled in COMPILED:
        required = [identity for identity, mount in compiled_mounts(compiled).items() if not mount.optional]
        assert required == [], f"{compiled.name} mounts these Secrets without optional: {required}"


# --- (b) The first run's parameters ------------------------------------------------------------------------------


def first_run_words(text: str) -> list[str]:
    """The words of the page's ``FIRST_RUN=( ... )`` array, as bash reads them (comments dropped)."""
    match = FIRST_RUN.search(text)
    assert match, "the page has no FIRST_RUN=( ... ) array"
    return shlex.split(match[1], comments=True)


def params_of(words: list[str]) -> list[str]:
    return [value for option, value in zip(words, words[1:]) if option == "--param"]


def run_values(pairs: list[str]) -> dict[str, object]:
    """Every run parameter's value for these ``NAME=VALUE`` overrides, once they pass the run form's checks (the
    checks the first step and ``pipelines.submit`` run): a misspelt name or a bad value raises ``UserError``."""
    declared = {parameter.name: parameter.kfp_type for parameter in RUN_PARAMETERS}
    defaults = {parameter.name: parameter.default for parameter in RUN_PARAMETERS}
    return defaults | checked_overrides(pairs, declared, defaults)


def test_the_first_run_parameters_exist_and_pass_the_run_forms_checks():
    """Every value of the first run is one the run form accepts, so the run is not refused by its first step
    (or by submit before it). The page offers pytorchjob in place of trainjob for OpenShift AI 2.x: that must
    pass too."""
    words = first_run_words(page())
    pairs = params_of(words)
    assert len(pairs) * 2 == len(words), f"FIRST_RUN holds something other than --param NAME=VALUE: {words}"
    names = [pair.partition("=")[0] for pair in pairs]
    assert len(set(names)) == len(names), f"a parameter is set twice: {names}"
    for backend in ("trainjob", "pytorchjob"):
        run_values(
            [pair for pair in pairs if not pair.startswith("training_backend=")] + [f"training_backend={backend}"]
        )


def test_the_first_run_is_the_small_run_the_page_promises():
    """The page promises one training pod with one GPU, a few steps and no benchmarks (the defaults ask for two
    48Gi GPU pods and Hub benchmarks): the values must say the same."""
    values = run_values(params_of(first_run_words(page())))
    assert (values["training_nodes"], values["gpus_per_node"]) == (1, 1)
    assert 0 < values["max_steps"] <= 50
    assert values["benchmark_tasks"] == ""
    assert values["hub_repo_id"] == "" and values["dataset_uri"] == ""  # a dry run on the bundled sample


# --- (c) The commands ----------------------------------------------------------------------------------------------


def code_texts(text: str) -> list[str]:
    """The page's fenced code blocks, its continuation lines joined, and its inline code spans."""
    blocks = re.findall(r"^```\w*\n(.*?)^```", text, re.S | re.M)
    prose = re.sub(r"^```\w*\n.*?^```", "", text, flags=re.S | re.M)
    inline = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]
    return [block.replace("\\\n", " ") for block in blocks] + inline


def python_commands(text: str) -> list[tuple[str, list[str]]]:
    """Each ``python -m MODULE ARGS`` the page shows: the module and its arguments as the shell passes them, with
    the FIRST_RUN array expanded and anything after a shell operator left out."""
    first_run = shlex.join(first_run_words(text))
    commands = []
    for code in code_texts(text):
        for module, rest in PYTHON_MODULE.findall(code.replace(FIRST_RUN_USE, first_run)):
            words = shlex.split(rest, comments=True)
            cut = next((index for index, word in enumerate(words) if word in SHELL_OPERATORS), len(words))
            commands.append((module, words[:cut]))
    return commands


class Parsed(Exception):
    """Raised by the patched parse_args once a module's own parser has accepted the arguments."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


def parse_arguments(module_name: str, args: list[str], monkeypatch) -> argparse.Namespace:
    """``args`` as the module's own parser reads them: ``build_parser()`` where the module has one, else its
    ``main`` stopped right after it parsed (before it does anything)."""
    module = importlib.import_module(module_name)
    if hasattr(module, "build_parser"):
        return module.build_parser().parse_args(args)
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise Parsed(parse(self, args, namespace))

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
        try:
            module.main(args)
        except Parsed as parsed:
            return parsed.namespace
    raise AssertionError(f"{module_name}.main did not parse its arguments")


def test_every_python_command_the_page_shows_exists_and_takes_its_arguments(monkeypatch):
    """A command copied from the page runs: its module imports, its parser accepts its flags, its --param set
    passes the run form's checks, and a --schedule is a cron KFP reads. Mentions without arguments are checked
    for the module alone."""
    commands = python_commands(page())
    assert {"pipelines.compile", "pipelines.submit", "pipelines.training_job"} <= {name for name, _ in commands}
    for module_name, args in commands:
        importlib.import_module(module_name)
        if not args:
            continue
        try:
            namespace = parse_arguments(module_name, args, monkeypatch)
        except SystemExit as error:
            pytest.fail(f"python -m {module_name} refuses {shlex.join(args)} (exit {error.code})")
        if params := params_of(args):
            run_values(params)
        if getattr(namespace, "schedule", None):
            validate_cron(namespace.schedule)


def test_the_page_never_compiles_over_the_committed_pipeline(monkeypatch):
    """Compiling with the page's command must leave compiled/ as committed: writing over it makes
    `python -m pipelines.compile --check` (and the suite) fail for anyone who followed the page."""
    compiles = [args for name, args in python_commands(page()) if name == "pipelines.compile" and args]
    assert compiles
    for args in compiles:
        namespace = parse_arguments("pipelines.compile", args, monkeypatch)
        assert namespace.check or (REPO_ROOT / namespace.output).resolve() != DEFAULT_OUTPUT, shlex.join(args)


def test_every_make_target_the_page_names_is_in_the_makefile():
    """`make install` and the like must be targets the Makefile defines."""
    defined = set(re.findall(r"^([\w.-]+)\s*:(?!=)", (REPO_ROOT / "Makefile").read_text(), re.M))
    named = {target for code in code_texts(page()) for target in MAKE_TARGET.findall(code)}
    assert "install" in named
    assert named <= defined, f"not in the Makefile: {sorted(named - defined)}"


# --- The launcher's Role --------------------------------------------------------------------------------------------


def test_the_rbac_table_is_the_role_in_pipelines_rbac_yaml():
    """The page's RBAC table tells an administrator what the pipeline's service account may do: it must be the
    Role the page tells them to apply, rule for rule."""
    (role,) = [document for document in yaml.safe_load_all(RBAC.read_text()) if document["kind"] == "Role"]
    rules = {
        (group or "core", frozenset(rule["resources"]), frozenset(rule["verbs"]))
        for rule in role["rules"]
        for group in rule["apiGroups"]
    }
    rows = set()
    for line in page().split(RBAC_HEADER, 1)[1].splitlines()[2:]:
        if not line.startswith("|"):
            break
        group, resources, verbs = [cell.strip() for cell in line.strip().strip("|").split("|")][:3]
        rows.add((group.strip("`"), frozenset(backticked(resources)), frozenset(re.split(r",\s*", verbs))))
    assert rows == rules
