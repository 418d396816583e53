"""A version's provenance as flat properties: what the Model Registry shows beside each version.

Read from what the earlier stages left in the run's folders, so the registry
says the same as the model card: the base model and its commit, the data's
fingerprint and counts, each source's lineage, the method and its key options, the evaluation loss of
the base, the published and the new model, the new model's standard benchmark
scores, the gate's verdict and reason, the GGUF verification, and the pipeline run.
"""

from __future__ import annotations

from typing import Any

from common.errors import UserError
from common.records import GgufVerification, SourceLineage
from common.run_layout import VERIFICATION_JSON
from components.champion.version import RunDirs, read_run_outputs, written
from trainer.methods import method_named

Property = str | int | float | bool


def source_properties(lineage: tuple[SourceLineage, ...]) -> dict[str, str]:
    """Each source's lineage as flat properties (data_source_1, data_source_1_content, data_source_1_version):
    where the version's data came from, as the model card's table says."""
    properties = {}
    for number, source in enumerate(lineage, start=1):
        properties[f"data_source_{number}"] = source.uri
        properties[f"data_source_{number}_content"] = source.content
        if version := source.remote.described():
            properties[f"data_source_{number}_version"] = version
    return properties


def version_properties(dirs: RunDirs, run_id: str) -> dict[str, Property]:
    """The provenance of run ``run_id``'s version; refuses a version that failed the gate."""
    outputs = read_run_outputs(dirs)
    gate = outputs.evaluation.gate
    if not gate.passed:
        raise UserError(
            f"Run {run_id} failed the quality gate ({gate.reason}): a version that failed the gate is not registered."
        )
    verification = written(GgufVerification.read, dirs.export / VERIFICATION_JSON, "the export stage")
    stats, summary, evaluation = outputs.stats, outputs.summary, outputs.evaluation
    rows = "preference_pairs" if summary.objective == "dpo" else "conversations"  # what the run's rows are
    properties: dict[str, Any] = {
        "pipeline_run_id": run_id,
        "base_model": summary.base_model,
        "base_model_commit": summary.base_model_commit,
        "data_fingerprint": outputs.fingerprint,
        "data_records": stats.records,
        "data_rejected": stats.rejected,
        "data_duplicates": stats.duplicates,
        f"train_{rows}": summary.train_examples,
        f"eval_{rows}": summary.eval_examples,
        "method": summary.method,
        "learning_rate": summary.learning_rate,
        "epochs": summary.epochs,
        "max_length": summary.max_length,
        "precision": summary.precision,
        "eval_loss_base": evaluation.base.eval_loss,
        "eval_loss_published": evaluation.published.eval_loss if evaluation.published else None,
        "eval_loss_new": evaluation.fine_tuned.eval_loss,
        "gate_passed": True,
        "gate_forced": gate.forced,
        "gate_reason": gate.reason,
        "gguf_verified": verification.passed,
        "gguf_files": ", ".join(path.name for path in outputs.ggufs),
        "mlflow_run_url": evaluation.mlflow_run_url,  # None (left out) without mlflow_tracking_uri
    }
    # The new model's standard benchmark scores (benchmark_arc_easy_acc_norm), what the gate checked it kept.
    scores = (evaluation.benchmarks or {}).get("scores", {}).get("fine_tuned", {})
    properties |= {
        f"benchmark_{task}_{entry['metric'].split(' ', 1)[0]}": entry["value"] for task, entry in scores.items()
    }
    properties |= source_properties(stats.lineage)
    properties["objective"] = summary.objective
    if summary.objective == "dpo":  # the preference settings, and the held-out pairs' preferences against the base
        properties |= {key: summary.config.get(key) for key in ("dpo_beta", "dpo_loss")}
        properties |= {
            "reward_accuracy_new": evaluation.fine_tuned.reward_accuracy,
            "reward_margin_new": evaluation.fine_tuned.reward_margin,
            "reward_accuracy_published": evaluation.published.reward_accuracy if evaluation.published else None,
        }
    if method_named(summary.method).trains_adapter:
        properties |= {key: summary.config.get(key) for key in ("lora_r", "lora_alpha", "lora_dropout")}
    return {key: value for key, value in properties.items() if isinstance(value, Property)}
