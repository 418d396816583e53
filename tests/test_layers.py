"""The packages form layers: common <- trainer, gguf_export <- components <- pipelines.

A module may import its own package and the layers below it, never a layer above
or a package beside it (trainer and gguf_export run without each other: in the
training pods and in the standalone converter). Imports are read from the source
with ``ast`` (inside functions too), so a lazy import cannot hide an upward
dependency, and no module is executed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import REPO_ROOT

from common.run_layout import STAGES as RUN_FOLDERS

# package -> the packages it may import besides itself
ALLOWED = {
    "common": set(),
    "trainer": {"common"},
    "gguf_export": {"common"},
    "components": {"common", "trainer", "gguf_export"},
    "pipelines": {"common", "trainer", "gguf_export", "components"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(path: Path) -> set[str]:
    """The project modules ``path`` may import, by dotted name.

    ``from a.b import c`` yields ``a.b`` and ``a.b.c``: ``c`` may be a module of package ``a.b`` or a name in it.
    """
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {name for name in names if name.split(".")[0] in ALLOWED}
    return found


def modules() -> dict[str, Path]:
    return {module_name(path): path for package in ALLOWED for path in sorted((REPO_ROOT / package).rglob("*.py"))}


def test_no_module_imports_a_layer_above_or_beside_its_own():
    found = []
    for name, path in modules().items():
        package = name.split(".")[0]
        for imported in project_imports(path):
            target = imported.split(".")[0]
            if target != package and target not in ALLOWED[package]:
                found.append(f"{name} imports {imported}")
    assert found == []


def test_no_import_cycles_between_modules():
    """A cycle makes import order matter and ties modules that should be read (and changed) on their own."""
    known = modules()
    graph = {
        name: {imported for imported in project_imports(path) if imported in known and imported != name}
        for name, path in known.items()
    }
    cycles = []
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for imported in sorted(graph[name]):
            if state.get(imported) == "open":
                cycles.append(" -> ".join([*trail[trail.index(imported) :], imported]))
            elif imported not in state:
                visit(imported, [*trail, imported])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_the_checks_see_imports_inside_functions(tmp_path):
    """The walk must not miss the lazy imports this project uses to keep torch out of light modules."""
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from pipelines.fine_tune import build_pipeline\n    import components.run_form\n")
    assert {"pipelines.fine_tune", "components.run_form"} <= project_imports(module)


def test_gguf_export_and_common_import_without_torch():
    """The standalone converter runs where torch is not installed; its package and the leaf must not pull it in."""
    blocker = "import sys; sys.modules['torch'] = None; "
    code = blocker + "import common.atomic, common.cli_options, common.errors, common.run_layout, common.kube; "
    code += "import gguf_export.__main__, gguf_export.export, gguf_export.lora, gguf_export.modelfile"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_pipeline_commands_load_without_the_ml_libraries():
    """pipelines.compile, run and submit, and every step that reads the run form (the first step, for one), load the
    form and the DAG, never torch, transformers or datasets: those cost seconds of CPU in every such process, and the
    launcher pods run in 1 GiB."""
    blocker = "import sys; sys.modules.update(dict.fromkeys(('torch', 'transformers', 'datasets', 'peft', 'trl'))); "
    code = blocker + "import pipelines.compile, pipelines.run, pipelines.submit, components.run_form.options"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# What sits above the stages inside ``components``: the run form (it reads every stage's options) and the
# KFP adapters (they call every stage). A stage that imported them would load every other stage with it.
ABOVE_THE_STAGES = ("components.run_form", "components.pipeline_steps")
# The stage packages: each named as its folder in a run (common.run_layout.STAGES), and tokenise, whose token cache
# the runs share instead.
STAGES = (*RUN_FOLDERS, "tokenise")


def test_each_stage_package_is_named_as_its_run_folder():
    """One naming rule: the package, the run folder, the step and the docs page say ``store``, not ``storage``."""
    packages = {path.parent.name for path in (REPO_ROOT / "components").glob("*/stage.py")}
    assert packages == set(STAGES)
    assert {path.stem for path in (REPO_ROOT / "docs" / "stages").glob("*.md")} >= set(RUN_FOLDERS) - {"data"}


def test_the_published_model_is_read_through_the_champion_package():
    """Evaluation imported publish's modules for the published model, and store, register and serve reached into
    publish's and storage's modules for the version's records. Now the model users have now is
    ``components.champion``'s: it imports no stage, and no other stage imports publish or evaluation."""
    stage_packages = tuple(f"components.{stage}." for stage in STAGES)
    champion = [
        f"{name} imports {imported}"
        for name, path in modules().items()
        if name.startswith("components.champion.")
        for imported in project_imports(path)
        if imported.startswith(stage_packages)
    ]
    read_elsewhere = [
        f"{name} imports {imported}"
        for name, path in modules().items()
        if name.split(".")[:2] in [["components", stage] for stage in STAGES]
        for imported in project_imports(path)
        if imported.startswith(("components.publish.", "components.evaluate."))
        and imported.split(".")[1] != name.split(".")[1]
    ]
    assert champion == [] and read_elsewhere == []


def test_no_stage_imports_the_run_form_or_the_kfp_adapters():
    """The training launcher pod, for one, loads its own stage's modules and no other stage's options."""
    found = [
        f"{name} imports {imported}"
        for name, path in modules().items()
        if name.split(".")[:2] in [["components", stage] for stage in STAGES]
        for imported in project_imports(path)
        if imported.startswith(ABOVE_THE_STAGES)
    ]
    assert found == []
