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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO_ROOT

from common.errors import UserError
from components.run_form.command_line import checked_overrides
from components.run_form.table import RUN_PARAMETERS
from components.serve.options import pull_secret_volume
from components.train.api_server import require_kind
from components.train.kinds import KINDS
from pipelines.compile import DEFAULT_OUTPUT
from pipelines.cron import validate_cron
from tests.yaml_files import read_yaml_documents

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
    kinds: set[str] = field(default_factory=set)  # secretAsEnv, secretAsVolume: how the steps mount it


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
    documents = [document for document in read_yaml_documents(path) if document]
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
                mount.kinds.add(kind)
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


# --- (a2) The Secrets to create on OpenShift AI 2.22 to 2.25 --------------------------------------------------------

SECRETS_SECTION = re.compile(r"^## \d+\. Secrets\n(.*?)(?=^## )", re.S | re.M)
CREATE_SECRET = ["oc", "create", "secret", "generic"]
LITERAL = "--from-literal="
NUMBER_WORDS = {number: word for number, word in enumerate("zero one two three four five six seven eight nine".split())}


@dataclass(frozen=True)
class Created:
    name: str
    keys: tuple[str, ...]
    values: tuple[str, ...]


def secret_commands(text: str) -> list[Created]:
    """Each ``oc create secret generic NAME ... --from-literal=KEY=VALUE`` of the Secrets section's block (the one
    the page gives for OpenShift AI 2.22 to 2.25), in order."""
    section = SECRETS_SECTION.search(text)
    assert section, "the page has no '## N. Secrets' section"
    blocks = [
        block for block in re.findall(r"^```\w*\n(.*?)^```", section[1], re.S | re.M) if "--from-literal" in block
    ]
    assert len(blocks) == 1, f"expected one block of oc create secret commands in the Secrets section: {blocks}"
    created = []
    for line in blocks[0].replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[:4] == CREATE_SECRET, f"the block holds something other than {shlex.join(CREATE_SECRET)}: {line}"
        pairs = [word.removeprefix(LITERAL).partition("=") for word in words if word.startswith(LITERAL)]
        created.append(Created(words[4], tuple(key for key, _, _ in pairs), tuple(value for _, _, value in pairs)))
    return created


def secret_command_problems(mounts: dict[tuple[str, str], Mount], created: list[Created]) -> list[str]:
    """What the block gets wrong about ``mounts``: a Secret mapped to environment variables (secretAsEnv) that it
    does not create exactly once with every key; a Secret it creates that no step maps to environment variables
    (a files-only mount stays optional on 2.22 to 2.25, so creating it is not needed); a value that is not empty."""
    env = {name: mount.keys for (_, name), mount in mounts.items() if "secretAsEnv" in mount.kinds}
    files_only = {name for (_, name), mount in mounts.items() if mount.kinds == {"secretAsVolume"}}
    counts = Counter(secret.name for secret in created)
    problems = []
    for name, keys in sorted(env.items()):
        if counts[name] != 1:
            problems.append(f"{name}: created {counts[name]} times, once is needed (its steps map it to env)")
            continue
        (secret,) = [secret for secret in created if secret.name == name]
        if missing := keys - set(secret.keys):
            problems.append(f"{name}: the command lacks the keys {sorted(missing)}")
        if extra := set(secret.keys) - keys:
            problems.append(f"{name}: the command creates keys no step maps: {sorted(extra)}")
        if repeated := [key for key, count in Counter(secret.keys).items() if count > 1]:
            problems.append(f"{name}: the command gives {repeated} more than once")
        if any(secret.values):
            problems.append(f"{name}: the page's command carries a value; it creates the Secret empty")
    for name in sorted(set(counts) - set(env)):
        why = "a files-only mount, optional on every version" if name in files_only else "no step maps it to env"
        problems.append(f"{name}: created, but {why}")
    return problems


@pytest.mark.parametrize("compiled", COMPILED, ids=lambda path: path.name)
def test_the_secret_commands_for_openshift_ai_2_create_every_env_mounted_secret_with_every_key(compiled):
    """On 2.22 to 2.25 a Secret mapped to environment variables must exist with every key before its step starts,
    else the step waits in CreateContainerConfigError: the page's block must create each such Secret once, with
    its full key set, and no files-only mount. The sentence before it counts them."""
    mounts = compiled_mounts(compiled)
    env = [name for (_, name), mount in mounts.items() if "secretAsEnv" in mount.kinds]
    assert env and all(env), f"an env-mounted Secret has no default name, which the block cannot create: {mounts}"
    assert secret_command_problems(mounts, secret_commands(page())) == []
    assert f"create the {NUMBER_WORDS[len(env)]} others" in " ".join(page().split())


def without_key(text: str, name: str, key: str) -> str:
    """The page with ``--from-literal=KEY=`` taken out of the command that creates ``name`` (and no other)."""
    start = text.index(f"oc create secret generic {name} ")
    end = text.find("oc create secret", start + 1)
    end = len(text) if end < 0 else end
    command = text[start:end]
    assert f" {LITERAL}{key}=" in command
    return text[:start] + command.replace(f" {LITERAL}{key}=", "", 1) + text[end:]


def test_the_secret_command_check_fails_without_any_one_key_or_command_and_with_a_files_only_secret():
    """The check above proves something only if it notices: each key taken out of its command, each command taken
    out of the block, a command given twice, a files-only Secret created, and a value filled in."""
    mounts = compiled_mounts(COMPILED[0])
    created = secret_commands(page())
    for secret in created:
        for key in secret.keys:
            problems = secret_command_problems(mounts, secret_commands(without_key(page(), secret.name, key)))
            assert problems == [f"{secret.name}: the command lacks the keys {[key]}"], (secret.name, key)
        problems = secret_command_problems(mounts, [other for other in created if other != secret])
        assert problems == [f"{secret.name}: created 0 times, once is needed (its steps map it to env)"]
        problems = secret_command_problems(mounts, [*created, secret])
        assert problems == [f"{secret.name}: created 2 times, once is needed (its steps map it to env)"]
    files_only = Created("oci-connection-models", (".dockerconfigjson",), ("",))
    assert secret_command_problems(mounts, [*created, files_only]) == [
        "oci-connection-models: created, but a files-only mount, optional on every version"
    ]
    filled = page().replace("--from-literal=HF_TOKEN=", "--from-literal=HF_TOKEN=hf_abc", 1)
    assert secret_command_problems(mounts, secret_commands(filled)) == [
        "hf-read-token: the page's command carries a value; it creates the Secret empty"
    ]


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


def backend_problems(text: str) -> list[str]:
    """What the page gets wrong about the training backend on OpenShift AI 3.x: the run form's default is
    pytorchjob, so 3.x must be told to set trainjob (in the prerequisites, and at the first run's form), the first
    run must set it, and the error the page quotes must be the train step's own on a cluster without PyTorchJob."""
    flat, problems = " ".join(text.split()), []
    default = {parameter.name: parameter.default for parameter in RUN_PARAMETERS}["training_backend"]
    for needed in (
        f"its default, `{default}`, is for 2.22 to 2.25",
        "every run **must** set `training_backend` to `trainjob`",
        "On OpenShift AI 3.x `training_backend` **must** be `trainjob`",
    ):
        if needed not in flat:
            problems.append(f"the page does not say {needed!r}")
    if "--param training_backend=trainjob" not in shlex.join(first_run_words(text)):
        problems.append("the first run does not set training_backend=trainjob")
    unserved = SimpleNamespace(get_api_resources=lambda *args, **kwargs: SimpleNamespace(resources=[]))
    said = "nothing: it accepted a cluster that serves no PyTorchJob"
    try:
        require_kind(SimpleNamespace(custom=unserved, namespace="project"), KINDS["pytorchjob"])
    except UserError as refused:
        said = str(refused)
    quoted = re.findall(r"`(This cluster does not serve [^`]+)`", flat)
    if len(quoted) != 1 or quoted[0] not in said or "set the backend parameter to trainjob" not in said:
        problems.append(f"the page quotes {quoted} where the train step says {said!r}")
    return problems


def test_openshift_ai_3_must_train_with_trainjob_and_the_page_says_what_pytorchjob_does_there():
    assert backend_problems(page()) == []


@pytest.mark.parametrize(
    ("right", "wrong"),
    [
        ("every run **must** set `training_backend`", "every run should set `training_backend`"),
        ("On OpenShift AI 3.x `training_backend` **must** be", "On OpenShift AI 3.x `training_backend` may be"),
        ("--param training_backend=trainjob", "--param training_backend=pytorchjob"),
        (
            "`This cluster does not serve\n  PyTorchJob (pytorchjobs",
            "`This cluster does not serve\n  PyTorchJobs (pytorchjobs",
        ),
    ],
)
def test_the_backend_check_fails_on_a_wrong_word(right, wrong):
    assert right in page()
    assert len(backend_problems(page().replace(right, wrong, 1))) == 1


def compiled_step_names() -> set[str]:
    """The task names of every DAG in the compiled pipelines, as the run graph shows them (store-model-2 is a
    second store-model)."""
    names: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("tasks"), dict):
                names.update(re.sub(r"-\d+$", "", name) for name in node["tasks"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for compiled in COMPILED:
        for document in read_yaml_documents(compiled):
            walk(document)
    return names


def unknown_steps(text: str) -> set[str]:
    """The steps the page sends the reader to ("the `resolve-storage-class` step's log") that the run graph does
    not have."""
    return set(re.findall(r"`([a-z]+(?:-[a-z]+)+)` step", " ".join(text.split()))) - compiled_step_names()


def test_every_step_the_page_names_is_in_the_compiled_pipeline():
    """A renamed step leaves the reader looking for a box the run graph does not show."""
    assert {"resolve-storage-class", "workspace-pvc"} <= set(re.findall(r"`([a-z-]+)` step", page()))
    assert unknown_steps(page()) == set()
    assert unknown_steps(page().replace("`resolve-storage-class` step", "`check-storage-class` step")) == {
        "check-storage-class"
    }


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
