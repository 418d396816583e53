"""tools/install_lock.py: `make install`'s pips, one per core, install exactly the lock and never the same file."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import subprocess
import sys
import venv
import zipfile
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from packaging.utils import canonicalize_name

sys.path.insert(0, str(REPO_ROOT / "tools"))
from install_lock import family, groups, pins  # noqa: E402 (tools/ is scripts, not a package)

LOCK = REPO_ROOT / "requirements.lock"


@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_every_pin_of_the_lock_is_dealt_once_and_a_family_stays_together(count):
    locked = pins(LOCK.read_text())
    dealt = groups(list(locked), count)

    names = [name for group in dealt for name in group]
    assert sorted(names) == sorted(set(locked) - {"pip"})  # pip goes first, alone
    assert len(dealt) == min(count, len({family(name) for name in names}))
    group_of = {name: index for index, group in enumerate(dealt) for name in group}
    for name in names:
        assert group_of[name] == group_of[min(n for n in names if family(n) == family(name))]
    assert all(locked[name].startswith(f"{name}==") and " --hash=sha256:" in locked[name] for name in locked)


def test_the_files_that_two_installed_distributions_write_belong_to_one_family():
    """The suite's environment is the lock installed: were two families to write one file, two pips could."""
    writers = defaultdict(set)
    for distribution in importlib.metadata.distributions():
        name = canonicalize_name(distribution.metadata["Name"])
        for file in distribution.files or ():
            if "__pycache__" not in file.parts:
                writers[str(file)].add(name)
    shared = {path: names for path, names in writers.items() if len(names) > 1}

    assert {path for path, names in shared.items() if len({family(name) for name in names}) > 1} == set()
    assert any({"mlflow", "mlflow-skinny"} <= names for names in shared.values())  # the family that does share


def wheel(directory: Path, name: str, files: dict[str, str]) -> Path:
    """A minimal pure-Python wheel of ``name`` 1.0 holding ``files``."""
    path = directory / f"{name.replace('-', '_')}-1.0-py3-none-any.whl"
    info = f"{name.replace('-', '_')}-1.0.dist-info"
    contents = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def record_line(file: str, text: str) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        return f"{file},sha256={digest},{len(text.encode())}\n"

    record = "".join(record_line(file, text) for file, text in contents.items()) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        for file, text in {**contents, f"{info}/RECORD": record}.items():
            archive.writestr(file, text)
    return path


def lock_line(path: Path, name: str) -> str:
    return f"{name}==1.0 \\\n    --hash=sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}\n"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """Four distributions in three families; beta and beta-extra write the same module, as mlflow's family does."""
    directory = tmp_path_factory.mktemp("wheels")
    shared = {"beta/shared.py": "VALUE = 1\n"}
    return {
        "alpha": wheel(directory, "alpha", {"alpha/__init__.py": "NAME = 'alpha'\n"}),
        "beta": wheel(directory, "beta", {**shared, "beta/__init__.py": ""}),
        "beta-extra": wheel(directory, "beta-extra", {**shared, "beta/extra.py": "EXTRA = 2\n"}),
        "gamma": wheel(directory, "gamma", {"gamma/__init__.py": "NAME = 'gamma'\n"}),
    }


def install_into(environment: Path, lock: Path, wheels_dir: Path) -> subprocess.CompletedProcess:
    venv.EnvBuilder(system_site_packages=True).create(environment)  # the base interpreter's pip, no ensurepip
    options = ["--pip-option=--no-index", f"--pip-option=--find-links={wheels_dir}", "--processes=2"]
    command = [environment / "bin" / "python", REPO_ROOT / "tools" / "install_lock.py", lock, *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_two_pips_install_every_locked_wheel_and_a_bad_hash_is_named(wheels, tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        "# a comment, as uv writes them\n" + "".join(lock_line(path, name) for name, path in wheels.items())
    )
    wheels_dir = next(iter(wheels.values())).parent

    result = install_into(tmp_path / "env", lock, wheels_dir)

    assert result.returncode == 0, result.stderr
    check = "import alpha, beta.shared, beta.extra, gamma; print(alpha.NAME, beta.shared.VALUE, beta.extra.EXTRA)"
    imported = subprocess.run([tmp_path / "env" / "bin" / "python", "-c", check], capture_output=True, text=True)
    assert imported.stdout.split() == ["alpha", "1", "2"], imported.stderr

    tampered = tmp_path / "tampered.lock"
    tampered.write_text(lock.read_text().replace(lock_line(wheels["gamma"], "gamma"), "gamma==1.0 --hash=sha256:00\n"))
    result = install_into(tmp_path / "env-2", tampered, wheels_dir)

    assert result.returncode == 1
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in result.stderr
    paragraph = result.stderr[result.stderr.index("error: pip could not install") :]
    # families dealt in name order to two pips: alpha and gamma to one, which refuses both, beta's to the other
    assert paragraph.startswith(f"error: pip could not install alpha, gamma from {tampered}")
    assert "Traceback" not in paragraph
    python = tmp_path / "env-2" / "bin" / "python"
    assert subprocess.run([python, "-c", "import beta.extra"]).returncode == 0  # a rerun installs only what is missing
    assert subprocess.run([python, "-c", "import alpha"], capture_output=True).returncode == 1
