"""Where a run keeps its large files on the shared workspace (the PVC).

Every run writes under ``<workspace root>/runs/<run id>/<stage>/``, so runs that
share an existing PVC, such as scheduled retraining runs, never overwrite each
other.
"""

from pathlib import Path


def stage_dir(workspace_root: str, run_id: str, stage: str) -> Path:
    """The directory of ``stage`` for run ``run_id``."""
    return Path(workspace_root) / "runs" / run_id / stage
