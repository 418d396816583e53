"""docs/getting-started/local.md's S3, OCI and Model Registry walk-through, run as the page shows it.

The shell block is read from the page, not copied here, so a page that drifts
from what works fails this test. Two changes are mechanical: the page's fixed
ports (5000, 5055, 8089) become free ones, so the test runs beside other tests
and servers, and the folder is a scratch one with the repository's ``.venv``
linked in (the page's relative paths, ``local-run/...``, land there).

The page ends with a whole pipeline run (minutes; ``tests/test_local_run.py``
runs the pipeline against such servers). In its place, in the same shell and
so with everything the page's lines exported, this test runs what the run
would do with the page's three parameters: the first step's checks, then the
store step and the register step by hand, each given the parameters the page
sets (mapped to the step's flags by the run-form table), on a run made up to
the publish step.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess

from conftest import REPO_ROOT
from fake_run import make_run

from common.cli_options import flag
from common.records import Registration
from components.publish.options import PublishOptions
from components.publish.publish import publish
from components.register.options import RegistryOptions
from components.run_form.checks import problems
from components.run_form.table import RUN_PARAMETERS
from components.store.options import StorageOptions

PAGE = REPO_ROOT / "docs" / "getting-started" / "local.md"
SECTION = "## S3, an OCI registry and the Model Registry, locally"
PAGE_PORTS = (5000, 5055, 8089)  # S3, the OCI registry, the Model Registry
RUN_COMMAND = ".venv/bin/python -m pipelines.run"
STAGES = {StorageOptions: "components.store.stage", RegistryOptions: "components.register.stage"}
# What the page's exports must decide, not the environment running the tests.
PAGE_DECIDES = ("AWS_", "MODEL_REGISTRY_TOKEN", "REGISTRY_AUTH_FILE", "KUBECONFIG")


def walkthrough() -> tuple[str, list[str]]:
    """The page's block: its lines before the pipeline run, and that run's ``NAME=VALUE`` parameters."""
    section = PAGE.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    setup, run = block.split(RUN_COMMAND, 1)
    words = shlex.split(run.replace("\\\n", " "))
    return setup, [value for option, value in zip(words, words[1:]) if option == "--param"]


def free_ports(count: int) -> list[int]:
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def on_ports(text: str, ports: dict[int, int]) -> str:
    for page_port, port in ports.items():
        text = re.sub(rf"\b{page_port}\b", str(port), text)
    return text


def stage_commands(pairs: list[str], workspace: str) -> list[str]:
    """The store and register steps by hand, each with the page's parameters that are its options."""
    by_name = {parameter.name: parameter for parameter in RUN_PARAMETERS}
    flags: dict[type, list[str]] = {options: [] for options in STAGES}
    for pair in pairs:
        name, _, value = pair.partition("=")
        parameter = by_name[name]
        flags[parameter.options].append(f"{flag(parameter.field)} {shlex.quote(value)}")
    run = f"--workspace-root {shlex.quote(workspace)} --run-id run-1 --model-name smol-ft"
    return [f".venv/bin/python -m {STAGES[options]} {run} {' '.join(given)}" for options, given in flags.items()]


def test_the_page_lists_the_servers_and_parameters_this_test_maps():
    setup, pairs = walkthrough()
    assert all(str(port) in setup for port in PAGE_PORTS)
    names = {pair.partition("=")[0] for pair in pairs}
    assert names == {"model_s3_uri", "model_oci_uri", "model_registry_url"}


def test_the_walkthrough_as_written_stores_and_registers_the_version(tmp_path):
    setup, pairs = walkthrough()
    ports = dict(zip(PAGE_PORTS, free_ports(len(PAGE_PORTS))))
    setup, pairs = on_ports(setup, ports), [on_ports(pair, ports) for pair in pairs]
    assert problems(dict(pair.partition("=")[::2] for pair in pairs)) == []  # the run's first step passes them
    workspace = tmp_path / "workspace"
    make_run(workspace, "run-1")
    publish(str(workspace), "run-1", "", PublishOptions(publish_merged="true"), token=None)  # a dry run
    folder = tmp_path / "walkthrough"
    folder.mkdir()
    (folder / ".venv").symlink_to(REPO_ROOT / ".venv")
    script = "\n".join(
        [
            "set -e",
            "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT",  # the page's servers stop with the shell
            setup,
            *stage_commands(pairs, str(workspace)),
        ]
    )
    env = {name: value for name, value in os.environ.items() if not name.startswith(PAGE_DECIDES)}
    env |= {"PYTHONPATH": str(REPO_ROOT), "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    shell = subprocess.Popen(
        ["bash", "-c", script], cwd=folder, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = shell.communicate(timeout=180)
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.communicate()
    assert shell.returncode == 0, output
    assert "registered version" in output and "with 2 artifacts" in output, output
    registered = Registration.read(workspace / "runs" / "run-1" / "register" / "registered.json")
    assert set(registered.artifact_ids) == {"smol-ft-s3", "smol-ft-oci"}
    assert registered.url == f"http://127.0.0.1:{ports[8089]}"
