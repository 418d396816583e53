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
from install_lock import FIRST, LockError, family, parts, pins  # noqa: E402 (tools/ is scripts, not a package)

LOCK = REPO_ROOT / "requirements.lock"
HASH = "--hash=sha256:" + "ab" * 32


def test_a_pin_is_read_with_its_markers_and_hashes_under_its_canonical_name():
    text = f"""# written by uv
Foo_Bar==1.0 ; python_version < "3.12" \\
    {HASH}
    # via something

zipp==4.1.2 \\
    {HASH} \\
    {HASH.replace("ab", "cd")}
"""
    assert pins(text, "x.lock") == {
        "foo-bar": f'Foo_Bar==1.0 ; python_version < "3.12" {HASH}',
        "zipp": f"zipp==4.1.2 {HASH} {HASH.replace('ab', 'cd')}",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"zipp==4.1.2 {HASH}\n-e ./local\n", "x.lock, line 2: '-e ./local' is not a name==version pin"),
        (f"# head\nzipp>=4 \\\n  {HASH}\n", "x.lock, line 2: 'zipp>=4 --hash"),
        (f"Foo_Bar==1 {HASH}\nfoo-bar==2 {HASH}\n", "x.lock, line 2: foo-bar is pinned twice"),
        ("# nothing but comments\n\n", "x.lock holds no name==version pin"),
    ],
)
def test_a_line_that_is_not_a_pin_is_refused_not_skipped(text, message):
    with pytest.raises(LockError) as error:
        pins(text, "x.lock")
    assert str(error.value).startswith(message)


@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_every_pin_of_the_lock_is_dealt_once_and_a_family_stays_together(count):
    locked = pins(LOCK.read_text(), "requirements.lock")
    dealt = parts(list(locked), count)

    names = [name for part in dealt for name in part]
    assert sorted(names) == sorted(set(locked) - set(FIRST))
    assert set(FIRST) <= set(locked)  # both are pinned, so installed first
    assert len(dealt) == min(count, len({family(name) for name in names}))
    part_of = {name: index for index, part in enumerate(dealt) for name in part}
    for name in names:
        assert part_of[name] == part_of[min(n for n in names if family(n) == family(name))]
    assert all(" --hash=sha256:" in locked[name] for name in locked)


def test_only_a_family_shares_files_and_only_the_first_step_writes_startup_files():
    """The suite's environment is the lock installed: were two families to write one file, or a part to write a
    ``.pth`` file (which every starting interpreter reads), two pips could collide."""
    writers = defaultdict(set)
    for distribution in importlib.metadata.distributions():
        name = canonicalize_name(distribution.metadata["Name"])
        for file in distribution.files or ():
            if "__pycache__" not in file.parts:
                writers[str(file)].add(name)
    shared = {path: names for path, names in writers.items() if len(names) > 1}
    across = {path: names for path, names in shared.items() if len({family(name) for name in names}) > 1}
    startup = {path: names - {"llm-finetune-pipeline"} for path, names in writers.items() if path.endswith(".pth")}

    assert not across, f"Families that write one file: {across}. Add them to one family in tools/install_lock.py."
    assert any({"mlflow", "mlflow-skinny"} <= names for names in shared.values())  # the family that does share
    assert set().union(*startup.values()) <= set(FIRST), f"Install these first, in FIRST: {startup}"


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
    """Five distributions in four families; beta and beta-extra write the same module, as mlflow's family does."""
    directory = tmp_path_factory.mktemp("wheels")
    shared = {"beta/shared.py": "VALUE = 1\n"}
    return {
        "alpha": wheel(directory, "alpha", {"alpha/__init__.py": "NAME = 'alpha'\n"}),
        "beta": wheel(directory, "beta", {**shared, "beta/__init__.py": ""}),
        "beta-extra": wheel(directory, "beta-extra", {**shared, "beta/extra.py": "EXTRA = 2\n"}),
        "gamma": wheel(directory, "gamma", {"gamma/__init__.py": "NAME = 'gamma'\n"}),
        "delta": wheel(directory, "delta", {"delta/__init__.py": "NAME = 'delta'\n"}),  # unhashed, as torch is
    }


def install_into(environment: Path, lock: Path, wheels_dir: Path, *also: str) -> subprocess.CompletedProcess:
    """The script in a new environment whose pip is the base interpreter's (needs one there: CPython's has)."""
    if not (environment / "bin" / "python").exists():
        venv.EnvBuilder(system_site_packages=True).create(environment)
    options = ["--pip-option=--no-index", f"--pip-option=--find-links={wheels_dir}", "--processes=2"]
    command = [environment / "bin" / "python", REPO_ROOT / "tools" / "install_lock.py", lock, *options]
    return subprocess.run([*command, *(f"--also={spec}" for spec in also)], capture_output=True, text=True, timeout=300)


def imports(environment: Path, *modules: str) -> bool:
    check = [environment / "bin" / "python", "-c", f"import {', '.join(modules)}"]
    return subprocess.run(check, capture_output=True).returncode == 0


def error_paragraph(result: subprocess.CompletedProcess) -> str:
    paragraph = result.stderr[result.stderr.index("error: ") :]
    assert "Traceback" not in result.stderr and len(paragraph.strip().splitlines()) == 1, result.stderr
    return paragraph


@pytest.mark.slow
def test_two_pips_install_the_lock_and_a_rerun_installs_what_a_bad_hash_kept_out(wheels, tmp_path):
    hashed = {name: path for name, path in wheels.items() if name != "delta"}
    lock = tmp_path / "requirements.lock"
    lock.write_text("# as uv writes them\n" + "".join(lock_line(path, name) for name, path in hashed.items()))
    wheels_dir = wheels["alpha"].parent

    result = install_into(tmp_path / "env", lock, wheels_dir, "delta==1.0")

    assert result.returncode == 0, result.stderr
    assert imports(tmp_path / "env", "alpha", "beta.shared", "beta.extra", "gamma", "delta")

    tampered = tmp_path / "tampered.lock"
    tampered.write_text(lock.read_text().replace(lock_line(wheels["gamma"], "gamma"), f"gamma==1.0 {HASH}\n"))
    result = install_into(tmp_path / "env-2", tampered, wheels_dir)

    assert result.returncode == 1
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in result.stderr
    # families dealt in name order to two pips: alpha and gamma to one, which refuses both, beta's to the other
    assert error_paragraph(result).startswith(f"error: pip could not install alpha, gamma from {tampered} (")
    assert imports(tmp_path / "env-2", "beta.extra") and not imports(tmp_path / "env-2", "alpha")

    assert install_into(tmp_path / "env-2", lock, wheels_dir).returncode == 0  # the same command, the lock fixed
    assert imports(tmp_path / "env-2", "alpha", "beta.extra", "gamma")


@pytest.mark.slow
def test_a_spec_without_its_wheel_and_a_missing_lock_are_named(wheels, tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text(lock_line(wheels["alpha"], "alpha"))

    result = install_into(tmp_path / "env", lock, wheels["alpha"].parent, "epsilon==1.0")

    assert result.returncode == 1
    assert error_paragraph(result).startswith("error: pip could not install epsilon==1.0 (")
    assert imports(tmp_path / "env", "alpha")

    result = install_into(tmp_path / "env", tmp_path / "absent.lock", wheels["alpha"].parent)
    assert result.returncode == 2
    assert f"{tmp_path / 'absent.lock'} is not a file" in error_paragraph(result)
