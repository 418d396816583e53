"""Data preparation stage: the CLI, and what its KFP component runs.

    python -m components.data.stage --input 'data/*.jsonl' --output-dir out/
    python -m components.data.stage --input s3://bucket/qa/ --output-dir out/
    python -m components.data.stage --sources '[{"uri": "a.jsonl", "weight": 3}, {"uri": "b/", "weight": 1}]' \
        --output-dir out/

A URL input (https://, s3://, hf://datasets/owner/name) is first fetched into
``out/source/`` (see ``components.data.sources``); each source of a mixture into ``out/source/<n>/``.

In a pipeline the stage writes the Parquet files to the run's directory on the
shared workspace (where the training pods read them) and also returns them as
KFP Dataset artifacts, so they appear with lineage in the pipelines UI.
"""

import argparse
import dataclasses
import shutil
from pathlib import Path
from typing import Any, Mapping

from common.cli_options import add_options, options_from, options_from_inputs
from common.errors import UserError, exit_on_user_error
from common.run_layout import stage_dir
from components.benchmark_tasks.documents import task_documents
from components.benchmark_tasks.tasks import task_entries
from components.data import sources
from components.data.chunks import resolve_inputs
from components.data.mixture import SOURCES_HELP, DataSource, parse_sources
from components.data.options import PrepareOptions
from components.data.prepare import PrepareResult, SourceFiles, prepare
from components.data.sources import Located
from components.sample_data import bundled_dataset_path
from trainer.config import TrainConfig

SOURCE_DIR = "source"  # where a dataset given by URL is fetched to, inside the output directory


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m components.data.stage",
        description="Validate and normalise JSONL question/answer data into train/eval Parquet.",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--input",
        help=(
            "a .jsonl or .jsonl.gz file, a directory of them, a quoted glob, or a URL: "
            "https://..., s3://bucket/key-or-prefix, hf://datasets/owner/name"
        ),
    )
    which.add_argument("--sources", help=SOURCES_HELP)
    parser.add_argument(
        "--output-dir",
        required=True,
        type=Path,
        help="where train.parquet, eval.parquet, rejects.jsonl and stats.json go",
    )
    add_options(parser, PrepareOptions)
    add_options(parser.add_argument_group("the training option the data depends on"), TrainConfig, only=("objective",))
    benchmarks = parser.add_argument_group("the benchmarks the training rows are checked against")
    benchmarks.add_argument(
        "--benchmark-tasks",
        default="",
        help="comma-separated lm-eval task names, practical_skills_mc or task directories, as the run parameter "
        "benchmark_tasks takes them. Every document of each task is checked, and a task directory holding Python "
        "is refused (a pipeline run passes its benchmark_limit and benchmark_allow_code). Default: none.",
    )
    return parser


def summary(result: PrepareResult) -> str:
    stats = result.stats
    return "\n".join(
        [
            f"records {stats.records}: train {stats.train_rows}, eval {stats.eval_rows}, "
            f"rejected {stats.rejected}, duplicates {stats.duplicates}, overlapping the eval split "
            f"{stats.overlapping_eval}",
            f"fingerprint {stats.fingerprint}",
            *(f"source  {lineage.described()}" for lineage in stats.lineage),  # what each source was when read
            f"train   -> {result.train_path}",
            f"eval    -> {result.eval_path}",
            f"rejects -> {result.rejects_path}",
            f"report  -> {result.report_path}",
            f"stats   -> {result.stats_path}",
        ]
    )


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    options = options_from(args, PrepareOptions)
    benchmarks = task_documents(task_entries(args.benchmark_tasks), Path.cwd(), limit=0, allow_code=False)
    inputs = resolve_inputs_of(
        args.input or "", args.sources or "", args.output_dir / SOURCE_DIR, options, args.objective
    )
    print(summary(prepare(inputs, args.output_dir, options, args.objective, benchmarks)), flush=True)


def resolve_inputs_of(
    dataset_uri: str, dataset_sources: str, download_dir: Path, options: PrepareOptions, objective: str
) -> SourceFiles | list[SourceFiles]:
    """What ``prepare`` reads, each source with its files (a remote one fetched), its field_map (the run's where a
    source names none) and its server's version: ``dataset_uri``, or each of ``dataset_sources`` (fetched into
    ``download_dir/<n>``)."""
    try:
        listed = parse_sources(dataset_sources)
    except ValueError as error:
        raise UserError(f"dataset_sources {error}.") from None
    if not listed:
        try:
            located = locate_dataset_uri(dataset_uri, download_dir, objective)
        except UserError as error:  # the fetch's messages name the URI; the parameter is named here
            raise UserError(f"dataset_uri: {error}") from None
        shown = sources.describe_uri(dataset_uri) or located.input  # the bundled sample by its path
        return SourceFiles(
            DataSource(shown, field_map=options.field_map), resolve_inputs(located.input), located.remote
        )
    if dataset_uri.strip():
        raise UserError(
            "dataset_uri and dataset_sources are both set: a run reads one or the other. Add dataset_uri to "
            "dataset_sources as one more source, or clear one of them."
        )
    shutil.rmtree(download_dir, ignore_errors=True)  # a retried step fetches afresh
    resolved = []
    for number, source in enumerate(listed, start=1):
        try:
            located = locate_dataset_uri(source.uri, download_dir / str(number), objective)
            files = resolve_inputs(located.input)
        except UserError as error:
            raise UserError(f"dataset_sources, source {number} ({sources.describe_uri(source.uri)}): {error}") from None
        # Recorded (stats.json, the report, the card, the registry) without a query string or user info, which may
        # carry a credential the first step's check does not know by name.
        shown = dataclasses.replace(
            source, uri=sources.describe_uri(source.uri), field_map=source.field_map or options.field_map
        )
        resolved.append(SourceFiles(shown, files, located.remote))
    return resolved


def locate_dataset_uri(dataset_uri: str, download_dir: Path | None = None, objective: str = "sft") -> Located:
    """The input to read: the bundled sample data of ``objective``'s kind when ``dataset_uri`` is empty, a path or
    glob as is, and for a URL (https://, s3://, hf://datasets/...) the files fetched into ``download_dir``, with
    the version their server named."""
    dataset_uri = dataset_uri.strip()
    if not dataset_uri:
        return Located(str(bundled_dataset_path(objective)))
    if sources.is_remote(dataset_uri):
        if download_dir is None:
            raise ValueError("a URL dataset_uri needs a download_dir to fetch into")
        return sources.fetch(dataset_uri, download_dir)
    return Located(dataset_uri)


@exit_on_user_error
def run_in_pipeline(
    dataset_uri: str,
    dataset_sources: str,
    data_dir: str,
    options: PrepareOptions,
    objective: str,
    benchmarks: Mapping[str, list[str]],
    train_artifact,
    eval_artifact,
    rejects_artifact,
    report_artifact,
    metrics,
) -> tuple[str, str]:
    """What the KFP component does, kept here so it is plain, testable Python."""
    source = resolve_inputs_of(dataset_uri, dataset_sources, Path(data_dir) / SOURCE_DIR, options, objective)
    result = prepare(source, Path(data_dir), options, objective, benchmarks)
    print(summary(result), flush=True)
    stats = result.stats
    for artifact, path, rows in (
        (train_artifact, result.train_path, stats.train_rows),
        (eval_artifact, result.eval_path, stats.eval_rows),
        (rejects_artifact, result.rejects_path, stats.rejected),
    ):
        Path(artifact.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, artifact.path)
        artifact.metadata.update({"rows": rows, "fingerprint": stats.fingerprint, "workspace_path": str(path)})
    Path(report_artifact.path).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(result.report_path, report_artifact.path)  # the UI shows it: each source, its version
    report_artifact.metadata.update({"sources": len(stats.lineage), "workspace_path": str(result.report_path)})
    metrics.log_metric("rows", stats.train_rows + stats.eval_rows)
    metrics.log_metric("train_rows", stats.train_rows)
    metrics.log_metric("eval_rows", stats.eval_rows)
    metrics.log_metric("rejected", stats.rejected)
    metrics.log_metric("duplicates", stats.duplicates)
    metrics.log_metric("train_rows_overlapping_eval", stats.overlapping_eval)
    return stats.fingerprint, str(result.output_dir)


@exit_on_user_error
def run_step(inputs: Mapping[str, Any]) -> tuple[str, str]:
    """What the ``prepare_dataset`` component calls with every input by name; returns (fingerprint, data_dir)."""
    return run_in_pipeline(
        inputs["dataset_uri"],
        inputs["dataset_sources"],
        str(stage_dir(inputs["workspace_root"], inputs["run_id"], "data")),
        options_from_inputs(PrepareOptions, inputs),
        inputs["objective"],
        task_documents(  # the benchmarks the evaluation scores, with their task directories on the workspace
            task_entries(inputs["benchmark_tasks"]),
            Path(inputs["workspace_root"]),
            inputs["benchmark_limit"],
            inputs["benchmark_allow_code"],
        ),
        inputs["train_data"],
        inputs["eval_data"],
        inputs["rejects"],
        inputs["report"],
        inputs["metrics"],
    )


if __name__ == "__main__":
    main()
