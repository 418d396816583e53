"""The end of a local run: what the user got, read from the run directory's files, and what to try next.

Every fact comes from a file a stage wrote (``common.run_layout``); a stage that did not run (the
data had not changed, or the quality gate failed) is said to have not run, with the reason it left.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from common.records import DataStats, EvaluationResult, GgufVerification, Registration, Served
from common.run_layout import (
    DATA,
    DATA_STATS,
    EVALUATE,
    EVALUATION,
    EVALUATION_HTML,
    EXPORT,
    MODELFILE,
    PUBLISH,
    REGISTER,
    REGISTERED,
    SERVE,
    SERVED,
    SERVICE_MANIFEST,
    TRAIN,
    UPLOAD,
    VERIFICATION_JSON,
)
from components.champion.card import CARD_NAME
from components.champion.record import PublishedRecord, published_records
from components.champion.version import stored_copies
from components.evaluate.report import benchmark_verdicts


def _publish_record(run_dir: Path) -> PublishedRecord | None:
    """The workspace's publish record of this run, if one still names it (a later publish replaces it)."""
    named = [record for record in published_records(run_dir.parent.parent) if record.run_id == run_dir.name]
    return named[0] if named else None


def summary_lines(run_dir: Path) -> list[str]:
    """The run's results, one fact per line, then the next commands."""
    lines = [f"run {run_dir.name} ({run_dir})"]
    if stats := DataStats.read(run_dir / DATA / DATA_STATS):
        lines.append(
            f"  data:       {stats.train_rows} train / {stats.eval_rows} eval {stats.kind}, "
            f"{stats.rejected} rejected, {stats.duplicates} duplicates"
        )
    evaluation = EvaluationResult.read(run_dir / EVALUATE / EVALUATION)
    if not (run_dir / TRAIN).is_dir():
        lines.append(
            "  training:   not run: the data has not changed since the last publish (force=true trains anyway)"
        )
        return lines
    if not evaluation:
        return lines + ["  evaluation: not run (see the log)"]
    gate = evaluation.gate
    published = f", published {evaluation.published.eval_loss:.3f}" if evaluation.published else ""
    lines.append(
        f"  eval loss:  base {evaluation.base.eval_loss:.3f}{published} -> fine-tuned "
        f"{evaluation.fine_tuned.eval_loss:.3f}"
    )
    if evaluation.fine_tuned.reward_accuracy is not None:  # objective dpo: the held-out pairs decide
        published = f", published {evaluation.published.reward_accuracy:.3f}" if evaluation.published else ""
        lines.append(
            f"  reward accuracy: base {evaluation.base.reward_accuracy:.3f} (chance){published} -> fine-tuned "
            f"{evaluation.fine_tuned.reward_accuracy:.3f}"
        )
    lines += [f"  {line}" for line in benchmark_verdicts(evaluation.as_json())]
    lines.append(f"  gate:       {'passed' if gate.passed else 'FAILED'}: {gate.reason}")
    lines.append(f"  report:     {run_dir / EVALUATE / EVALUATION_HTML}")
    verification = GgufVerification.read(run_dir / EXPORT / VERIFICATION_JSON)
    if not verification:
        lines.append("  export:     not run" + ("" if gate.passed else ": the quality gate failed"))
        return lines
    ggufs = [Path(verified.gguf) for verified in verification.files]
    lines.append(f"  GGUF:       {', '.join(map(str, ggufs))}")
    lines.append(f"  llama.cpp:  verification {'passed' if verification.passed else 'FAILED'}")
    modelfile = run_dir / EXPORT / (verification.modelfile or MODELFILE)
    lines.append(f"  Modelfile:  {modelfile}")
    card = run_dir / PUBLISH / UPLOAD / CARD_NAME
    if card.is_file():
        record = _publish_record(run_dir)
        where = f"uploaded to {record.repo_id}" if record and record.uploaded else "a dry run: set repo_id to publish"
        lines.append(f"  model card: {card} ({where})")
    for copy in stored_copies(run_dir.parent.parent, run_dir.name):
        lines.append(f"  stored:     {copy.uri} ({copy.files} files, complete)")
    if registration := Registration.read(run_dir / REGISTER / REGISTERED):
        lines.append(
            f"  registered: model {registration.registered_model_id}, version {registration.model_version_id}"
            f" ({run_dir.name}) at {registration.url}, {len(registration.artifact_ids)} artifacts"
        )
    if (run_dir / SERVE / SERVICE_MANIFEST).is_file():
        lines.append(f"  serving:    {run_dir / SERVE / SERVICE_MANIFEST} (the InferenceService, for oc apply)")
    if served := Served.read(run_dir / SERVE / SERVED):
        lines.append(f"  served:     {served.endpoint} ({served.namespace}/{served.name})")
        lines.append(f"  asked:      {served.question!r} -> {served.answer!r}")
    lines += [
        "",
        "next:",
        f"  python -m gguf_export.chat {shlex.quote(str(ggufs[0]))}",
        f"  ollama create my-model -f {shlex.quote(str(modelfile))}",
        f"  open {shlex.quote(str(run_dir / EVALUATE / EVALUATION_HTML))} in a browser",
    ]
    return lines
