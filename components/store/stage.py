"""Model storage stage: copy the published model version to the storage targets the run names.

    python -m components.store.stage --workspace-root local-run/workspace --run-id RUN \\
        --model-name smol-ft --s3-uri s3://models/team --oci-uri oci://quay.io/team/smol-ft

The version is the publish stage's upload folder (``<run>/publish/upload/``,
written by a dry run too): the GGUF, Modelfile, model card and reports, and,
when publish_merged says so, the merged checkpoint at its top, which a serving
runtime loads as it is.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Mapping

from common.cli_options import add_options, options_from, options_from_inputs
from common.errors import UserError, exit_on_user_error
from common.records import StoredCopies, StoredCopy
from common.run_layout import PUBLISH, STORE, STORED, UPLOAD, stage_dir
from components.champion.record import completed_at, completes
from components.champion.version import stored_copies, trained_from
from components.export.options import model_name_of
from components.store.oci_target import image_uri, push_version
from components.store.options import StorageOptions
from components.store.s3_target import upload_version, version_uri


@completes(STORE)
def store(workspace_root: str, run_id: str, model_name: str, options: StorageOptions) -> list[StoredCopy]:
    """Copy run ``run_id``'s version to every target ``options`` names; the copies made, also recorded in
    ``store/stored.json`` for the run summary and the registration."""
    folder = stage_dir(workspace_root, run_id, PUBLISH) / UPLOAD
    if not (folder / "README.md").is_file():
        raise UserError(
            f"{folder} holds no published version (no model card): the publish step writes it, a dry run too. "
            "Run the publish stage for this run first."
        )
    copies = []
    if options.s3_uri:
        hint = f"in the cluster the step reads them from the Secret '{options.s3_secret}' (model_s3_secret)"
        copies.append(upload_version(folder, version_uri(options.s3_uri, model_name, run_id), hint))
    store_dir = stage_dir(workspace_root, run_id, STORE)
    if options.oci_uri:
        hint = f"in the cluster the step reads them from the Secret '{options.oci_secret}' (model_oci_secret)"
        copies.append(push_version(folder, image_uri(options.oci_uri, run_id), store_dir, hint))
    StoredCopies(tuple(copies)).write(store_dir / STORED)
    return copies


def summary(copies: list[StoredCopy]) -> str:
    if not copies:
        return "no storage target is set (model_s3_uri, model_oci_uri): nothing copied"
    return "\n".join(
        f"copied {c.files} files, {c.total_bytes / 1e6:.1f} MB -> {c.uri}" + (f" ({c.digest})" if c.digest else "")
        for c in copies
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m components.store.stage",
        description="Copy a run's published model version to its storage targets (S3, an OCI registry).",
    )
    parser.add_argument("--workspace-root", required=True, help="the workspace holding runs/<run-id>/")
    parser.add_argument("--run-id", required=True, help="the run whose version to copy")
    parser.add_argument("--model-name", required=True, help="the model's name: the folder its versions go in")
    add_options(parser, StorageOptions)
    return parser


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    print(summary(store(args.workspace_root, args.run_id, args.model_name, options_from(args, StorageOptions))))


@exit_on_user_error
def run_step(inputs: Mapping[str, Any]) -> str:
    """What the ``store_model`` component calls with every input by name; returns the first copy's URI (empty:
    none).

    The model's name is the export's: ``model_name``, or the base model's name followed by -ft. A version already
    stored (a retried step, or a run finishing the published version's steps) is not copied again.
    """
    if done := completed_at(inputs["workspace_root"], inputs["run_id"], STORE):
        print(f"run {inputs['run_id']}'s version was stored already, at {done}: not copied again", flush=True)
        earlier = stored_copies(inputs["workspace_root"], inputs["run_id"])
        return earlier[0].uri if earlier else ""
    model_name = model_name_of(inputs["model_name"], trained_from(Path(inputs["train_dir"])))
    copies = store(inputs["workspace_root"], inputs["run_id"], model_name, options_from_inputs(StorageOptions, inputs))
    print(summary(copies), flush=True)
    return copies[0].uri if copies else ""


if __name__ == "__main__":
    main()
