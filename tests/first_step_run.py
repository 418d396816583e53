"""Run the pipeline's first step, the generated ``validate_parameters`` component, in a real process.

The step's body is what its pod runs: the run form's defaults with ``overrides``,
in a process whose environment is exactly ``env`` plus what Python needs, so a
test decides which Secrets the pod got (``HF_TOKEN`` from hf-token, ``HF_READ_TOKEN``
from hf-read-token, ``DATASET_URL``) as the optional Secret mounts of
``pipelines/fine_tune.py`` would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from conftest import REPO_ROOT

SCRIPT = """
import json, sys
from components.run_form.command_line import defaults_of
from pipelines.fine_tune import fine_tune_pipeline
from pipelines.first_step import validate_parameters

validate_parameters.python_func(**{**defaults_of(fine_tune_pipeline), **json.loads(sys.argv[1])})
"""
# No benchmark, so the step does not load lm-eval's task registry (seconds) to check the names.
QUICK = {"benchmark_tasks": ""}
# Nothing of the caller's Secrets reaches the step unless a test passes it.
SECRET_VARIABLES = ("HF_TOKEN", "HF_READ_TOKEN", "DATASET_URL")


def run_first_step(overrides: dict[str, Any], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``validate_parameters`` with the run form's defaults and ``overrides``, the Secrets' variables in ``env``."""
    environment = {key: value for key, value in os.environ.items() if key not in SECRET_VARIABLES}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps({**QUICK, **overrides})],
        cwd=REPO_ROOT,
        env={**environment, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def paragraph(stderr: str) -> str:
    """The step's error as one line; it must be a single ``error:`` paragraph, not a traceback."""
    assert "Traceback" not in stderr, stderr
    assert stderr.startswith("error: ") and "\n\n" not in stderr.strip(), stderr
    return " ".join(stderr.split())
