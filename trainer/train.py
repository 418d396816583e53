"""One readable path from a ``TrainConfig`` to a fine-tuned model on shared storage.

config → checks → tokenised splits → model (+ LoRA) → the objective's TRL trainer
(``trainer.objectives``; resuming from the newest complete checkpoint) → final
evaluation → adapter, merged model and summaries written by rank 0.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig
from peft.helpers import disable_input_dtype_casting
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase, Trainer
from transformers.trainer_callback import PrinterCallback

from common.atomic import replace_dir, write_json
from common.errors import UserError
from common.records import RankFacts, TrainingSummary
from common.run_layout import DATA_SHARDS, LOSS_CURVE, TRAINING_HISTORY, TRAINING_PROGRESS, TRAINING_SUMMARY
from trainer import (
    attention,
    base_model,
    checkpoints,
    compiled,
    data,
    diagnostics,
    distributed,
    mfu,
    outputs,
    preflight,
    sharding,
)
from trainer.callbacks import CompletionManifest, PreemptionSave
from trainer.config import TrainConfig, checkpointing_words
from trainer.diagnostics import ShardRecorder
from trainer.distributed import Topology
from trainer.objectives import Objective
from trainer.objectives.dpo import DPO
from trainer.objectives.sft import SFT
from trainer.progress import ProgressFile
from trainer.rehearsal import SpeedPath
from trainer.tracking import MlflowTracking
from trainer.trainjob_status import DISABLE_TRANSFORMERS_ENV, TrainJobStatus

log = logging.getLogger("trainer")

# The exit status of a process stopped by SIGTERM: the pod is going away and a
# checkpoint is on disk, so the restarted job resumes instead of finishing here.
PREEMPTED_EXIT_CODE = 143
# By name (trainer.config.OBJECTIVES names them for the run form, which does not import TRL).
OBJECTIVES: dict[str, Objective] = {objective.name: objective for objective in (SFT, DPO)}
RANK_FACTS = tuple(field.name for field in dataclasses.fields(RankFacts))


def load_model(config: TrainConfig, source: Path, bf16: bool, fp16: bool = False) -> PreTrainedModel:
    """The base model, in the dtype its trained weights are kept in (``bf16``/``fp16``: the run's mixed precision).

    Full fine-tuning keeps fp32 master weights (and so fp32 AdamW state) and
    computes in bf16 under the Trainer's autocast: bf16 weights would round
    away most updates of a small learning rate. LoRA trains only its adapters,
    which PEFT keeps in fp32 (``autocast_adapter_dtype``), so the frozen base can
    be held in bf16, halving its memory. QLoRA holds the blocks' linear weights
    in 4-bit NF4, computing in the run's precision.
    """
    kwargs: dict[str, Any] = {
        "dtype": torch.bfloat16 if bf16 and config.training_method.trains_adapter else torch.float32,
        "attn_implementation": attention_of(config),
    }
    if not config.training_method.quantised_base:
        return AutoModelForCausalLM.from_pretrained(source, **kwargs)
    from importlib.metadata import version

    from transformers import BitsAndBytesConfig

    # the dtype the rest of the run computes in: bf16, fp16 on GPUs without native bf16, else (CPU, or
    # mixed_precision false) fp32
    compute = torch.bfloat16 if bf16 else torch.float16 if fp16 else torch.float32
    kwargs["quantization_config"] = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute,
        # FSDP2 shards floating-point tensors only: accelerate leaves uint8-packed 4-bit weights out of the sharding
        # (every rank would hold the whole base), so under fsdp the same 4-bit values are packed into the compute dtype
        bnb_4bit_quant_storage=compute if config.sharding == "fsdp" else torch.uint8,
    )
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    keep_4bit_layout(model)
    log.info(
        "qlora: the base's linear layers are held in 4-bit NF4 with double quantisation (bitsandbytes %s), computing "
        "in %s; the LoRA adapters train on every one of them that lora_target_modules names",
        version("bitsandbytes"),
        str(compute).removeprefix("torch."),
    )
    return model


def keep_4bit_layout(model: PreTrainedModel) -> None:
    """Stop bitsandbytes repacking 4-bit weights for its CPU inference kernel (GPUs never repack).

    On a CPU with AVX512-BF16, ``Linear4bit.forward`` in eval mode replaces ``weight.data`` with a repacked copy
    of another shape and marks the shared quantisation state as repacked. Under FSDP2 that data is the gathered
    copy, dropped after the forward, while the mark stays: every later forward reads the original layout as the
    repacked one (the evaluation loss of a 2-rank run came out at the untrained model's). With compiled blocks
    the new shape is a new graph of every block after the first evaluation (the GPU check's CPU mode passed
    the recompile limit on it). The training path never repacks.
    """
    from bitsandbytes.nn import Linear4bit

    for module in model.modules():
        if isinstance(module, Linear4bit):
            module.support_avx512bf16_for_cpu = False


def attention_of(config: TrainConfig) -> str:
    """The attention kernel this run loads its model with."""
    return attention.attention_kernel(
        config.attention, config.packing, torch.cuda.is_available(), compiled.why_run_not_compiled(config) is None
    )


def lora_config(config: TrainConfig) -> LoraConfig | None:
    if not config.training_method.trains_adapter:
        return None
    modules = config.lora_target_modules
    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=modules
        if modules == "all-linear"
        else [name.strip() for name in modules.split(",") if name.strip()],
        task_type="CAUSAL_LM",
    )


def clear_incomplete_checkpoints(config: TrainConfig, topology: Topology) -> Path | None:
    """Rank 0 removes checkpoints whose save was interrupted; every rank gets the newest complete one.

    Every rank inspects before rank 0 removes anything, so no rank ever reads a
    directory while it is being deleted.
    """
    verdicts = checkpoints.inspect_all(config.checkpoints_dir)
    distributed.barrier()
    if topology.is_main:
        for verdict in verdicts:
            if not verdict.complete:
                log.warning(
                    "removing incomplete checkpoint %s (%s); it is never resumed from", verdict.path, verdict.problem
                )
                shutil.rmtree(verdict.path, ignore_errors=True)
    distributed.barrier()
    return checkpoints.newest_complete(verdicts)


def trained_weights_dtype(model: torch.nn.Module) -> str:
    """The dtype of the weights the optimizer updates, as they are: what the summary says ran."""
    return ",".join(sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.requires_grad}))


def device_name() -> str:
    return torch.cuda.get_device_name(torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"


def final_eval_loss(trainer: Trainer) -> float | None:
    """The eval loss at the last step: reuse the end-of-training evaluation when there was one."""
    if trainer.eval_dataset is None:
        return None
    evaluations = [entry for entry in trainer.state.log_history if "eval_loss" in entry]
    if evaluations and evaluations[-1].get("step") == trainer.state.global_step:
        return evaluations[-1]["eval_loss"]
    return trainer.evaluate()["eval_loss"]


def merged_from_adapter(config: TrainConfig, source: Path, dtype: torch.dtype) -> PreTrainedModel:
    """The written ``adapter/`` merged into a fresh copy of the base in ``dtype``: for a model that cannot merge
    in place (4-bit, or sharded across ranks)."""
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    return PeftModel.from_pretrained(base, config.adapter_dir).merge_and_unload()


def write_adapter(model: torch.nn.Module, config: TrainConfig, full_weights: dict | None = None) -> None:
    """``adapter/`` from the PEFT ``model`` (from its gathered ``full_weights`` under FSDP), refused unless it holds
    every LoRA tensor the model trained.

    PEFT picks the adapter's tensors by the model's module names; a wrapper it does not know (FSDP's
    ``CheckpointWrapper`` did) leaves it none, and the merge then silently publishes the untrained base.
    """
    weights = full_weights if full_weights is not None else model.state_dict()
    trained = sum(".lora_" in name for name in weights)

    def fill(directory: Path) -> None:
        model.save_pretrained(directory, state_dict=full_weights)
        with safe_open(directory / "adapter_model.safetensors", "pt") as written:
            # an adapted embedding or output layer also writes the base layer's weight beside its LoRA tensors
            count = sum(".lora_" in name for name in written.keys())
        if count != trained:
            raise RuntimeError(
                f"adapter/ would hold {count} LoRA tensors but the model trained {trained}: PEFT did not match the "
                "model's module names to its weights, and merged/ would be the untrained base. Nothing was written; "
                "this is a bug in the trainer, please report it with this log."
            )

    replace_dir(config.adapter_dir, fill)


def gathered_model(
    sharded: torch.nn.Module,
    full_weights: dict[str, torch.Tensor],
    config: TrainConfig,
    source: Path,
    dtype: torch.dtype,
) -> PreTrainedModel:
    """The FSDP-trained model as a plain one on rank 0, LoRA already merged, from its gathered weights.

    LoRA: ``adapter/`` is written from the gathered weights, then merged into a fresh copy of the
    base. Full: the weights are assigned to a model built on the meta device, so rank 0's host
    memory holds the weights once.
    """
    if config.training_method.trains_adapter:
        write_adapter(sharded, config, full_weights)
        return merged_from_adapter(config, source, dtype)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(sharded.config, dtype=dtype)
    model.load_state_dict({name: tensor.to(dtype) for name, tensor in full_weights.items()}, assign=True)
    model.tie_weights()
    return model


def save_models(
    trainer: Trainer,
    config: TrainConfig,
    source: Path,
    tokenizer: PreTrainedTokenizerBase,
    dtype: torch.dtype,
    is_main: bool,
) -> None:
    """``adapter/`` (LoRA only) and ``merged/``: a plain checkpoint the evaluation and GGUF stages load.

    Every rank calls it: under FSDP the full weights are first gathered onto rank 0, a collective;
    rank 0 alone writes. ``merged/`` is written in ``dtype``: bf16 where training computed in bf16
    (the size of a bf16 base checkpoint, not the fp32 master weights' double), else fp32. Under DDP
    this merges and casts the trainer's own model, so nothing may read it afterwards.
    """
    model = trainer.accelerator.unwrap_model(trainer.model)
    full_weights = trainer.accelerator.get_state_dict(trainer.model) if trainer.is_fsdp_enabled else None
    if not is_main:
        return
    if full_weights is not None:
        # Rank 0 must not touch the sharded model again (its parameters are DTensors, and any use is a
        # collective the other ranks have left): rebuild a plain one from the gathered weights.
        model = gathered_model(model, full_weights, config, source, dtype)
    elif config.training_method.trains_adapter:
        write_adapter(model, config)
        # 4-bit weights cannot merge in place: merge into a fresh base in the merged dtype
        quantised = config.training_method.quantised_base
        model = merged_from_adapter(config, source, dtype) if quantised else model.merge_and_unload()
    model = model.to(dtype)

    def write_merged(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    replace_dir(config.merged_dir, write_merged)


def lora_inputs_as_they_come(model: torch.nn.Module, config: TrainConfig, mixed_precision: bool) -> Any:
    """A context in which LoRA layers take their bf16 (fp16) input as it is, unless ``lora_cast_inputs``.

    PEFT casts each adapted layer's input to the adapters' dtype (fp32) before the adapter: a full
    fp32 copy of q's, k's, v's and every other adapted input, and an fp32 dropout. Under the
    Trainer's bf16 (fp16) autocast the adapters' matrix products run in the autocast dtype anyway,
    so the copy buys nothing; their weights, gradients and AdamW state stay fp32 either way.
    """
    active = config.training_method.trains_adapter and mixed_precision and not config.lora_cast_inputs
    return disable_input_dtype_casting(model, active=active)


def speed_up(trainer: Trainer, config: TrainConfig, topology: Topology) -> SpeedPath:
    """Compile the blocks where that runs, log what attention and compilation this run has, and rehearse both
    before the first step (``trainer.rehearsal``)."""
    cuda = torch.cuda.is_available()
    reason = compiled.why_run_not_compiled(config)
    kernel = attention_of(config)
    why = f" ({attention.why_auto(kernel, config.packing, cuda, reason is None)})" if config.attention == "auto" else ""
    log.info("%s%s", attention.describe(kernel, config.packing), why)
    count = 0
    if reason:
        log.info("transformer blocks run eager: %s", reason)
    else:
        count = compiled.compile_blocks(trainer.model, config.compile_backend)
        if count:
            log.info(
                "compiling %d transformer blocks with torch.compile (backend %s, sequence length dynamic, recompile "
                "limit %d; packed rows padded to a multiple of %d tokens)",
                count,
                config.compile_backend,
                torch._dynamo.config.recompile_limit,
                compiled.PAD_MULTIPLE,
            )
        else:
            log.warning(
                "compile_blocks: %s has no transformer blocks transformers can name; nothing compiled", config.model
            )
    speed_path = SpeedPath(trainer, topology, blocks_compiled=count > 0, attention=kernel, strict=config.strict_compile)
    trainer.add_callback(speed_path)
    return speed_path


def run(config: TrainConfig) -> int:
    """Check ``config`` against this process, then train (``python -m trainer`` checks before importing this)."""
    return run_checked(config, preflight.check(config))


def run_checked(config: TrainConfig, topology: Topology) -> int:
    """Train with ``config``, which ``preflight.check`` accepted for this process's ``topology``."""
    started = time.monotonic()
    distributed.initialise(topology, config.collective_timeout_minutes)
    source = base_model.local_copy(config.model, config.base_model_revision, topology)
    base_model.check_unquantised(source, config.model, config.training_method)

    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.chat_template is None:
        raise UserError(f"the tokenizer of {config.model} has no chat template; fine-tune an instruct/chat model.")
    manifest, train_split, eval_split = data.token_rows(config, source, tokenizer)

    objective = OBJECTIVES[config.objective]
    os.environ[DISABLE_TRANSFORMERS_ENV] = "TRUE"  # before the arguments: this trainer reports the TrainJob status
    args = objective.arguments(config, topology, len(eval_split) > 0)
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(config.output_dir / "tensorboard"))
    resume_from = clear_incomplete_checkpoints(config, topology)
    preemption = PreemptionSave()
    shards = ShardRecorder(objective.example_tokens)
    sharding_check = sharding.ShardingCheck(config, topology.world_size)
    sharding.prepare_environment(config)
    precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    status = TrainJobStatus.from_environment() if topology.is_main else None
    progress = ProgressFile(
        config.output_dir / TRAINING_PROGRESS,
        mfu.peak_flops(device_name(), precision),
        config.training_method.trains_adapter,
        topology.world_size,
        status,
        with_reference=config.objective == "dpo",
        resumed_from=resume_from.name if resume_from else None,
    )
    tracking = MlflowTracking.from_config(
        config, topology.is_main, progress, world_size=topology.world_size, precision=precision
    )
    trainer = objective.trainer_class(
        model=load_model(config, source, args.bf16, args.fp16),
        args=args,
        train_dataset=train_split,
        eval_dataset=eval_split if len(eval_split) else None,
        processing_class=tokenizer,
        peft_config=lora_config(config),
        callbacks=[CompletionManifest(), preemption, progress, sharding_check, *([tracking] if tracking else [])],
        shards=shards,
    )
    if args.disable_tqdm:
        trainer.remove_callback(PrinterCallback)  # in pods our progress lines say it once, readably
    speed_path = speed_up(trainer, config, topology)
    log.info(
        "gradient checkpointing %s%s",
        checkpointing_words(config),
        " (transformers' own, also under fsdp, where FSDP2 gathers no block twice: its warning above is FSDP1's)"
        if config.recomputes_activations and config.sharding == "fsdp"
        else "",
    )
    if resume_from:
        log.info("resuming from %s", resume_from)
    with (
        lora_inputs_as_they_come(trainer.model, config, mixed_precision=args.bf16 or args.fp16),
        compiled.compile_failures_explained(),
    ):
        try:
            result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        except BaseException:
            if tracking:
                tracking.training_failed()
            raise
        if preemption.stopped_early:
            log.warning(
                "stopped for termination at step %d; the restarted job resumes from its checkpoint",
                trainer.state.global_step,
            )
            return PREEMPTED_EXIT_CODE
        eval_loss = final_eval_loss(trainer)
    ranks = diagnostics.gather(
        {
            "rank": topology.rank,
            "device": device_name(),
            # Equal on every rank under DDP; under FSDP each rank holds different shards of the weights.
            "weights_sha256": diagnostics.weights_digest(trainer.model) if config.sharding == "none" else None,
            "local_parameter_fraction": sharding_check.fraction,
            "peak_memory_mb": diagnostics.peak_memory_mb(),
            **shards.report(),
        },
        topology.world_size,
    )
    weights_dtype = trained_weights_dtype(trainer.model)  # before save_models merges and casts the model
    save_models(trainer, config, source, tokenizer, torch.bfloat16 if args.bf16 else torch.float32, topology.is_main)
    if topology.is_main:
        history = trainer.state.log_history
        write_json(config.output_dir / TRAINING_HISTORY, history)
        outputs.plot_loss_curve(history, config.output_dir / LOSS_CURVE)
        train_losses = [entry["loss"] for entry in history if "loss" in entry]
        runtime = result.metrics.get("train_runtime", time.monotonic() - started)
        tokens = int(trainer.state.num_input_tokens_seen)
        rate = (tokens - progress.first_tokens) / runtime if runtime else None
        TrainingSummary(
            config=config.as_json(),
            base_model_commit=base_model.snapshot_commit(source),
            world_size=topology.world_size,
            devices=tuple(rank["device"] for rank in ranks),
            sharding="fsdp" if trainer.is_fsdp_enabled else "none",
            precision=precision,
            gradient_checkpointing=config.recomputes_activations,  # resolved: auto follows the method
            trained_weights_dtype=weights_dtype,
            learning_rate=args.learning_rate,
            resumed_from=str(resume_from) if resume_from else None,
            global_step=trainer.state.global_step,
            epochs=trainer.state.epoch,
            train_examples=manifest.train.conversations,
            eval_examples=manifest.eval.conversations,
            train_rows=len(train_split),
            tokens_dir=str(config.tokens_dir),
            data_sources=data.data_sources(manifest),
            source_tokens=manifest.train.sources,
            tokens_seen=tokens,
            train_runtime_s=runtime,
            # this attempt's tokens over its runtime: a resumed run's tokens_seen counts the earlier attempts' too
            non_padding_tokens_per_s=rate,
            mfu=progress.utilisation(rate),
            trainjob_status=status.summary() if status else None,
            mlflow=tracking.summary() if tracking else None,
            final_train_loss=train_losses[-1] if train_losses else None,
            mean_train_loss=result.training_loss,
            final_eval_loss=eval_loss,
            ranks=tuple(RankFacts(**{field: rank[field] for field in RANK_FACTS}) for rank in ranks),
            **speed_path.summary(),
        ).write(config.output_dir / TRAINING_SUMMARY)
        write_json(
            config.output_dir / DATA_SHARDS,
            [{"rank": rank["rank"], "epochs": rank["epochs"]} for rank in ranks],
        )
        log.info("wrote %s", config.output_dir)
    distributed.finish()
    return 0
