"""Will the training job fit its GPUs? A per-GPU memory estimate made before any pod is asked for.

From the base model's ``config.json`` alone (a dense decoder: Llama, SmolLM, Qwen, Mistral) and the
run's settings, each GPU's memory is made of (bytes; P parameters, T trainable, S the number of
processes the state is sharded over: the world size under FSDP, 1 under DDP):

- weights: full fine-tuning keeps fp32 master weights, 4P/S; LoRA keeps the frozen base in the
  compute dtype (2 bytes on GPUs) and its adapters in fp32: 2(P-T)/S + 4T/S; QLoRA holds the blocks'
  L linear weights in 4-bit NF4 (``NF4_BYTES`` each, with their quantisation constants) and the rest
  of the base (embeddings, norms, the output head) in the compute dtype: (NF4_BYTES x L + 2(P-L) + 4T)/S;
- gradients 4T/S and AdamW's two moments 8T/S, in fp32;
- DDP only: its gradient buckets, another 4T, and the autocast cache of the bf16 copies of fp32
  weights used in the forward pass, 2P for full fine-tuning;
- FSDP only: the largest unit gathered whole for its forward and backward (a transformer block, or
  the embedding), in the compute dtype, twice (weights and gradients);
- activations per token and layer: the fp32 residual stream at the two norms' inputs, 2h x 4 bytes
  (2h x 2 with a bf16 LoRA base), and in the compute dtype the q/k/v projections before and after
  rotary, the attention output and the MLP's gate, up, activation and product, (5h + 3kv + 4i)
  values; LoRA with dropout adds each adapted projection's dropped input and its mask, (6h + i) x 3
  bytes. With gradient checkpointing a checkpointed layer keeps only its input, plus one layer
  recomputed at a time; with ``checkpoint_every`` n only the layers whose index is a multiple of n
  are checkpointed (transformers' ``every_n_layers``) and the others keep everything;
- logits for the loss: the projection's output, its fp32 copy and its gradient, 10 bytes per token
  and vocabulary entry (12 in fp32), none with Liger's fused linear cross-entropy;
- on CPU only (the fit benchmark's runs), the attention weights SDPA's math path keeps, heads x
  max_length² per sequence and layer;
- 1.5 GiB for the CUDA context, cuBLAS workspaces and NCCL buffers, then 10% for allocator
  fragmentation.

Under ``objective dpo`` each micro-batch puts both answers of every pair through the model (TRL's
DPOTrainer concatenates chosen and rejected), so the activations, the logits and the CPU attention
weights are those of twice the sequences. Full fine-tuning adds the frozen reference model TRL loads
beside the policy, in the policy's dtype (fp32), 4P/S: FSDP shards it too (``prepare_fsdp``), DDP
replicates it. LoRA and QLoRA need no copy: the reference is the base with the adapter disabled.

On GPUs the gradients on one side, and the bf16 copies, the gathered unit, the activations and the
logits on the other, are not held at once: the backward pass frees the latter as it makes the
former, and the optimizer step frees the gradients before the next forward pass. The peak counts
the larger of the two. On CPU the resident peak is the sum of every part.

QLoRA under FSDP has a second peak before training: accelerate loads the 4-bit base on every rank
(transformers' ``cpu_ram_efficient_loading`` does not apply to a quantised model) and FSDP shards it
only then, so each GPU first holds NF4_BYTES x L + 2(P-L), plus the overhead and fragmentation. The
estimate is the larger of the two peaks.

Tokens per micro-batch are ``per_device_batch_size x max_length`` (packed rows are full; unpacked
rows are at most that long, so the estimate is an upper bound). Measured against CPU runs in
``benchmarks/fit_bench.py`` and GPU runs in ``benchmarks/gpu_train_bench.py`` (see docs/benchmarks.md for
the errors).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kubernetes.utils import parse_quantity

from common.errors import UserError, one_line
from trainer.config import TrainConfig, checkpointing_words
from trainer.methods import LORA, QLORA

GIB = 2**30
# bitsandbytes' NF4 with double quantisation (transformers' BitsAndBytesConfig, bnb_4bit_use_double_quant): 4 bits a
# weight, one absmax per block of 64 weights quantised to 8 bits, and one fp32 scale for those per 256 blocks.
NF4_BYTES = (4 + 8 / 64 + 32 / (64 * 256)) / 8
GPU_OVERHEAD_BYTES = int(1.5 * GIB)
FRAGMENTATION = 0.10
MOST_NODES_SUGGESTED = 64
# What lives only from the forward pass until the backward pass has used it.
TRANSIENT = ("bf16 copies", "gathered", "activations", "logits")


@dataclass(frozen=True)
class ModelShape:
    """What the memory of a dense decoder depends on, read from its config.json."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied_embeddings: bool

    @classmethod
    def from_config(cls, config: dict[str, Any], source: str) -> ModelShape:
        config = config.get("text_config", config)
        if any(key in config for key in ("num_local_experts", "num_experts", "n_routed_experts")):
            raise UserError(f"{source} describes a mixture-of-experts model, which the fit check does not estimate.")
        missing = [
            key
            for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
            if not isinstance(config.get(key), int)
        ]
        if missing:
            raise UserError(f"{source} has no {', '.join(missing)}, so the fit check cannot size the model.")
        heads = config["num_attention_heads"]
        return cls(
            vocab=config["vocab_size"],
            hidden=config["hidden_size"],
            intermediate=config["intermediate_size"],
            layers=config["num_hidden_layers"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        )

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def block_parameters(self) -> int:
        attention = 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_width
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def linear_parameters(self) -> int:
        """The weights of every block's projections: what QLoRA holds in 4-bit (not the norms, embeddings or head)."""
        return self.layers * (self.block_parameters - 2 * self.hidden)

    @property
    def embedding_parameters(self) -> int:
        return self.vocab * self.hidden

    @property
    def parameters(self) -> int:
        embeddings = self.embedding_parameters * (1 if self.tied_embeddings else 2)
        return embeddings + self.layers * self.block_parameters + self.hidden

    def lora_parameters(self, rank: int) -> int:
        """Adapter parameters of all-linear LoRA at ``rank``: r x (in + out) per adapted projection."""
        q_out, kv_out = self.heads * self.head_dim, self.kv_width
        widths = [
            (self.hidden, q_out),
            (self.hidden, kv_out),
            (self.hidden, kv_out),
            (q_out, self.hidden),
            (self.hidden, self.intermediate),
            (self.hidden, self.intermediate),
            (self.intermediate, self.hidden),
        ]
        return self.layers * rank * sum(fan_in + fan_out for fan_in, fan_out in widths)


@dataclass(frozen=True)
class Estimate:
    """Bytes per GPU (or per process on CPU), by what holds them.

    On GPUs the caching allocator hands the memory the activations (and the logits, the bf16 copies
    and the gathered FSDP unit) free during the backward pass to the gradients that appear then, and
    the gradients are freed again before the next forward pass: the peak is the model state plus
    the larger of the two (measured in ``benchmarks/gpu_train_bench.py``). On CPU the resident peak
    is their sum (measured in ``benchmarks/fit_bench.py``).
    """

    parts: dict[str, int]
    shards: int
    on_gpu: bool
    # What one process holds while it loads the model, before FSDP shards it (0: nothing beyond training's peak).
    load_peak: int = 0

    @property
    def peak_parts(self) -> int:
        if not self.on_gpu:
            return sum(self.parts.values())
        transient = sum(size for name, size in self.parts.items() if name in TRANSIENT)
        held = sum(size for name, size in self.parts.items() if name not in TRANSIENT and name != "gradients")
        return held + max(self.parts["gradients"], transient)

    @property
    def training_peak(self) -> int:
        return int(self.peak_parts * (1 + FRAGMENTATION)) if self.on_gpu else self.peak_parts

    @property
    def total(self) -> int:
        return max(self.training_peak, self.load_peak)

    def lines(self) -> list[str]:
        sharded = f"sharded over {self.shards} processes" if self.shards > 1 else "replicated on every process"
        rows = [f"estimated memory per GPU: {gib(self.total)} (model state {sharded})"]
        rows += [f"  {name:<12} {gib(size):>10}" for name, size in self.parts.items() if size]
        if self.on_gpu:
            transient = " + ".join(name for name in self.parts if name in TRANSIENT and self.parts[name])
            rows.append(f"  (gradients and {transient} are not held at once: the larger counts)")
            rows.append(f"  {'fragment.':<12} {gib(self.training_peak - self.peak_parts):>10}  (+10%)")
        if self.load_peak:
            larger = (
                "the peak" if self.load_peak > self.training_peak else f"below training's {gib(self.training_peak)}"
            )
            rows.append(
                f"  {'at load':<12} {gib(self.load_peak):>10}  (every rank loads the whole 4-bit base before FSDP "
                f"shards it: {larger})"
            )
        return rows


def gib(size: float) -> str:
    return f"{size / GIB:.1f} GiB"


def estimate(shape: ModelShape, config: TrainConfig, processes: int, on_gpu: bool) -> Estimate:
    """The per-process memory of training ``shape`` with ``config`` on ``processes`` processes (see module doc)."""
    compute = 2 if on_gpu and config.mixed_precision else 4
    full = not config.training_method.trains_adapter
    shards = processes if config.sharding == "fsdp" else 1
    total = shape.parameters
    trainable = total if full else shape.lora_parameters(config.lora_r)
    frozen = total - trainable
    # QLoRA: the blocks' linear weights in 4-bit, every other base weight (embeddings, norms) in the compute dtype
    four_bit = shape.linear_parameters if config.training_method.quantised_base else 0
    rest = total - four_bit if four_bit else frozen
    sides = 2 if config.objective == "dpo" else 1  # DPO forwards each pair's chosen and rejected answer together
    parts = {
        "4-bit base": int(NF4_BYTES * four_bit) // shards,
        "weights": (4 * trainable + (compute if not full else 4) * rest) // shards,
        # DPO's frozen reference model, in the policy's fp32; the adapter methods disable the adapter instead
        "reference": 4 * total // shards if config.objective == "dpo" and full else 0,
        "gradients": 4 * trainable // shards,
        "optimizer": 8 * trainable // shards,
    }
    if shards == 1 and processes > 1:
        parts["ddp buckets"] = 4 * trainable
    if shards == 1 and full and compute == 2:
        parts["bf16 copies"] = 2 * total
    if shards > 1:
        largest_unit = max(shape.block_parameters, shape.embedding_parameters)
        parts["gathered"] = 2 * compute * largest_unit
    parts["activations"] = sides * activation_bytes(shape, config, compute)
    if not on_gpu:
        # On CPU, SDPA takes its math path, which keeps each head's max_length² attention weights for the backward
        # pass (measured in benchmarks/fit_bench.py); on GPUs its fused kernels keep none.
        layers_kept = shape.layers - checkpointed_layers(shape, config) + (1 if config.recomputes_activations else 0)
        sequences = sides * config.per_device_batch_size
        parts["attention"] = layers_kept * sequences * shape.heads * config.max_length**2 * compute
    tokens = sides * config.per_device_batch_size * config.max_length
    # Liger's fused linear cross-entropy computes the loss chunk by chunk and never holds the logits.
    parts["logits"] = 0 if config.liger_kernels else tokens * shape.vocab * (10 if compute == 2 else 12)
    if on_gpu:
        parts["overhead"] = GPU_OVERHEAD_BYTES
    return Estimate(parts, shards, on_gpu, qlora_load_peak(shape, config, shards, compute, on_gpu))


def qlora_load_peak(shape: ModelShape, config: TrainConfig, shards: int, compute: int, on_gpu: bool) -> int:
    """The whole 4-bit base that each rank of a sharded QLoRA job loads before FSDP shards it; 0 for other jobs."""
    if not config.training_method.quantised_base or shards == 1:
        return 0
    four_bit = shape.linear_parameters
    held = int(NF4_BYTES * four_bit) + compute * (shape.parameters - four_bit)
    return int((held + GPU_OVERHEAD_BYTES) * (1 + FRAGMENTATION)) if on_gpu else held


def activation_bytes(shape: ModelShape, config: TrainConfig, compute: int) -> int:
    """What the forward pass keeps for the backward pass, for one micro-batch."""
    residual = (
        2 if config.training_method.trains_adapter and compute == 2 else 4
    )  # a bf16 LoRA base keeps a bf16 residual stream
    h, kv, i = shape.hidden, shape.kv_width, shape.intermediate
    per_layer = 2 * h * residual + compute * (5 * h + 3 * kv + 4 * i)
    if config.training_method.trains_adapter and config.lora_dropout > 0:
        per_layer += (6 * h + i) * (compute + 1)
    tokens = config.per_device_batch_size * config.max_length
    checkpointed = checkpointed_layers(shape, config)
    recomputed = per_layer if checkpointed else 0  # the one checkpointed layer being recomputed
    return tokens * (checkpointed * h * residual + (shape.layers - checkpointed) * per_layer + recomputed)


def checkpointed_layers(shape: ModelShape, config: TrainConfig) -> int:
    """How many layers recompute their activations: those whose index is a multiple of ``checkpoint_every``."""
    if not config.recomputes_activations:
        return 0
    return -(-shape.layers // config.checkpoint_every)


def storage_bytes(shape: ModelShape, config: TrainConfig) -> dict[str, int]:
    """What the run writes to the workspace PVC, by what it is (bytes; on GPUs, bf16 weights).

    A checkpoint holds the trained weights and AdamW's two moments in fp32 (12 bytes per trainable
    parameter); an FSDP checkpoint also holds the frozen base of a LoRA run, sharded, in bf16. The
    Trainer keeps ``save_total_limit`` of them. ``merged/`` and the downloaded base are bf16.
    """
    total = shape.parameters
    trainable = shape.lora_parameters(config.lora_r) if config.training_method.trains_adapter else total
    checkpoint = 12 * trainable + (2 * (total - trainable) if config.sharding == "fsdp" else 0)
    return {
        "checkpoints": config.save_total_limit * checkpoint,
        "merged": 2 * total,
        "adapter": 4 * trainable if config.training_method.trains_adapter else 0,
        "base model": 2 * total,
    }


def storage_lines(shape: ModelShape, config: TrainConfig, pvc_size: str) -> list[str]:
    """The workspace space this training needs, and a warning when it exceeds ``pvc_size``."""
    parts = storage_bytes(shape, config)
    needed = sum(parts.values())
    detail = ", ".join(f"{name} {gib(size)}" for name, size in parts.items() if size)
    lines = [f"workspace space for training: {gib(needed)} ({detail}; {config.save_total_limit} checkpoints kept)"]
    if pvc_size and needed > parse_quantity(pvc_size):
        lines.append(
            f"WARNING: that is more than pvc_size {pvc_size} (the size of the workspace PVC the run creates): the "
            "run would fail writing a checkpoint or merged/. Raise pvc_size, or lower save_total_limit (at least 2)."
        )
    return lines


def read_model_config(model: str, revision: str) -> tuple[dict[str, Any], str]:
    """The base model's config.json and where it came from: a local checkpoint, or the Hub (that one file)."""
    if Path(model).is_dir():
        return _parsed(Path(model) / "config.json"), str(Path(model) / "config.json")
    from huggingface_hub import hf_hub_download

    # The launcher pod's home may not be writable (OpenShift runs it as an arbitrary user): a scratch cache.
    with tempfile.TemporaryDirectory(prefix="fit-check-") as cache:
        try:
            path = Path(hf_hub_download(model, "config.json", revision=revision or None, cache_dir=cache))
        except Exception as error:  # any Hub or network failure: the caller decides whether it matters
            raise UserError(f"could not download config.json of {model} ({one_line(error, 200)})") from None
        return _parsed(path), f"{model}@{revision or 'main'} config.json"


def _parsed(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UserError(f"could not read {path} ({error})") from None


MOST_SEQUENCES_SUGGESTED = 64


def headroom(shape: ModelShape, config: TrainConfig, processes: int, budget: int) -> list[str]:
    """What a job that fits could spend its spare memory on: less recomputation, then more tokens per micro-batch.

    Each is the largest single change that still fits: the fewest checkpointed blocks, and the most
    packed sequences per micro-batch (padding-free batches are one row of per_device_batch_size x
    max_length tokens, and a GPU reaches its speed on large ones).
    """

    def fits(changed: TrainConfig) -> bool:
        return estimate(shape, changed, processes, on_gpu=True).total <= budget

    found = []
    if config.recomputes_activations:
        if fits(replace(config, gradient_checkpointing="false")):
            found.append("gradient_checkpointing false")
        else:
            every = next(
                (
                    n
                    for n in range(shape.layers, config.checkpoint_every, -1)
                    if fits(replace(config, checkpoint_every=n))
                ),
                None,
            )
            if every:
                found.append(f"checkpoint_every {every}")
    batch = config.per_device_batch_size
    while batch < MOST_SEQUENCES_SUGGESTED and fits(replace(config, per_device_batch_size=batch + 1)):
        batch += 1
    if batch > config.per_device_batch_size:
        found.append(
            f"per_device_batch_size {batch} ({batch * config.max_length:,} tokens per micro-batch; a larger batch per "
            "optimizer step unless gradient_accumulation_steps shrinks by as much)"
        )
    return found


def fixes(shape: ModelShape, config: TrainConfig, nodes: int, procs_per_node: int, budget: int) -> list[str]:
    """Changes of one setting that make the estimate fit ``budget``, cheapest first."""

    def fits(changed: TrainConfig, job_nodes: int = nodes) -> bool:
        return estimate(shape, changed, job_nodes * procs_per_node, on_gpu=True).total <= budget

    found = []
    if not config.recomputes_activations or config.checkpoint_every > 1:
        # the least recomputation that fits: checkpointing every n-th block, n as large as fits
        every = next(
            (
                n
                for n in range(config.checkpoint_every - 1 if config.recomputes_activations else shape.layers, 0, -1)
                if fits(replace(config, gradient_checkpointing="true", checkpoint_every=n))
            ),
            None,
        )
        if every == 1:
            found.append(
                "gradient_checkpointing true" + (", checkpoint_every 1" if config.checkpoint_every > 1 else "")
            )
        elif every:
            found.append(f"gradient_checkpointing true, checkpoint_every {every}")
    sharded = replace(config, sharding="fsdp")
    if config.sharding == "none" and fits(sharded) and nodes * procs_per_node > 1:
        found.append("sharding fsdp")
    # qlora under fsdp loads its whole 4-bit base on every rank; lora's bf16 base is read by rank 0 alone and sharded
    if config.training_method is not LORA and fits(replace(config, method=LORA.name)):
        found.append("method lora")
    elif config.training_method is not QLORA and fits(replace(config, method=QLORA.name)):
        # with gradient_checkpointing auto, qlora also turns checkpointing on: the suggestion says so
        turns_on = config.gradient_checkpointing == "auto" and not config.recomputes_activations
        found.append(
            "method qlora (LoRA on the base held in 4-bit" + (", gradient checkpointing on)" if turns_on else ")")
        )
    more = next((n for n in range(nodes + 1, MOST_NODES_SUGGESTED + 1) if fits(sharded, n)), None)
    if more:
        found.append(
            f"sharding fsdp with training_nodes {more}" if config.sharding == "none" else f"training_nodes {more}"
        )
    if config.per_device_batch_size > 1 and fits(replace(config, per_device_batch_size=1)):
        found.append("per_device_batch_size 1")
    return found


def check_fit(config: TrainConfig, nodes: int, gpus_per_node: int, gpu_memory: str, pvc_size: str = "") -> list[str]:
    """The estimate as log lines; raises ``UserError`` when it exceeds ``gpu_memory``, naming what would fit.

    Without GPUs there is nothing to check. Without ``gpu_memory`` the estimate is only printed; a
    config.json that cannot be read then only skips it, but not when the check was asked for.
    """
    if gpus_per_node == 0:
        return ["fit check: the job trains on CPU (gpus_per_node 0); no GPU memory to check"]
    try:
        raw, source = read_model_config(config.model, config.base_model_revision)
        shape = ModelShape.from_config(raw, source)
    except UserError as error:
        if gpu_memory:
            raise UserError(
                f"gpu_memory is {gpu_memory}, so the train step checks that the job fits its GPUs, but {error}. "
                "Give the token in the hf-read-token Secret access to the model, or leave gpu_memory empty to skip "
                "the check."
            ) from None
        return [f"fit check skipped: {error}"]
    processes = nodes * gpus_per_node
    result = estimate(shape, config, processes, on_gpu=True)
    lines = [
        f"fit check: {shape.parameters / 1e9:.2f}B parameters ({source}), {config.method}, sharding {config.sharding}, "
        f"{nodes} x {gpus_per_node} GPUs, {config.per_device_batch_size} x {config.max_length} = "
        f"{config.per_device_batch_size * config.max_length:,} tokens per micro-batch, "
        f"gradient checkpointing {checkpointing_words(config)}, "
        f"{'bf16 mixed' if config.mixed_precision else 'fp32'} precision",
        *result.lines(),
        *storage_lines(shape, config, pvc_size),
    ]
    if not gpu_memory:
        return [*lines, "  (gpu_memory is empty: set it, e.g. 80Gi, to refuse a job that cannot fit before it starts)"]
    budget = int(parse_quantity(gpu_memory))
    if result.total <= budget:
        faster = headroom(shape, config, nodes * gpus_per_node, budget)
        return [
            *lines,
            f"  fits gpu_memory {gpu_memory} ({gib(budget)})"
            + (f"; faster settings that also fit: {'; '.join(faster)}" if faster else ""),
        ]
    options = fixes(shape, config, nodes, gpus_per_node, budget)
    raise UserError(
        "\n".join(lines)
        + f"\nThe job does not fit: about {gib(result.total)} per GPU is needed and gpu_memory is {gpu_memory} "
        f"({gib(budget)}). "
        + (
            f"Any one of these would fit: {'; '.join(options)}. "
            if options
            else "No single change of sharding, method, gradient checkpointing or node count fits. "
        )
        + "The job was not created. (If the estimate is wrong for your model, leave gpu_memory empty to skip the "
        "check, and say so in an issue.)"
    )
