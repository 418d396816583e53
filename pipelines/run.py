"""Run the whole pipeline on this machine through ``kfp.local``.

    python -m pipelines.run                                  # bundled defaults
    python -m pipelines.run --param eval_fraction=0.2 --param dataset_uri=data.jsonl
    python -m pipelines.run --output-dir /tmp/my-run

It executes the same DAG as the compiled pipeline, with a local directory
(``OUTPUT_DIR/workspace``) standing in for the PVC and KFP artifacts under
``OUTPUT_DIR/artifacts``. Parameters are checked before anything runs.
"""

import argparse
import sys
import warnings
from pathlib import Path

from common.errors import exit_on_user_error
from components.run_params import checked_arguments

DEFAULT_OUTPUT_DIR = Path("local-run")


def list_outputs(output_dir: Path) -> list[Path]:
    """Every file the run left under ``output_dir``, except KFP's own bookkeeping."""
    return sorted(p for p in output_dir.rglob("*") if p.is_file() and p.name != "executor_output.json")


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.run", description="Run the fine-tuning pipeline locally with kfp.local."
    )
    parser.add_argument(
        "--param", action="append", default=[], metavar="NAME=VALUE", help="set a pipeline parameter (repeatable)"
    )
    parser.add_argument(
        "--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR, help="where the run's files go (default: %(default)s)"
    )
    args = parser.parse_args(argv)

    from kfp import local

    from pipelines.fine_tune import build_pipeline
    from pipelines.workspace import LocalWorkspace

    output_dir = args.output_dir.resolve()
    workspace = LocalWorkspace(output_dir / "workspace")
    pipeline = build_pipeline(workspace)
    overrides = checked_arguments(args.param, pipeline)
    Path(workspace.root).mkdir(parents=True, exist_ok=True)

    # The runtime image is not a python:* image, which kfp.local warns about;
    # here every step runs in this very environment, where the project is installed.
    warnings.filterwarnings("ignore", message=".*non-Python base image.*", category=RuntimeWarning)
    local.init(
        runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(output_dir / "artifacts"), raise_on_error=True
    )
    print(f"running pipeline locally; outputs go to {output_dir}", flush=True)
    try:
        pipeline(**overrides)
    except RuntimeError as failure:  # kfp.local's way of saying a task failed
        print(f"\n{failure}\nThe failing step's log above says why; nothing after it ran.", file=sys.stderr)
        return 1
    print("\npipeline finished; outputs:")
    for path in list_outputs(output_dir):
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
