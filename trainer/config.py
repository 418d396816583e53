"""Every knob of a training run, its default and its help text, in one place.

``TrainConfig`` is the single source of truth: the command line of
``python -m trainer`` is generated from its fields, the pipeline's training
stage passes the same names, and ``training_summary.json`` records the resolved
values, so a run can always be reproduced from its summary.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from common.cli_options import add_options, choice_problems, flag, option, options_from, run_option
from common.run_layout import ADAPTER, CHECKPOINTS, MERGED
from common.tracking import uri_problem
from trainer.methods import METHODS, Method, method_named

# The training objectives (trainer/objectives: one module each, named here so that the run form need not import
# TRL): sft, supervised fine-tuning on conversations; dpo, direct preference optimisation on preference pairs.
OBJECTIVES = ("sft", "dpo")
# The pairwise losses of TRL's DPOTrainer offered here (TRL 1.16 names; sigmoid is the DPO paper's).
DPO_LOSSES = ("sigmoid", "ipo", "hinge", "robust", "apo_zero", "apo_down", "sigmoid_norm")
# learning_rate 0 under dpo: the method's SFT rate divided by this. The alignment handbook trains Zephyr with DPO at
# 5e-7 (full) and 5e-6 (QLoRA), 1/40 of the usual SFT rates: preference gradients are large once the reference and
# the policy part, and a SFT rate overshoots within a few steps.
DPO_RATE_DIVISOR = 40
LOSS_ON = ("assistant", "all")
SHARDINGS = ("none", "fsdp")
ATTENTIONS = ("auto", "flex_attention", "sdpa", "flash_attention_2", "eager")
CHECKPOINTING_CHOICES = ("auto", "true", "false")


class Needs(NamedTuple):
    """The package a setting needs, what to use instead, and whether it also needs an NVIDIA GPU."""

    module: str
    alternative: str
    cuda: bool = True


# Settings that need a package the runtime image may lack: (field, value) -> what they need.
NEEDS_PACKAGE = {
    # bitsandbytes 0.50 runs 4-bit NF4 layers forward and backward on CPUs too (slowly): a CPU-only run may use it
    ("method", "qlora"): Needs("bitsandbytes", "use method lora (LoRA on the bf16 model)", cuda=False),
    ("attention", "flash_attention_2"): Needs("flash_attn", "use attention auto"),
    # FlexAttention's backward exists only as a Triton kernel (torch 2.13: "FlexAttention does not support backward
    # on CPU"), which torch.compile generates on CUDA devices.
    ("attention", "flex_attention"): Needs("triton", "use attention auto"),
    ("liger_kernels", True): Needs("liger_kernel", "set liger_kernels false"),
}


@dataclass(frozen=True)
class TrainConfig:
    """What one run of ``python -m trainer`` does."""

    model: str = option("", "Base model: a local checkpoint directory or a Hugging Face Hub id.", required=True)
    tokens_dir: Path = option(
        Path(),
        "Directory the tokenise step wrote (python -m components.tokenise.stage): the token rows this run trains "
        "and evaluates on, memory-mapped by every rank.",
        required=True,
    )
    output_dir: Path = option(
        Path(), "Where checkpoints, adapter/, merged/ and the summaries go (shared storage).", required=True
    )
    base_model_revision: str = run_option(
        "",
        "Hub revision of the base model (branch, tag or commit) to fine-tune; empty: the default branch. The "
        "commit used is recorded in training_summary.json.",
    )
    objective: str = run_option(
        "sft",
        "What the run optimises. sft: supervised fine-tuning, the loss of the assistant's answers in conversations. "
        "dpo: direct preference optimisation on preference pairs (a prompt, a chosen and a rejected answer): the "
        "model learns to prefer the chosen answer over the rejected one, relative to the model it started from "
        "(the base with the adapter off for lora and qlora). The data must be of the objective's kind: the data step "
        "refuses records of the other.",
        choices=OBJECTIVES,
    )
    dpo_beta: float = run_option(
        0.1,
        "objective dpo: how far the model may move from the reference (the starting model): the loss compares the "
        "log-probability ratios of chosen and rejected answers scaled by beta. Higher keeps it closer (TRL's and the "
        "DPO paper's default 0.1).",
    )
    dpo_loss: str = run_option(
        "sigmoid",
        "objective dpo: the pairwise loss (TRL's DPOTrainer): sigmoid, the DPO paper's; ipo, which does not push a "
        "margin without bound; hinge; robust, for noisy preferences; apo_zero and apo_down (anchored); "
        "sigmoid_norm (length-normalised).",
        choices=DPO_LOSSES,
    )
    method: str = run_option(
        "lora",
        "lora (default), full fine-tuning, or qlora (LoRA on a base whose blocks' linear weights bitsandbytes holds in "
        "4-bit NF4, a quarter of their bf16 memory; runs on CPUs too, slowly; merged into the unquantised base at "
        "the end).",
        choices=tuple(METHODS),
    )
    sharding: str = run_option(
        "none",
        "none: data parallel (DDP), every GPU holds the whole model, its gradients and optimizer state; fsdp: "
        "PyTorch FSDP2, each of those sharded across all GPUs of the job (one transformer block gathered at a "
        "time), for models whose full or LoRA fine-tune does not fit one GPU.",
        choices=SHARDINGS,
    )
    attention: str = run_option(
        "auto",
        "Attention kernel. auto: flex_attention on CUDA GPUs when packing inside compiled blocks (only the blocks of "
        "the block-diagonal mask that hold tokens of one conversation are computed), else sdpa; the log names the "
        "kernel that runs and why. "
        "flex_attention: PyTorch's FlexAttention (CUDA GPUs). sdpa: PyTorch's scaled-dot-product attention, a flash "
        "kernel for unpacked rows, but with packing a dense block-diagonal mask over every pair of a row's tokens. "
        "flash_attention_2: the flash-attn package (Ampere or newer GPUs). eager: plain matrix products.",
        choices=ATTENTIONS,
    )
    compile_blocks: bool = run_option(
        True,
        "On CUDA GPUs, compile each transformer block with torch.compile (regional compilation: one compiled block "
        "reused by every layer, micro-batches padded to a multiple of 128 tokens so shapes rarely change); the log "
        "reports the compile time and recompilations. Not applied on CPU or with sharding fsdp (the log says so); "
        "false: eager blocks. Before the first step the compiled blocks (and flex_attention) are rehearsed on the "
        "first training and evaluation batches and on a micro-batch of each length the data's micro-batches can have "
        "(up to 32 lengths), so "
        "that nothing compiles mid-run; if that fails, the run continues on eager blocks and sdpa and says so "
        "(see strict_compile).",
    )
    strict_compile: bool = run_option(
        False,
        "Fail the run when compiled blocks or flex_attention fail in the rehearsal before the first step, instead of "
        "continuing on eager blocks and sdpa (the default, said in the log, training_summary.json, the report and "
        "the model card): for benchmarks, which must measure what they asked for.",
    )
    compile_backend: str = option(
        "inductor",
        "torch.compile backend of compiled blocks. inductor generates their kernels (Triton) and applies on CUDA "
        "GPUs only; eager or aot_eager trace and guard exactly as inductor does without generating code, and also "
        "compile the blocks on CPU: how the tests and the GPU check's CPU mode drive the compiled path.",
    )
    liger_kernels: bool = run_option(
        False,
        "Liger's fused Triton kernels (RMSNorm, RoPE, SwiGLU, fused linear cross-entropy, which never materialises "
        "the logits): less GPU memory and more speed where the liger-kernel package is installed; refused otherwise.",
    )
    lora_r: int = run_option(16, "LoRA rank: the size of the low-rank update of each adapted weight.")
    lora_alpha: int = run_option(32, "LoRA scaling numerator (the update is scaled by alpha / r).")
    lora_dropout: float = run_option(
        0.0,
        "Dropout on the LoRA input, in [0, 1). 0 (torchtune's LoRA configs) skips the dropped copy of every adapted "
        "layer's input and its mask, memory- and launch-bound work; 0.05-0.1 (the QLoRA paper's values) regularise "
        "small data sets at that cost.",
    )
    lora_cast_inputs: bool = run_option(
        False,
        "Cast each LoRA layer's input to the adapters' fp32 before the adapter (PEFT's default). False: under bf16 "
        "autocast the adapters compute in bf16 from the bf16 input, without an fp32 copy of q, k, v and every other "
        "adapted input; the adapters' weights, gradients and optimizer state stay fp32 either way.",
    )
    lora_target_modules: str = run_option("all-linear", "Comma-separated module names to adapt, or all-linear.")
    epochs: float = run_option(3.0, "Passes over the training split.")
    max_steps: int = run_option(-1, "Stop after this many optimizer steps (-1: run all epochs).")
    learning_rate: float = run_option(
        0.0,
        "Peak learning rate, reached after warm-up and followed by a cosine decay (see scale_lr). 0: the method's "
        "usual rate, 2e-4 for lora and qlora, 2e-5 for full (a LoRA rate would wreck a full fine-tune).",
    )
    scale_lr: bool = run_option(
        False,
        "Multiply the learning rate by the number of training processes (linear scaling rule for a larger batch).",
    )
    warmup_ratio: float = run_option(0.03, "Share of steps spent warming the learning rate up.")
    weight_decay: float = run_option(0.0, "AdamW weight decay (0 for none).")
    per_device_batch_size: int = run_option(
        1,
        "Sequences per device per step: with packing, each holds up to max_length tokens of several conversations, so "
        "one is a full batch; small data sets need the optimizer steps more than larger batches.",
    )
    gradient_accumulation_steps: int = run_option(1, "Micro-batches accumulated per optimizer step.")
    max_length: int = run_option(1024, "Tokens per (packed) training sequence; longer conversations are truncated.")
    packing: bool = run_option(True, "Pack conversations into max_length sequences without cross-sample attention.")
    loss_on: str = run_option(
        "assistant", "assistant: loss on the assistant's tokens only; all: every token.", choices=LOSS_ON
    )
    mixed_precision: bool = run_option(
        True,
        "On GPUs, compute in bf16 (fp16 with loss scaling before Ampere) while full fine-tuning keeps fp32 master "
        "weights and optimizer state; false: fp32 throughout (slower, twice the activation memory). CPU training is "
        "always fp32.",
    )
    gradient_checkpointing: str = run_option(
        "auto",
        "Recompute activations in the backward pass to save GPU memory (about 20% slower): true, false, or auto (on "
        "for method qlora, whose point is the least memory, as in the QLoRA paper; off otherwise). The resolved "
        "value is in training_summary.json; see checkpoint_every.",
        choices=CHECKPOINTING_CHOICES,
    )
    checkpoint_every: int = run_option(
        1,
        "With gradient_checkpointing, recompute every this many transformer blocks (1: all; 2: every second, ...): "
        "the blocks in between keep their activations, trading memory for less recomputation (selective activation "
        "checkpointing). The fit check counts both kinds of block.",
    )
    save_steps: int = run_option(
        50, "Write a checkpoint every this many optimizer steps; a restarted training pod resumes from the newest."
    )
    save_total_limit: int = run_option(2, "Complete checkpoints kept on disk, at least 2 (older ones are deleted).")
    logging_steps: int = run_option(5, "Log loss, tokens/s and ETA every this many steps.")
    eval_steps: int = run_option(0, "Evaluate on the held-out split every this many steps (0: once per epoch).")
    seed: int = run_option(42, "Seed for shuffling, dropout and LoRA initialisation.")
    collective_timeout_minutes: float = run_option(
        10.0,
        "Fail a rank that waits this long in a collective (a lost peer pod): the job restarts and resumes from the "
        "newest checkpoint instead of hanging. Must exceed the longest checkpoint save; raise it for full "
        "fine-tuning of large models on slow storage.",
    )
    mlflow_tracking_uri: str = run_option(
        "",
        "MLflow tracking server to log the run to, e.g. https://<dashboard>/mlflow on OpenShift AI or "
        "http://mlflow.<namespace>.svc:5000: one MLflow run per pipeline run, named by its run id, with the "
        "training parameters and per-step metrics, the evaluation's numbers, benchmark scores and gate, and the "
        "report. Credentials come from the Secret mlflow_secret names, never from here. The first step refuses a "
        "server it cannot reach. Empty: no tracking.",
    )
    mlflow_experiment: str = run_option(
        "llm-finetune", "MLflow experiment the runs go to (created when missing); used with mlflow_tracking_uri."
    )
    require_cuda: bool = option(
        False, "Fail at start unless CUDA works: the launcher sets it when the job's pods were given GPUs."
    )
    expected_world_size: int = option(0, "Fail at start unless exactly this many processes take part (0: no check).")

    @property
    def training_method(self) -> Method:
        """What ``method`` implies (trainer.methods)."""
        return method_named(self.method)

    @property
    def recomputes_activations(self) -> bool:
        """Whether gradient checkpointing is on: ``gradient_checkpointing`` resolved (auto: the method's default)."""
        if self.gradient_checkpointing == "auto":
            return self.training_method.checkpointing_by_default
        return self.gradient_checkpointing == "true"

    @property
    def adapter_dir(self) -> Path:
        return self.output_dir / ADAPTER

    @property
    def merged_dir(self) -> Path:
        return self.output_dir / MERGED

    @property
    def checkpoints_dir(self) -> Path:
        return self.output_dir / CHECKPOINTS

    def as_json(self) -> dict[str, Any]:
        return {
            name: str(value) if isinstance(value, Path) else value for name, value in dataclasses.asdict(self).items()
        }


POSITIVE_FIELDS = (
    "lora_r",
    "lora_alpha",
    "per_device_batch_size",
    "gradient_accumulation_steps",
    "max_length",
    "checkpoint_every",
    "save_steps",
    "logging_steps",
)


def option_problems(config: TrainConfig) -> dict[str, str]:
    """Field name -> what is wrong with its value, for settings that would fail only after the model has loaded.

    Device-independent, so the pipeline's launcher can run the same checks
    before it asks the cluster for GPU pods; callers name the field their way
    (``--lora-r`` on the command line, ``lora_r`` in the run form).
    """
    problems = {}
    for name in POSITIVE_FIELDS:
        if getattr(config, name) <= 0:
            problems[name] = f"must be positive (got {getattr(config, name)})"
    if config.epochs <= 0 and config.max_steps <= 0:
        problems["epochs"] = f"must be positive (got {config.epochs}) unless max_steps is set"
    if config.max_steps == 0 or config.max_steps < -1:
        problems["max_steps"] = f"must be positive, or -1 to run all epochs (got {config.max_steps})"
    if config.learning_rate < 0:
        problems["learning_rate"] = f"must be positive, or 0 for the method's usual rate (got {config.learning_rate})"
    if not 0 <= config.warmup_ratio < 1:
        problems["warmup_ratio"] = f"must be in [0, 1) (got {config.warmup_ratio})"
    if config.weight_decay < 0:
        problems["weight_decay"] = f"must not be negative (got {config.weight_decay})"
    if config.dpo_beta <= 0:
        problems["dpo_beta"] = f"must be positive (got {config.dpo_beta})"
    if config.collective_timeout_minutes <= 0:
        problems["collective_timeout_minutes"] = f"must be positive (got {config.collective_timeout_minutes})"
    if config.eval_steps < 0:
        problems["eval_steps"] = f"must be 0 (once per epoch) or positive (got {config.eval_steps})"
    if not 0 <= config.lora_dropout < 1:
        problems["lora_dropout"] = f"must be in [0, 1) (got {config.lora_dropout})"
    if config.save_total_limit < 2:
        problems["save_total_limit"] = (
            f"must be at least 2 (got {config.save_total_limit}): a save interrupted by a pod "
            "restart must never leave the run without a complete checkpoint"
        )
    if config.mlflow_tracking_uri.strip() and (problem := uri_problem(config.mlflow_tracking_uri)):
        problems["mlflow_tracking_uri"] = problem
    if config.mlflow_tracking_uri.strip() and not config.mlflow_experiment.strip():
        problems["mlflow_experiment"] = "is empty: name the MLflow experiment the runs go to (default llm-finetune)"
    return {**problems, **choice_problems(TrainConfig, config)}


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser whose options are exactly ``TrainConfig``'s fields."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Supervised fine-tuning (TRL SFT + PEFT LoRA) of a chat model; launch under torchrun.",
    )
    add_options(parser, TrainConfig)
    return parser


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    return options_from(build_parser().parse_args(argv), TrainConfig)


def to_args(config: TrainConfig) -> list[str]:
    """The command line that ``parse_config`` turns back into ``config``: every field, explicitly.

    Every field is written, defaults included, so a launched job does exactly
    what its manifest says even if the image's defaults differ from the
    launcher's. Floats use ``repr``, which parses back to the same number.
    """
    args: list[str] = []
    for spec in dataclasses.fields(TrainConfig):
        value = getattr(config, spec.name)
        if isinstance(value, bool):
            args.append(flag(spec.name) if value else "--no-" + flag(spec.name)[2:])
        else:
            args += [flag(spec.name), repr(value) if isinstance(value, float) else str(value)]
    return args


def packages_needed(values: dict[str, Any]) -> dict[str, Needs]:
    """Field -> what it needs, for each setting among ``values`` (field -> value) that needs a package."""
    return {
        field: NEEDS_PACKAGE[field, value]
        for field, value in values.items()
        if isinstance(value, (str, bool)) and (field, value) in NEEDS_PACKAGE
    }


def checkpointing_words(config: TrainConfig) -> str:
    """Whether and where activations are recomputed, and why when gradient_checkpointing is auto: for the logs."""
    if not config.recomputes_activations:
        words = "off"
    elif config.checkpoint_every == 1:
        words = "on for every block"
    else:
        words = f"on for 1 block in {config.checkpoint_every}"
    return words + (f" (auto for method {config.method})" if config.gradient_checkpointing == "auto" else "")


def peak_learning_rate(config: TrainConfig) -> float:
    """The learning rate asked for, or the method's usual one when it is 0 (before scale_lr)."""
    if config.learning_rate:
        return config.learning_rate
    usual = config.training_method.learning_rate
    return usual / DPO_RATE_DIVISOR if config.objective == "dpo" else usual
