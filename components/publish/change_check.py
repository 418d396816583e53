"""Fingerprint check before training: the CLI, and what its KFP component runs.

    python -m components.publish.change_check --stats local-run/workspace/runs/RUN/data/stats.json \\
        --workspace-root local-run/workspace [--repo-id my-org/my-model] [--force]

Prints whether the prepared data differs from the data of the last published
model (see ``components.publish.changes``); the pipeline skips training, export
and publishing when it does not. Exit status 0 either way.
"""

import argparse
import json
from pathlib import Path
from typing import Any, Mapping

from common.errors import UserError, exit_on_user_error
from components.hub_auth import hub_token
from components.publish.changes import DataChange, compare_with_published


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


def _fingerprint(stats_path: Path) -> str:
    try:
        return json.loads(stats_path.read_text(encoding="utf-8"))["fingerprint"]
    except (OSError, ValueError, KeyError) as error:
        raise UserError(
            f"Cannot read the fingerprint from {stats_path} ({error}); pass the data stage's stats.json."
        ) from None


def describe(change: DataChange) -> str:
    return (
        f"{'data changed: training runs' if change.changed else 'data unchanged: training is skipped'}. "
        f"Why: {change.reason}"
    )


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    change = compare_with_published(
        _fingerprint(args.stats), args.repo_id, args.workspace_root, args.force, hub_token()
    )
    print(describe(change), flush=True)


@exit_on_user_error
def run_in_pipeline(fingerprint: str, repo_id: str, workspace_root: str, force: bool) -> tuple[bool, str]:
    """What the KFP component does: decide and say why; return (changed, reason)."""
    change = compare_with_published(fingerprint, repo_id, workspace_root, force, hub_token())
    print(describe(change), flush=True)
    return change.changed, change.reason


@exit_on_user_error
def run_step(inputs: Mapping[str, Any]) -> tuple[bool, str]:
    """What the ``check_data_changed`` component calls with every input by name; returns (changed, reason)."""
    return run_in_pipeline(inputs["fingerprint"], inputs["repo_id"], inputs["workspace_root"], inputs["force"])


if __name__ == "__main__":
    main()
