"""The runtime image's recipe: what the Containerfile must do for the image to run on any cluster node.

The image cannot be built here (no container runtime, no registry), so these
tests read the Containerfile itself.
"""

from __future__ import annotations

import re

from conftest import REPO_ROOT

CONTAINERFILE = REPO_ROOT / "Containerfile"


def install_commands() -> list[str]:
    """Each ``pip install`` of the RUN instructions, with the environment assignments written before it."""
    text = CONTAINERFILE.read_text().replace("\\\n", " ")
    runs = re.findall(r"^RUN (.*)$", text, flags=re.MULTILINE)
    return [command.strip() for run in runs for command in run.split("&&") if "pip install" in command]


def test_llama_cpp_is_built_for_a_baseline_cpu_not_the_build_machine():
    """llama-cpp-python compiles llama.cpp when the project is installed; built with GGML_NATIVE (its default)
    it uses every instruction of the build machine's CPU and the export step dies with SIGILL on older nodes."""
    (project,) = [command for command in install_commands() if re.search(r"pip install( --\S+)* \. ", command)]
    assert re.match(r'^CMAKE_ARGS="[^"]*-DGGML_NATIVE=OFF[^"]*" pip install', project), project
    assert "GGML_AVX512=ON" not in project and "GGML_NATIVE=ON" not in CONTAINERFILE.read_text()
