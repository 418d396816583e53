"""Publish stage: the CLI, and what its KFP component runs.

    HF_TOKEN=... python -m components.publish.stage --workspace-root local-run/workspace --run-id RUN \\
        --repo-id my-org/my-model
    python -m components.publish.stage --workspace-root local-run/workspace --run-id RUN   # dry run

Reads the run's train, evaluate and export files (common.run_layout), writes the upload
folder to ``<run>/publish/upload/`` and, with a repository id, commits it to the Hub as
one commit; a repository id without ``HF_TOKEN`` in the environment is refused (exit 2),
never a dry run. The token is read from the environment only; there is no option for it.
"""

import argparse
import shutil
from pathlib import Path
from typing import Any, Mapping

from common.cli_options import add_options, options_from, options_from_inputs
from common.errors import exit_on_user_error
from components.hub_auth import hub_token
from components.publish.options import PublishOptions
from components.publish.publish import PublishResult, publish


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m components.publish.stage",
        description="Upload a run's GGUF, Modelfile, reports and model card to the Hugging Face Hub as one commit "
        "(token from $HF_TOKEN, required with --repo-id), or, without --repo-id, write the folder that would be "
        "uploaded (dry run).",
    )
    parser.add_argument(
        "--workspace-root", required=True, help="the workspace holding runs/<run-id>/ (the PVC, or local-run/workspace)"
    )
    parser.add_argument("--run-id", required=True, help="the run whose model to publish")
    parser.add_argument(
        "--dataset-uri", default="", help="the run's dataset_uri, named in the model card (default: the bundled sample)"
    )
    add_options(parser, PublishOptions)
    return parser


def summary(result: PublishResult) -> str:
    verb = "would upload" if result.dry_run else "uploaded"
    return "\n".join(
        [
            f"{verb} {len(result.files)} files, {result.total_bytes / 1e6:.1f} MB:",
            *(f"  {name}" for name in result.files),
            f"folder  -> {result.upload_dir}",
            f"result  -> {result.location}",
            f"record  -> {result.record_path}",
        ]
    )


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    result = publish(
        args.workspace_root, args.run_id, args.dataset_uri, options_from(args, PublishOptions), hub_token()
    )
    print(summary(result), flush=True)


@exit_on_user_error
def run_in_pipeline(
    workspace_root: str, run_id: str, dataset_uri: str, options: PublishOptions, model_card, metrics
) -> tuple[str, bool]:
    """What the KFP component does: publish, show the model card in the UI; return (location, dry_run)."""
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # one line per refresh in a pod log; the summary below says what was sent
    result = publish(workspace_root, run_id, dataset_uri, options, hub_token())
    print(summary(result), flush=True)
    Path(model_card.path).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(result.upload_dir / "README.md", model_card.path)
    model_card.metadata.update({"repo_id": options.repo_id, "location": result.location, "dry_run": result.dry_run})
    metrics.log_metric("uploaded_files" if not result.dry_run else "dry_run_files", len(result.files))
    metrics.log_metric("upload_megabytes", round(result.total_bytes / 1e6, 3))
    return result.location, result.dry_run


@exit_on_user_error
def run_step(inputs: Mapping[str, Any]) -> tuple[str, bool]:
    """What the ``publish_model`` component calls with every input by name; returns (location, dry_run)."""
    return run_in_pipeline(
        inputs["workspace_root"],
        inputs["run_id"],
        inputs["dataset_uri"],
        options_from_inputs(PublishOptions, inputs),
        inputs["model_card"],
        inputs["metrics"],
    )


if __name__ == "__main__":
    main()
