"""README.md holds the overview and the stage table once; docs/index.md includes them, and the links work in both.

MkDocs (``pymdownx.snippets``) copies the README's marked sections into docs/index.md. The table's links are
reference links (``[train][stage-train]``), so that each file resolves them against its own folder: README.md
into ``docs/``, docs/index.md beside it. ``mkdocs build --strict`` checks docs/index.md's targets, but not that a
label is defined (an undefined one renders as plain text) nor README.md's links, which only GitHub renders.
"""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
INDEX = REPO_ROOT / "docs" / "index.md"
INCLUDE = re.compile(r'^--8<-- "README\.md:(\w+)"$', re.MULTILINE)
REFERENCE = re.compile(r"\]\[([\w-]+)\]")
DEFINITION = re.compile(r"^\[([\w-]+)\]: (\S+)$", re.MULTILINE)
INLINE_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def section(text: str, name: str) -> str:
    return text.split(f"<!-- --8<-- [start:{name}] -->", 1)[1].split(f"<!-- --8<-- [end:{name}] -->", 1)[0]


def test_docs_index_includes_sections_the_readme_has():
    readme, included = README.read_text(), INCLUDE.findall(INDEX.read_text())
    assert included == ["overview", "stages"]
    for name in included:
        assert f"[start:{name}]" in readme and f"[end:{name}]" in readme, name


def test_every_link_label_of_the_included_sections_is_defined_in_both_files_for_the_same_page():
    readme = README.read_text()
    labels = {
        label for name in INCLUDE.findall(INDEX.read_text()) for label in REFERENCE.findall(section(readme, name))
    }
    assert labels >= {"stage-store", "stage-register", "stage-serve"}
    in_readme, in_index = dict(DEFINITION.findall(readme)), dict(DEFINITION.findall(INDEX.read_text()))
    for label in sorted(labels):
        assert in_readme[label] == f"docs/{in_index[label]}", label


def test_the_readmes_links_point_at_files_that_exist():
    """GitHub renders README.md; MkDocs never reads its links."""
    readme = README.read_text()
    targets = INLINE_LINK.findall(readme) + [target.split("#")[0] for _, target in DEFINITION.findall(readme)]
    missing = [target for target in targets if "://" not in target and not (REPO_ROOT / Path(target)).exists()]
    assert targets and missing == []
