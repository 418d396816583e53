"""The tokenise step: the CLI, and what its KFP component runs.

    python -m components.tokenise.stage --data-dir DATA --model MODEL --cache-dir CACHE \\
        [--max-length 1024] [--loss-on assistant] [--packing] [--eval-max-rows 1000]

One path: options → the tokenizer (a local checkpoint, or its Hub files alone)
→ the cache key → the entry reused when complete, else built over every CPU of
the step (``components.tokenise.build``) → the entry's path, printed last, which
``python -m trainer --tokens-dir`` and the evaluation stage read.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping

from common.cli_options import options_from, options_from_inputs
from common.errors import UserError, exit_on_user_error
from common.run_layout import HF_HOME, TOKEN_CACHE
from components.default_base_model import resolve_base_model
from components.tokenise.build import build
from components.tokenise.options import MAIN_MEMORY, TRAINING_FIELDS, WORKER_MEMORY, TokeniseOptions, build_parser
from trainer.base_model import tokenizer_dir
from trainer.config import TrainConfig
from trainer.token_cache import SplitTokens, TokenManifest, TokenSettings

CGROUP = Path("/sys/fs/cgroup")
# cgroup v1 reports "no memory limit" as a page-rounded huge number rather than "max".
UNLIMITED_V1 = 1 << 60


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity, capped by a cgroup CPU limit (a pod's cpu limit)."""
    cpus = len(os.sched_getaffinity(0))
    quota = _read(CGROUP / "cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>"
    if quota is None:  # cgroup v1
        limit, period = _read(CGROUP / "cpu" / "cpu.cfs_quota_us"), _read(CGROUP / "cpu" / "cpu.cfs_period_us")
        quota = f"{limit} {period}" if limit and period and limit != "-1" else None
    if quota and not quota.startswith("max"):
        limit, period = quota.split()[:2]
        cpus = min(cpus, max(1, int(limit) // int(period)))
    return cpus


def memory_limit() -> int | None:
    """This process's cgroup memory limit (a pod's memory limit) in bytes, or None when unlimited."""
    value = _read(CGROUP / "memory.max") or _read(CGROUP / "memory" / "memory.limit_in_bytes")
    if not value or value == "max" or int(value) >= UNLIMITED_V1:
        return None
    return int(value)


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.is_file() else None


def check_memory(workers: int, limit: int | None) -> None:
    """Fail before any work when ``workers`` tokenising processes would not fit the step's memory."""
    needed = MAIN_MEMORY + workers * WORKER_MEMORY
    if limit is not None and needed > limit:
        raise UserError(
            f"the tokenise step needs about {needed / 2**30:.1f} GiB for its {workers} worker processes (one per "
            f"CPU; about {WORKER_MEMORY / 2**30:.1f} GiB each) and its memory limit is {limit / 2**30:.1f} GiB. "
            f"Raise tokenise_memory to at least {needed / 2**30:.0f}Gi, or lower tokenise_cpu."
        )


def tokenise(options: TokeniseOptions, training: TrainConfig, hub_cache: Path | None = None) -> tuple[Path, bool]:
    """The token-cache entry for ``options`` and the training options, and whether it was built (not reused)."""
    workers = options.workers or usable_cpus()
    check_memory(workers, memory_limit())
    settings = TokenSettings(
        max_length=training.max_length,
        loss_on=training.loss_on,
        packing=training.packing,
        eval_max_rows=options.eval_max_rows,
        objective=training.objective,
    )
    source = tokenizer_dir(options.model, training.base_model_revision, hub_cache)
    return build(options.data_dir, source, settings, options.cache_dir, workers)


def summary(tokens_dir: Path, manifest: TokenManifest, built: bool) -> str:
    train, evaluation = manifest.train, manifest.eval
    return "\n".join(
        [
            "tokenised now" if built else "reused from the cache (tokenised by an earlier step with the same key)",
            f"train: {train.conversations} conversations, {train.tokens} tokens "
            f"({train.loss_tokens} with loss), {train.rows} rows; "
            f"{train.conversations_per_second} conversations/s with {manifest.workers} worker process(es)",
            f"eval:  {evaluation.conversations} of {evaluation.split_conversations} conversations "
            f"(eval_max_rows {evaluation.eval_max_rows}), {evaluation.rows} rows",
            *source_lines(train),
            f"tokens -> {tokens_dir}",
        ]
    )


def source_lines(train: SplitTokens) -> list[str]:
    """A mixture's sources, one line each: their share of the training tokens, beside their share of the rows."""
    loss_tokens = sum(source.loss_tokens for source in train.sources)
    return [
        f"source {number}: {source.uri}: {source.conversations} conversations, {source.tokens} tokens "
        f"({source.loss_tokens} with loss, {source.loss_tokens / max(loss_tokens, 1):.1%} of the training split's)"
        for number, source in enumerate(train.sources, 1)
    ]


def training_options(values: Mapping[str, Any]) -> TrainConfig:
    """A TrainConfig holding the training options the tokens depend on (the others at their defaults)."""
    return TrainConfig(**{name: values[name] for name in TRAINING_FIELDS})


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = build_parser().parse_args(argv)
    tokens_dir, built = tokenise(options_from(args, TokeniseOptions), training_options(vars(args)))
    print(summary(tokens_dir, TokenManifest.read(tokens_dir), built), flush=True)


@exit_on_user_error
def run_in_pipeline(options: TokeniseOptions, training: TrainConfig, hub_cache: Path, metrics) -> str:
    """What the KFP component does: the entry under ``<workspace>/token-cache``, its counts as metrics."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tokens_dir, built = tokenise(options, training, hub_cache)
    manifest = TokenManifest.read(tokens_dir)
    print(summary(tokens_dir, manifest, built), flush=True)
    for split, counts in (("train", manifest.train), ("eval", manifest.eval)):
        for name in ("conversations", "tokens", "rows"):
            metrics.log_metric(f"{split}_{name}", getattr(counts, name))
    for number, source in enumerate(manifest.train.sources, 1):
        metrics.log_metric(f"train_tokens_source_{number}", source.tokens)
        metrics.log_metric(f"train_loss_tokens_source_{number}", source.loss_tokens)
    metrics.log_metric("reused", 0 if built else 1)
    return str(tokens_dir)


@exit_on_user_error
def run_step(inputs: Mapping[str, Any]) -> str:
    """What the ``tokenise_data`` component calls with every input by name; returns the token-cache entry."""
    workspace = Path(inputs["workspace_root"])
    options = options_from_inputs(
        TokeniseOptions,
        inputs,
        data_dir=Path(inputs["data_dir"]),
        model=resolve_base_model(inputs["base_model"], inputs["backend"]),
        cache_dir=workspace / TOKEN_CACHE,
    )
    return run_in_pipeline(options, training_options(inputs), workspace / HF_HOME / "hub", inputs["metrics"])


if __name__ == "__main__":
    main()
