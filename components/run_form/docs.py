"""The run parameters described for people: KFP's parameter descriptions and the reference table.

Both are generated from the fields' help texts, so the run form in OpenShift AI,
the compiled YAML and the documentation say the same words.
"""

from __future__ import annotations

import json
from typing import Any

from components.run_form.table import RUN_PARAMETERS


def docstring(summary: str) -> str:
    """``summary`` and a Google-style ``Args:`` section: where KFP reads each parameter's description."""
    return summary + "\n\nArgs:\n" + "".join(f"    {p.name}: {p.help}\n" for p in RUN_PARAMETERS)


def shown_default(value: Any) -> str:
    """A default as the reference shows it: empty, or the value as it is typed into the run form."""
    if value == "":
        return "empty"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{json.dumps(value) if isinstance(value, (bool, list, dict)) else value}`"


def reference_table() -> str:
    """The run-parameter table, row for row."""
    rows = [f"| `{p.name}` | {shown_default(p.default)} | {p.help} |" for p in RUN_PARAMETERS]
    return "\n".join(["| parameter | default | meaning |", "| --- | --- | --- |", *rows]) + "\n"
