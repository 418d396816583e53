"""Fingerprint check before training: the CLI, and what its KFP component runs.

    python -m components.publish.change_check --stats local-run/workspace/runs/RUN/data/stats.json \\
        --workspace-root local-run/workspace [--repo-id my-org/my-model] [--force]

Prints whether the prepared data differs from the data of the last published
model (see ``components.publish.changes``); the pipeline skips training, export
and publishing when it does not, and then runs the steps after publish that the
published version still lacks (its run failed after publishing), on it. Exit status 0 either way; 2 when a repository id
is given without ``HF_TOKEN`` (with ``--force`` too: the run would publish to it).
"""

import argparse
from pathlib import Path
from typing import Any, Mapping

from common.errors import UserError, exit_on_user_error
from common.records import DataStats
from common.run_layout import DATA_STATS, TRAIN, stage_dir
from components.hub_auth import require_token
from components.publish.changes import DataChange, compare_with_published, listed

# What the check_data_changed component returns: whether to train, why, whether to finish the published version's
# steps after publish, and that version's run id and train directory (empty when there is nothing to finish).
CheckOutputs = tuple[bool, str, bool, str, str]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m components.publish.change_check",
        description="Tell whether the prepared data differs from the data of the last published model.",
    )
    parser.add_argument(
        "--stats", required=True, type=Path, help="the data stage's stats.json, holding the fingerprint"
    )
    parser.add_argument(
        "--workspace-root", required=True, help="the workspace holding published/ (the PVC, or local-run/workspace)"
    )
    parser.add_argument(
        "--repo-id", default="", help="the Hub repository the pipeline publishes to (empty: the dry-run record)"
    )
    parser.add_argument("--force", action="store_true", help="report 'changed' whatever the data")
    return parser


def _stats(stats_path: Path) -> DataStats:
    if stats := DataStats.read(stats_path):
        return stats
    raise UserError(f"{stats_path} does not exist; pass the data stage's stats.json (it holds the fingerprint).")


def describe(change: DataChange) -> str:
    if change.changed:
        verdict = "data changed: training runs"
    elif change.finish:
        verdict = (
            f"data unchanged: training is skipped, and {listed(change.finish)} run on the published version "
            f"(run {change.version_run_id})"
        )
    else:
        verdict = "data unchanged: training is skipped"
    return f"{verdict}. Why: {change.reason}"


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    token = require_token(args.repo_id)  # before anything, force or not: the run would publish to it
    stats = _stats(args.stats)
    change = compare_with_published(
        stats.fingerprint, args.repo_id, args.workspace_root, args.force, token, lineage=stats.lineage
    )
    print(describe(change), flush=True)


@exit_on_user_error
def run_in_pipeline(fingerprint: str, data_dir: str, repo_id: str, workspace_root: str, force: bool) -> CheckOutputs:
    """What the KFP component does: decide and say why; return (changed, reason, finish, the run id and train
    directory of the version to finish). ``data_dir``'s stats.json gives the sources' lineage."""
    token = require_token(repo_id)
    lineage = _stats(Path(data_dir) / DATA_STATS).lineage
    change = compare_with_published(fingerprint, repo_id, workspace_root, force, token, lineage=lineage)
    print(describe(change), flush=True)
    version = change.version_run_id
    train_dir = str(stage_dir(workspace_root, version, TRAIN)) if version else ""
    return change.changed, change.reason, bool(change.finish), version, train_dir


@exit_on_user_error
def run_step(inputs: Mapping[str, Any]) -> CheckOutputs:
    """What the ``check_data_changed`` component calls with every input by name; returns ``CheckOutputs``."""
    return run_in_pipeline(
        inputs["fingerprint"], inputs["data_dir"], inputs["repo_id"], inputs["workspace_root"], inputs["force"]
    )


if __name__ == "__main__":
    main()
