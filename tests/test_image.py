"""The runtime image's recipe: what the Containerfile must do for the image to run on any cluster node.

The image cannot be built here (no container runtime, no registry), so these
tests read the Containerfile itself.
"""

from __future__ import annotations

import re

from conftest import REPO_ROOT

CONTAINERFILE = REPO_ROOT / "Containerfile"
IMAGE_LOCK = "requirements-image.lock"


def install_commands() -> list[str]:
    """Each ``pip install`` of the RUN instructions, with the environment assignments written before it."""
    text = CONTAINERFILE.read_text().replace("\\\n", " ")
    runs = re.findall(r"^RUN (.*)$", text, flags=re.MULTILINE)
    return [" ".join(command.split()) for run in runs for command in run.split("&&") if "pip install" in command]


def lock_install() -> str:
    """The one ``pip install`` that installs the image's lock file."""
    (command,) = [command for command in install_commands() if f"-r {IMAGE_LOCK}" in command]
    return command


def test_the_image_installs_exactly_the_lock_the_suite_passed_with():
    """The pods must run the versions the tests passed with: the image installs requirements-image.lock with its
    hashes and nothing beside it (no dependency resolution, no second torch), checks it is complete, and adds the
    project without its dependencies, so a release on PyPI the day the image is built changes nothing."""
    assert re.search(rf"^COPY [^\n]*\b{re.escape(IMAGE_LOCK)}\b", CONTAINERFILE.read_text(), flags=re.MULTILINE)
    command = lock_install()
    assert "--require-hashes" in command and "--no-deps" in command
    others = [c for c in install_commands() if c != command]
    assert others == [
        "pip install --no-cache-dir --require-hashes --no-deps --only-binary :all: -r requirements-build.lock",
        "pip install --no-cache-dir --no-deps --no-build-isolation .",
    ], others  # the build lock (tests/test_lock.py) and the project
    runs = " ".join(CONTAINERFILE.read_text().replace("\\\n", " ").split())
    assert re.search(r"pip install --no-cache-dir --no-deps --no-build-isolation \. && pip check", runs)
    assert "TORCH_SPEC" not in re.sub(r"(?m)^#.*$", "", CONTAINERFILE.read_text())


def test_llama_cpp_is_built_for_a_baseline_cpu_not_the_build_machine():
    """llama-cpp-python compiles llama.cpp when the lock is installed; built with GGML_NATIVE (its default) it uses
    every instruction of the build machine's CPU and the export step dies with SIGILL on older nodes."""
    command = lock_install()
    assert re.match(r'^CMAKE_ARGS="[^"]*-DGGML_NATIVE=OFF[^"]*" pip install', command), command
    assert "GGML_AVX512=ON" not in command and "GGML_NATIVE=ON" not in CONTAINERFILE.read_text()
    assert re.search(r"(?m)^llama-cpp-python==", (REPO_ROOT / IMAGE_LOCK).read_text())


def test_the_image_has_the_static_busybox_the_modelcar_base_is_built_from():
    """The store step finds its busybox through MODELCAR_BUSYBOX: the image sets it to the file it copies from
    the official busybox image's musl build, which is statically linked (UBI has no busybox package)."""
    from components.store.modelcar_base import BUSYBOX_ENV

    text = CONTAINERFILE.read_text()
    (copied,) = re.findall(r"^COPY --from=docker\.io/library/busybox:[\d.]+-musl /bin/busybox (\S+)$", text, re.M)
    assert re.search(rf"^\s+{BUSYBOX_ENV}={re.escape(copied)} \\$", text, flags=re.MULTILINE)
