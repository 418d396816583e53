"""The runtime image's recipe: what the Containerfile must do for the image to run on any cluster node.

The image cannot be built here (no container runtime, no registry), so these
tests read the Containerfile itself.
"""

from __future__ import annotations

import re

from conftest import REPO_ROOT

CONTAINERFILE = REPO_ROOT / "Containerfile"
PROJECT_INSTALL = r'pip install( --\S+)* "?\.(\[(?P<extras>[\w,]+)\])?"? '


def install_commands() -> list[str]:
    """Each ``pip install`` of the RUN instructions, with the environment assignments written before it."""
    text = CONTAINERFILE.read_text().replace("\\\n", " ")
    runs = re.findall(r"^RUN (.*)$", text, flags=re.MULTILINE)
    return [command.strip() for run in runs for command in run.split("&&") if "pip install" in command]


def test_llama_cpp_is_built_for_a_baseline_cpu_not_the_build_machine():
    """llama-cpp-python compiles llama.cpp when the project is installed; built with GGML_NATIVE (its default)
    it uses every instruction of the build machine's CPU and the export step dies with SIGILL on older nodes."""
    (project,) = [command for command in install_commands() if re.search(PROJECT_INSTALL, command)]
    assert re.match(r'^CMAKE_ARGS="[^"]*-DGGML_NATIVE=OFF[^"]*" pip install', project), project
    assert "GGML_AVX512=ON" not in project and "GGML_NATIVE=ON" not in CONTAINERFILE.read_text()


def test_the_image_installs_the_gpu_kernels_it_lets_a_run_ask_for():
    """liger_kernels true passes the first step only where the image has liger_kernel: the image installs the
    project's gpu extra, which holds it, so a GPU job can use what the run form offers."""
    import tomllib

    (project,) = [
        re.search(PROJECT_INSTALL, command) for command in install_commands() if re.search(PROJECT_INSTALL, command)
    ]
    assert "gpu" in (project["extras"] or "").split(",")
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(requirement.startswith("liger-kernel") for requirement in extras["gpu"])
