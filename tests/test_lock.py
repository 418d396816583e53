"""The lock files hold the environment the suite passes in, and this suite runs in it.

``requirements.lock`` is what ``make install`` installs here and in CI (the local and test extras; torch comes
from the Makefile's TORCH_SPEC, the CPU wheel here). ``requirements-image.lock`` is what the runtime image installs
(the gpu extra and the CUDA torch). Both are written by ``make lock``; these tests catch an environment that has
drifted from them and locks that have drifted from pyproject.toml, the Makefile or each other, each with its fix.
``requirements-build.lock`` (also ``make lock``'s, from ``requirements-build.in``) is what the image builds the
packages it has no wheel for, and the project, with.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version
from test_image import install_commands

LOCK = REPO_ROOT / "requirements.lock"
IMAGE_LOCK = REPO_ROOT / "requirements-image.lock"
BUILD_IN = REPO_ROOT / "requirements-build.in"
BUILD_LOCK = REPO_ROOT / "requirements-build.lock"
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
VENV_PIP = ".venv/bin/python -m pip"
CUDA_ONLY = re.compile(r"^(nvidia-|triton$|cuda-)")  # what torch's CUDA build adds to its CPU build's needs


@dataclass(frozen=True)
class Pin:
    version: Version
    hashes: tuple[str, ...]


def read_lock(path: Path) -> dict[str, Pin]:
    """Each ``name==version`` of a lock file, by canonical name, with its ``--hash`` options."""
    pins = {}
    for line in path.read_text().replace("\\\n", " ").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        requirement_text, *hashes = line.split("--hash=")
        requirement = Requirement(requirement_text.strip())
        (specifier,) = requirement.specifier
        assert specifier.operator == "==" and not requirement.marker, f"{path.name}: not an exact pin: {line.strip()}"
        pins[canonicalize_name(requirement.name)] = Pin(Version(specifier.version), tuple(h.strip() for h in hashes))
    return pins


def torch_spec() -> SpecifierSet:
    """The Makefile's TORCH_SPEC, the torch every environment of the project installs."""
    (spec,) = re.findall(r"^TORCH_SPEC \?= (\S+)$", (REPO_ROOT / "Makefile").read_text(), flags=re.MULTILINE)
    requirement = Requirement(spec)
    assert requirement.name == "torch", spec
    return requirement.specifier


def requirements(*extras: str) -> list[Requirement]:
    """pyproject.toml's dependencies and those of ``extras``, for the Linux x86_64 Python 3.11 the locks are for."""
    texts = PYPROJECT["dependencies"] + [text for extra in extras for text in PYPROJECT["optional-dependencies"][extra]]
    environment = {"python_version": "3.11", "sys_platform": "linux", "platform_machine": "x86_64"}
    return [r for r in map(Requirement, texts) if not r.marker or r.marker.evaluate(environment)]


def test_the_installed_packages_are_the_locked_ones():
    """The suite's verdict is about the locked versions only while those are what is installed: a stale .venv
    (after a pull that moved the lock), a hand-installed version or a package beside the lock (which can switch
    code paths on, as liger-kernel would) is named here, with its fix."""
    pins = read_lock(LOCK)
    installed = {canonicalize_name(d.metadata["Name"]): Version(d.version) for d in importlib.metadata.distributions()}
    drift = [
        f"  {name} {installed[name]} is installed; the lock holds {pin.version}"
        if name in installed
        else f"  {name} is not installed; the lock holds {pin.version}"
        for name, pin in sorted(pins.items())
        if installed.get(name) != pin.version
    ]
    torch = installed.get("torch")
    if torch is None or not torch_spec().contains(torch, prereleases=True):
        found = f"torch {torch} is installed" if torch else "torch is not installed"
        drift.append(f"  {found}; the Makefile's TORCH_SPEC asks for torch{torch_spec()}")
    beside = sorted(installed.keys() - pins.keys() - {"torch", canonicalize_name(PYPROJECT["name"])})
    fixes = ["Run `make install`: it installs exactly the lock, and torch from TORCH_SPEC."] if drift else []
    if beside:
        fixes.append(f"Remove what the lock does not hold: `{VENV_PIP} uninstall {' '.join(beside)}`.")
    assert not drift and not beside, (
        f"This environment differs from {LOCK.name}, the versions the suite is known to pass with:\n"
        + "\n".join(drift + [f"  {name} {installed[name]} is installed and not in the lock" for name in beside])
        + "\n"
        + " ".join(fixes)
    )


@pytest.mark.parametrize(("lock", "extras"), [(LOCK, ("local", "test")), (IMAGE_LOCK, ("gpu",))], ids=["dev", "image"])
def test_each_lock_holds_what_pyproject_asks_for(lock, extras):
    """A dependency added to pyproject.toml, or a range moved past the pinned version, needs a new lock; without
    one `make install` would leave the package out and the image would not build."""
    pins = read_lock(lock)
    stale = [
        f"  {requirement}: the lock holds {pins[name].version if name in pins else 'nothing'}"
        for requirement in requirements(*extras)
        if (name := canonicalize_name(requirement.name)) != "torch"
        and (name not in pins or not requirement.specifier.contains(pins[name].version, prereleases=True))
    ]
    assert not stale, (
        f"{lock.name} is older than pyproject.toml:\n"
        + "\n".join(stale)
        + "\nRun `make lock` (`make lock LOCK_UPGRADE=` keeps the other pins), then recompile and test."
    )


def test_the_image_runs_the_versions_the_suite_passed_with():
    """Every package the image shares with the development environment is at the version the suite ran; the image
    adds only the gpu extra and the CUDA build of the same torch."""
    dev, image = read_lock(LOCK), read_lock(IMAGE_LOCK)
    differing = {
        name: f"{dev[name].version} here, {image[name].version} in the image"
        for name in dev.keys() & image.keys()
        if dev[name].version != image[name].version
    }
    assert not differing, f"{differing}: run `make lock`, which resolves the image's lock within {LOCK.name}"
    assert "torch" not in dev and torch_spec().contains(image["torch"].version)
    assert not [name for name in dev if CUDA_ONLY.match(name)], "the CPU environment's lock holds CUDA packages"
    assert any(CUDA_ONLY.match(name) for name in image), "the image's lock holds no CUDA packages: not the CUDA torch"
    gpu_extra = {canonicalize_name(Requirement(text).name) for text in PYPROJECT["optional-dependencies"]["gpu"]}
    assert gpu_extra <= image.keys() and not gpu_extra & dev.keys()


@pytest.mark.parametrize("lock", [LOCK, IMAGE_LOCK, BUILD_LOCK], ids=["dev", "image", "build"])
def test_every_pin_carries_its_hashes(lock):
    """pip installs a lock with --require-hashes, so a downloaded file that differs from the one locked is refused;
    a pin without hashes (a hand edit) would stop the install, in the image build only where nobody runs it here."""
    unhashed = [name for name, pin in read_lock(lock).items() if not pin.hashes]
    assert not unhashed
    assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for pin in read_lock(lock).values() for h in pin.hashes)


def build_requirements() -> list[tuple[Requirement, list[str]]]:
    """Each requirement of requirements-build.in with the packages its ``# for`` comment says it builds."""
    entries = []
    for line in BUILD_IN.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        requirement_text, _, comment = line.partition("#")
        built = re.fullmatch(r"\s*for ([\w.-]+(?: [\w.-]+)*)(?: \(.*\))?\s*", comment)
        assert built, f"{BUILD_IN.name}: name the packages it builds after '# for': {line}"
        entries.append((Requirement(requirement_text.strip()), built.group(1).split()))
    return entries


def test_the_build_lock_holds_what_the_image_builds_its_sdists_with():
    """The image builds llama-cpp-python, the other packages requirements-build.in names and the project from
    source, with --no-build-isolation, so with what requirements-build.lock installed: each of their build
    requirements must be pinned there, with hashes, or the build fails (or, with isolation, pip would fetch it
    unhashed). The build lock shares its versions with the image's lock, which the image installs over it."""
    build, image = read_lock(BUILD_LOCK), read_lock(IMAGE_LOCK)
    project = canonicalize_name(PYPROJECT["name"])
    entries = build_requirements()
    built = {canonicalize_name(name) for _, names in entries for name in names}
    assert {"llama-cpp-python", project} <= built, built
    assert not built - image.keys() - {project}, f"not in {IMAGE_LOCK.name}: {sorted(built - image.keys())}"
    needed = entries + [
        (Requirement(text), [project])
        for text in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    ]
    unmet = [
        f"  {requirement} (for {' '.join(names)}): {BUILD_LOCK.name} holds "
        + (str(build[name].version) if name in build else "nothing")
        for requirement, names in needed
        if (name := canonicalize_name(requirement.name)) not in build
        or not build[name].hashes
        or not requirement.specifier.contains(build[name].version, prereleases=True)
    ]
    assert not unmet, f"{BUILD_LOCK.name} is older than {BUILD_IN.name}:\n" + "\n".join(unmet) + "\nRun `make lock`."
    differing = [name for name in build.keys() & image.keys() if build[name].version != image[name].version]
    assert not differing, f"{differing}: run `make lock`, which resolves {BUILD_LOCK.name} within {IMAGE_LOCK.name}"


def test_the_image_installs_the_build_lock_before_it_builds():
    """The Containerfile installs requirements-build.lock first, hashed and from wheels only (nothing of it is
    built), then the image's lock and the project with --no-build-isolation: every build uses exactly those files."""
    commands = [command.split() for command in install_commands()]
    build_lock = f"-r {BUILD_LOCK.name}"
    assert build_lock in " ".join(commands[0]), "the build lock must be the first install"
    for flag in ("--require-hashes", "--no-deps", "--only-binary :all:"):
        assert flag in " ".join(commands[0]), f"the build lock's install lacks {flag}"
    assert [i for i, command in enumerate(commands) if build_lock in " ".join(command)] == [0]
    for command in commands[1:]:
        assert "--no-build-isolation" in command, f"builds in an unhashed environment: {' '.join(command)}"
    (image_install,) = [command for command in commands if f"-r {IMAGE_LOCK.name}" in " ".join(command)]
    assert "--require-hashes" in image_install
    text = (REPO_ROOT / "Containerfile").read_text()
    assert re.search(rf"^COPY [^\n]*\b{re.escape(BUILD_LOCK.name)}\b", text, flags=re.MULTILINE)
