"""The model card (README.md): Hub metadata and a page a user can act on.

Metadata goes through ``huggingface_hub.ModelCardData`` (the Hub's own schema:
base_model, datasets, license, tags, pipeline_tag, library_name) plus
``data_fingerprint``, which the next scheduled run reads back to tell whether
the data changed, and ``published_history``, one entry per publish (run id,
date, data fingerprint, eval loss, and the Hub commit of every earlier one),
which each publish reads from the card it replaces and extends. The page is
the Jinja template beside this module, filled with numbers formatted here:
evaluation (base, the model published before, fine-tuned), sample answers,
training configuration, the published history, and how to run the GGUF with
llama.cpp and Ollama.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from common.records import EvaluationResult, GateVerdict, TrainingSummary
from common.run_layout import LORA_MARKER, MODELFILE
from components.champion.card import FINGERPRINT_KEY, HISTORY_KEY, LINEAGE_KEY
from components.champion.version import MERGED_CONFIG, RunOutputs
from components.data.report import shows_tokens, source_table
from components.data.sources import describe_uri, hub_dataset_id
from components.evaluation_tables import benchmark_note, benchmark_rows, change_headers, columns
from components.local_model import LOCAL_MODEL_NAME
from components.publish.options import PublishOptions
from trainer.methods import method_named

TEMPLATE = Path(__file__).with_name("model_card.md.j2")
PLACEHOLDER_REPO = "YOUR-NAMESPACE/{name}"
# Local runs fine-tune a copy of a Hub model materialised on disk; the card names the original.
LOCAL_MODEL_HUB_IDS = {LOCAL_MODEL_NAME: "HuggingFaceTB/SmolLM2-135M-Instruct"}
METRICS = (
    ("eval_loss", "eval loss (lower is better)", 4),
    ("perplexity", "perplexity (lower is better)", 2),
    ("rouge_l", "ROUGE-L (higher is better)", 3),
)
# After METRICS under objective dpo: the held-out pairs' preferences against the base, which scores chance
PREFERENCE_METRICS = (
    ("reward_accuracy", "held-out reward accuracy (higher is better; the base: chance)", 3),
    ("reward_margin", "reward margin, chosen minus rejected (higher is better)", 3),
)


@dataclass(frozen=True)
class CardContext:
    """What the card says besides the stage outputs."""

    repo_id: str
    run_id: str
    dataset_uri: str
    files: list[str]  # paths in the repository, model card excluded
    history: list[dict[str, Any]]  # every publish to this repository, oldest first, this one last


def render_model_card(outputs: RunOutputs, options: PublishOptions, context: CardContext) -> str:
    """The README.md text: YAML metadata, then the page."""
    base_model = base_model_hub_id(options, outputs.summary)
    gguf = outputs.ggufs[0].name
    repo_id = context.repo_id or PLACEHOLDER_REPO.format(name=_model_name(gguf))
    document = outputs.evaluation.as_json()  # as the evaluation's reports render it
    card = ModelCard.from_template(
        card_data(outputs, options, context, base_model),
        template_path=str(TEMPLATE),
        title=repo_id.split("/")[-1],
        intro=_intro(outputs, options, base_model, context),
        eval_rows=_eval_rows(outputs),
        scoring=SCORING[outputs.summary.objective],
        metrics=_metric_rows(outputs.evaluation),
        published=_published_name(outputs.evaluation),
        gate_verdict=_gate_verdict(outputs.evaluation.gate),
        benchmark_rows=benchmark_rows(document),
        benchmark_headers=[header for _, header in columns(document)] + change_headers(document),
        benchmark_note=benchmark_note(document),
        gate_reason=outputs.evaluation.gate.reason,
        samples=[
            {
                "question": " ".join(s.question.split()),
                "base": _quote(s.base),
                "fine_tuned": _quote(s.fine_tuned),
            }
            for s in outputs.samples
        ],
        training=_training_rows(outputs.summary),
        files=_file_rows(context.files, repo_id),
        repo_id=repo_id,
        gguf=gguf,
        quant=_outtype(gguf).upper(),
        ollama_name=repo_id.split("/")[-1].lower(),
        fingerprint=outputs.fingerprint,
        dataset=_dataset(outputs, context),
        data_sources=source_table(outputs.stats, outputs.summary.source_tokens),
        source_tokens=shows_tokens(outputs.stats, outputs.summary.source_tokens),
        run_id=context.run_id,
        mlflow_run_url=outputs.evaluation.mlflow_run_url,
        history=_history_rows(context.history),
        earlier_revision=next(
            (entry["revision"] for entry in reversed(context.history) if entry.get("revision")), None
        ),
        loads_adapter=any(name.startswith("adapter/") for name in context.files),
        base_model=base_model or outputs.summary.base_model,
    )
    return str(card).rstrip("\n") + "\n"


def _dataset(outputs: RunOutputs, context: CardContext) -> str:
    """The training data in the Provenance list: the sources (their table follows), the URI or the sample."""
    if outputs.stats.sources:
        return f"{len(outputs.stats.sources)} sources, mixed as the table below says (`dataset_sources`)"
    if context.dataset_uri.strip():
        return f"`{describe_uri(context.dataset_uri)}`"
    return "the practical-skills sample bundled with the pipeline"


def card_data(outputs: RunOutputs, options: PublishOptions, context: CardContext, base_model: str) -> ModelCardData:
    method = outputs.summary.method
    uris = [context.dataset_uri, *(lineage.uri for lineage in outputs.stats.lineage)]
    datasets = list(dict.fromkeys(dataset for uri in uris if (dataset := hub_dataset_id(uri))))
    tags = [
        "gguf",
        "llama.cpp",
        "ollama",
        "fine-tuned",
        *([method] if method_named(method).trains_adapter else []),
        "llm-finetune-pipeline",
    ]
    extra: dict[str, Any] = {FINGERPRINT_KEY: outputs.fingerprint, HISTORY_KEY: context.history}
    if outputs.stats.lineage:  # what the next run's change check compares its sources with
        extra[LINEAGE_KEY] = [dataclasses.asdict(lineage) for lineage in outputs.stats.lineage]
    if base_model:
        extra["base_model_relation"] = "finetune"
    return ModelCardData(
        base_model=base_model or None,
        datasets=datasets or None,
        license=options.license or None,
        library_name="transformers" if MERGED_CONFIG in context.files else "llama.cpp",
        pipeline_tag="text-generation",
        tags=tags,
        **extra,
    )


def base_model_hub_id(options: PublishOptions, summary: TrainingSummary) -> str:
    """The Hub id of the base model: the option, else the trainer's --model when it names a Hub model."""
    if options.base_model:
        return options.base_model
    model = summary.base_model
    if Path(model).name in LOCAL_MODEL_HUB_IDS:
        return LOCAL_MODEL_HUB_IDS[Path(model).name]
    if Path(model).exists() or model.count("/") != 1:
        return ""
    try:
        validate_repo_id(model)
    except HFValidationError:
        return ""
    return model


def _intro(outputs: RunOutputs, options: PublishOptions, base_model: str, context: CardContext) -> str:
    config = outputs.summary.config
    method = method_named(outputs.summary.method)
    lora = f"r={config.get('lora_r')}, alpha={config.get('lora_alpha')}"
    if method.quantised_base:
        # the trainer merges a QLoRA adapter into a fresh unquantised copy of the base (train.merged_from_adapter)
        how = (
            f"QLoRA (LoRA {lora} on the base held in 4-bit NF4), merged into the unquantised base's weights, "
            "not the 4-bit ones"
        )
    else:
        how = f"LoRA ({lora}), merged into the weights" if method.trains_adapter else "full fine-tuning"
    base = f"[{base_model}](https://huggingface.co/{base_model})" if base_model else f"`{outputs.summary.base_model}`"
    parts = ["GGUF files for llama.cpp and Ollama"]
    if MERGED_CONFIG in context.files:
        parts.append("the merged safetensors checkpoint for transformers")
    if any(name.startswith("adapter/") for name in context.files):
        parts.append("the LoRA adapter for PEFT (`adapter/`)")
    return (
        f"{base} fine-tuned on {outputs.summary.train_examples} question/answer conversations "
        f"with {how}. "
        f"This repository holds {_join(parts)}."
    )


# How the card's evaluation table was measured, by objective
SCORING = {
    "sft": "chat template, loss on the assistant's tokens; ROUGE-L of greedy answers against the reference answers",
    "dpo": (
        "chat template; each pair's chosen and rejected answers' log-probabilities, their implicit rewards against "
        "the base (dpo_beta times the difference) and the reward accuracy, the share of pairs whose chosen answer "
        "gets the higher reward, which the quality gate decided on; the loss on the chosen answers' tokens; ROUGE-L "
        "of greedy answers against the chosen answers"
    ),
}


def _eval_rows(outputs: RunOutputs) -> str:
    kind = "preference pairs" if outputs.summary.objective == "dpo" else "conversations"
    return f"{outputs.summary.eval_examples} {kind}; ROUGE-L on {outputs.evaluation.scored_rows} of them"


def _metric_rows(evaluation: EvaluationResult) -> list[dict[str, str]]:
    rows = []
    on_pairs = evaluation.fine_tuned.reward_accuracy is not None
    for key, name, digits in METRICS + (PREFERENCE_METRICS if on_pairs else ()):
        if on_pairs and key == "eval_loss":
            name = "eval loss on the chosen answers (lower is better)"
        base, tuned = getattr(evaluation.base, key), getattr(evaluation.fine_tuned, key)
        delta = evaluation.deltas.get(key)
        published = getattr(evaluation.published, key) if evaluation.published else None
        rows.append(
            {
                "name": name,
                "base": _number(base, digits),
                "published": _number(published, digits),
                "fine_tuned": _number(tuned, digits),
                "delta": "" if delta is None else f"{delta:+.{digits}f}",
                "delta_published": "" if published is None else f"{tuned - published:+.{digits}f}",
            }
        )
    return rows


def _published_name(evaluation: EvaluationResult) -> str | None:
    """Which published model the evaluation scored, for the card; None when it scored none."""
    if evaluation.published is None:
        return None
    run_id = (evaluation.published_model or {}).get("run_id")
    return f"pipeline run `{run_id}`" if run_id else "the repository's model before this commit"


def _gate_verdict(gate: GateVerdict) -> str:
    if not gate.passed:
        return "failed"
    return "passed, forced" if gate.forced else "passed"


def _history_rows(history: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Newest first, as a page lists releases."""
    rows = []
    for number, entry in enumerate(history, start=1):
        revision = entry.get("revision")
        run_id, fingerprint = entry.get("run_id"), entry.get("data_fingerprint")
        rows.append(
            {
                "number": str(number),
                "run_id": f"`{run_id}`" if run_id else "(not published by this pipeline)",
                "published_at": str(entry.get("published_at") or ""),
                "fingerprint": f"`{str(fingerprint)[:19]}…`" if fingerprint else "",
                "eval_loss": _number(entry.get("eval_loss"), 4),
                "revision": f"`{revision}`" if revision else ("this revision" if number == len(history) else ""),
            }
        )
    return rows[::-1]


def _training_rows(summary: TrainingSummary) -> list[tuple[str, str]]:
    config = summary.config
    rows = [
        ("objective", summary.objective),
        ("method", summary.method),
        ("base checkpoint", f"`{summary.base_model}`"),
    ]
    if summary.objective == "dpo":
        rows.append(("DPO beta / loss", f"{config.get('dpo_beta')} / {config.get('dpo_loss')}"))
    if method_named(summary.method).trains_adapter:
        rows += [
            (
                "LoRA rank / alpha / dropout",
                f"{config.get('lora_r')} / {config.get('lora_alpha')} / {config.get('lora_dropout')}",
            ),
            ("LoRA target modules", str(config.get("lora_target_modules", ""))),
        ]
    rows += [
        ("epochs", _number(summary.epochs, 2)),
        ("learning rate", str(summary.learning_rate)),
        ("max sequence length", str(summary.max_length)),
        ("world size (processes)", f"{summary.world_size} ({_device_counts(summary.devices)})"),
        ("precision", summary.precision),
        *_speed_path_rows(summary),
        ("optimizer steps", str(summary.global_step)),
        (
            f"training / eval {'preference pairs' if summary.objective == 'dpo' else 'conversations'}",
            f"{summary.train_examples} / {summary.eval_examples}",
        ),
        ("tokens seen", _count(summary.tokens_seen)),
        ("throughput", f"{_count(summary.non_padding_tokens_per_s)} non-padding tokens/s"),
        ("training time", _duration(summary.train_runtime_s)),
        (
            "final train / eval loss",
            f"{_number(summary.final_train_loss, 4)} / {_number(summary.final_eval_loss, 4)}",
        ),
    ]
    return [(name, value.replace("|", "\\|")) for name, value in rows]


def _speed_path_rows(summary: TrainingSummary) -> list[tuple[str, str]]:
    """The kernels the model trained with, and the fallback when the fast ones failed (a run slower than asked)."""
    if summary.attention is None:  # a summary from before the trainer recorded them
        return []
    blocks = "compiled" if summary.compiled_blocks else "eager"
    rows = [("attention / transformer blocks", f"{summary.attention} / {blocks}")]
    if summary.speed_fallback:
        rows.append(("speed fallback", summary.speed_fallback))
    return rows


def _file_rows(files: list[str], repo_id: str) -> list[tuple[str, str]]:
    """One row per file; the adapter folder and the merged checkpoint's files as one row each."""
    known = {
        MODELFILE: "Ollama Modelfile (`ollama create NAME -f Modelfile`)",
        "training_summary.json": "training configuration, throughput and losses",
        "evaluation/evaluation.json": "evaluation metrics, base vs fine-tuned, and the quality gate",
        "evaluation/report.md": "evaluation report with side-by-side answers and the loss curve",
        "evaluation/loss_curve.png": "training and eval loss per step",
        "evaluation/sample_responses.json": "the sample answers above, as JSON",
        "verification/verification.json": "GGUF checked in llama.cpp against transformers (token and logit agreement)",
        "verification/verification.md": "the same verification, readable",
    }
    rows, merged = [], []
    for name in sorted(files):
        if name.endswith(".gguf"):
            kind = "LoRA adapter as GGUF (llama.cpp `--lora`)" if LORA_MARKER in name else "model as GGUF"
            rows.append((f"`{name}`", f"{kind}, {_outtype(name)}"))
        elif name in known:
            rows.append((f"`{name}`", known[name]))
        elif not name.startswith("adapter/"):
            merged.append(f"`{name}`")
    if any(name.startswith("adapter/") for name in files):
        rows.append(
            ("`adapter/`", f'LoRA adapter: `PeftModel.from_pretrained(base_model, "{repo_id}", subfolder="adapter")`')
        )
    if merged:
        rows.append((", ".join(merged), f'merged checkpoint: `AutoModelForCausalLM.from_pretrained("{repo_id}")`'))
    return rows


def _outtype(gguf_name: str) -> str:
    """``q8_0`` from ``<model-name>-q8_0.gguf`` (the export stage's naming)."""
    return gguf_name.removesuffix(".gguf").rsplit("-", 1)[-1]


def _model_name(gguf_name: str) -> str:
    return gguf_name.removesuffix(".gguf").rsplit("-", 1)[0].lower()


def _quote(answer: Any) -> str:
    lines = str(answer).strip().splitlines() or ["(empty answer)"]
    return "\n".join(f"> {line}".rstrip() for line in lines)


def _number(value: Any, digits: int) -> str:
    return "" if value is None else f"{float(value):.{digits}f}"


def _count(value: Any) -> str:
    return "" if value is None else f"{round(float(value)):,}"


def _duration(seconds: Any) -> str:
    if seconds is None:
        return ""
    minutes, rest = divmod(round(float(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {rest} s"


def _device_counts(devices: tuple[str, ...]) -> str:
    counts: dict[str, int] = {}
    for device in devices:
        counts[device] = counts.get(device, 0) + 1
    return ", ".join(f"{count} × {device}" for device, count in counts.items())


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
