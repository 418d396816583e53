"""GPU training speed, MFU, peak memory and attention FLOPs of ``python -m trainer``, old path against new.

The model is random-initialised from a public ``config.json`` (default SmolLM3-3B's, kept in
``tests/model_configs``): speed and memory depend on the shapes, not on the weights, and no Hub is
needed. Any tokenizer whose ids are below the config's vocabulary will do (the local SmolLM2's).
Every case trains the prepared bundled data, packed, with ``--require-cuda`` (no silent CPU run), and
runs twice in the same run: "old", the options of the 2026-11-24 measurements
(``results/gpu_train_bench-h100-2026-11-24.json``: sdpa attention, eager blocks, LoRA dropout 0.05,
each LoRA input cast to fp32), and "new", the trainer's defaults (attention auto, which packed on a
GPU is flex_attention; compiled blocks; dropout 0; no cast). The cases:

- lora and lora with Liger's kernels, one sequence per step;
- full fine-tuning with gradient checkpointing, without and with Liger's kernels;
- two sequences per step: lora, lora with gradient checkpointing, and full with it;
- sequences of 8,192 tokens: lora, and full with gradient checkpointing.

The report prints both rows of a case, new ÷ old tokens/s and peak memory and the final losses'
difference, against issue 25's targets: new at least twice old's tokens/s with no more peak memory;
on an H100 at 4,096 tokens, lora at least 15,700 tokens/s and full with checkpointing 17,000 and 30%
MFU (twice the 2026-11-24 figures).

Tokens/s is the steady state: tokens over time between the ``--warmup-steps``-th and the last logged
step of the trainer's own history (``training_history.json``), so CUDA/Triton warm-up, compilation
and the end-of-training checkpoint are left out; tokens are the rows' real ones (the trainer counts
them before any padding). It times training alone. The trainer's default evaluates at the end of
every epoch, and the bundled data packs into 10 rows of 4,096 tokens (5 of 8,192), so the 40 steps
span epochs: the 2026-11-24 figures include evaluations at steps 10, 20 and 30, and with compiled
blocks an evaluation (no gradients) can also recompile them. The runs now pass ``eval_steps`` =
``--steps``: the one evaluation follows the last step, and the Trainer logs a step before it
evaluates, so it starts after the last timed entry. ``steady_tokens_per_second`` refuses a history
with an ``eval_loss`` entry between the first and the last timed entries.

MFU = tokens/s x model FLOPs per token / the GPU's dense bf16 peak, where model FLOPs per token are
6 N for full fine-tuning and 4 N for LoRA (the frozen base needs no weight gradients) with N the
weights of every matrix multiplication (all ``nn.Linear`` layers, the LM head included);
recomputation under gradient checkpointing and attention are not counted in it.

Attention is counted apart, per step, from the packed rows the tokenise step wrote (the conversation
lengths of each row of ``train.arrow``; padding-free batching joins a step's rows into one of S
tokens): 4 x head_dim x heads FLOPs per query-key pair and layer forward (QK^T and PV), x3 for
forward and backward (the backward counted as twice the forward, as in 6 N). Executed pairs are what
the kernel computes: sdpa, given packed rows, gets a dense block-diagonal mask and computes all S^2
pairs; flex_attention skips the 128x128 blocks of its BlockMask that hold no pair of a
conversation's causal triangle, and computes 128^2 pairs in each block that does (compiled blocks
pad a row to a multiple of 128 tokens, inside the last block, which is computed anyway). Useful
pairs are the causal pairs within each conversation, L(L+1)/2 summed. Both are means over a shuffled
epoch's steps, printed in TFLOP per step and as shares of the model FLOPs. The bundled conversations
are short (133 tokens on average), so useful attention is 0.5% of LoRA's model FLOPs (0.3% of full
fine-tuning's), flex_attention executes 1.9% (1.2%), and dense sdpa 29% (19%) with one 4,096-token
sequence per step and 57% (38%) with 8,192 tokens per step. The recomputation under gradient
checkpointing is not counted here either.

Each case and path is also profiled in the bench process (``profile_case``): a few steps on one
packed batch, printing the ten CUDA kernels that took the most time. Peak memory is what the training
process's caching allocator reserved (``peak_memory_mb`` in ``training_summary.json``); the fit
check's estimate also counts 1.5 GiB for the CUDA context and NCCL, outside the allocator.

The GPU image lacks the cluster libraries the fit check imports, so the run writes its measurements
to a JSON file and ``--report`` prints the tables with the estimates where the repository's
environment is installed (results of either format):

    python benchmarks/gpu_train_bench.py --tokenizer DIR --data-dir DIR --work DIR --results r.json   # GPU
    python benchmarks/gpu_train_bench.py --report r.json                                             # anywhere
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from trainer import mfu  # noqa: E402  (the repository is on the path from here)
from trainer.methods import method_named  # noqa: E402

DEFAULT_CONFIG = REPO_ROOT / "tests" / "model_configs" / "SmolLM3-3B.json"


class Case(NamedTuple):
    """One measured configuration; stored in the results as a list (four items before max_length existed)."""

    method: str
    checkpointing: bool
    liger: bool
    batch: int  # packed sequences per step
    max_length: int = 0  # 0: the run's --max-length


CASES = [
    Case("lora", False, False, 1),
    Case("lora", False, True, 1),
    Case("full", True, False, 1),
    Case("full", True, True, 1),
    Case("lora", False, False, 2),
    Case("lora", True, False, 2),
    Case("full", True, False, 2),
    Case("lora", False, False, 1, 8192),
    Case("full", True, False, 1, 8192),
]
# The trainer's options on each path; "new" is its defaults.
PATHS = {
    "old": {"attention": "sdpa", "compile_blocks": False, "lora_dropout": 0.05, "lora_cast_inputs": True},
    "new": {},
}
SPEEDUP_TARGET = 2.0
# Issue 25's absolute targets on an H100 (twice the 2026-11-24 figures): (method, checkpointing, liger, batch,
# max_length) -> (tokens/s, datasheet MFU or None).
ABSOLUTE_TARGETS = {("lora", False, False, 1, 4096): (15_700, None), ("full", True, False, 1, 4096): (17_000, 0.30)}
TOP_KERNELS = 10


def case_name(case: Case, max_length: int) -> str:
    return (
        f"{case.method}{', grad. checkpointing' if case.checkpointing else ''}{', Liger' if case.liger else ''}, "
        f"{case.batch} per step, {case.max_length or max_length} tokens"
    )


def build_model(config_path: Path, tokenizer: Path, target: Path) -> int:
    """Write a random-initialised bf16 checkpoint of ``config_path``'s shape; return its matmul weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(config_path, target / "config.json")
    config = AutoConfig.from_pretrained(target)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(target)
    for file in tokenizer.iterdir():
        if file.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(file, target / file.name)
    matmul_weights = mfu.matmul_weights(model)
    del model
    torch.cuda.empty_cache()
    return matmul_weights


def measured_matmul_peak() -> float:
    """FLOP/s of an 8192^3 bf16 matrix product on random data, the ceiling this GPU really reaches."""
    import torch

    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, repeats = time.perf_counter(), 20
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * repeats / (time.perf_counter() - start)


def steady_tokens_per_second(history: list[dict], warmup_steps: int) -> tuple[float, int]:
    """Tokens/s between the warm-up step's log entry and the last one, and the steps it spans.

    Raises if an evaluation lies between the two: its time would be counted as training.
    """
    logged = [(index, entry) for index, entry in enumerate(history) if "loss" in entry and "train_runtime" in entry]
    first_index, first = next((index, entry) for index, entry in logged if entry["step"] >= warmup_steps)
    last_index, last = logged[-1]
    evaluated = [entry["step"] for entry in history[first_index:last_index] if "eval_loss" in entry]
    if evaluated:
        raise RuntimeError(
            f"evaluation at step(s) {evaluated} lies inside the timed window (steps {first['step']}-{last['step']})"
        )
    tokens = last["num_input_tokens_seen"] - first["num_input_tokens_seen"]
    return tokens / (last["train_runtime"] - first["train_runtime"]), last["step"] - first["step"]


def useful_pairs(lengths: Sequence[int]) -> int:
    """Query-key pairs a causal mask within each conversation allows: each token attends to itself and before."""
    return sum(length * (length + 1) // 2 for length in lengths)


def flex_pairs(lengths: Sequence[int], block: int) -> int:
    """Pairs FlexAttention computes: ``block``^2 for each block of its BlockMask that holds an allowed pair.

    A conversation over tokens [a, b) allows pairs in the query blocks a//block..(b-1)//block, each with the key
    blocks from a//block up to its own; neighbouring conversations can share a block, counted once.
    """
    blocks: set[tuple[int, int]] = set()
    start = 0
    for length in lengths:
        first, last = start // block, (start + length - 1) // block
        blocks.update((query, key) for query in range(first, last + 1) for key in range(first, query + 1))
        start += length
    return len(blocks) * block * block


def executed_pairs(lengths: Sequence[int], kernel: str) -> int:
    """Pairs ``kernel`` computes for one padding-free row holding conversations of ``lengths`` tokens."""
    if kernel == "flex_attention":
        from trainer.attention import FLEX_BLOCK

        return flex_pairs(lengths, FLEX_BLOCK)
    if kernel == "flash_attention_2":  # varlen: each conversation's causal triangle, to within its diagonal tiles
        return useful_pairs(lengths)
    return sum(lengths) ** 2  # sdpa and eager: a dense block-diagonal mask over every pair of the row


def step_rows(rows: list[list[int]], batch: int) -> list[list[int]]:
    """The conversation lengths of each step's row over one epoch: ``batch`` packed rows drawn in shuffled order
    and joined into one, as padding-free batching does. Which rows share a step changes S^2, not the mean much."""
    order = random.Random(0).sample(range(len(rows)), len(rows))
    return [
        [length for row in order[start : start + batch] for length in rows[row]]
        for start in range(0, len(order), batch)
    ]


def attention_flops(tokens_dir: Path, batch: int, kernel: str, model_config: dict) -> dict:
    """Mean tokens, and executed and useful attention FLOPs (forward and backward), per step of this case."""
    from common.run_layout import TRAIN_ROWS
    from trainer.token_cache import open_rows

    rows = open_rows(tokens_dir, TRAIN_ROWS).data.column("seq_lengths").to_pylist()
    heads = model_config["num_attention_heads"]
    head_dim = model_config.get("head_dim") or model_config["hidden_size"] // heads
    per_pair = 3 * 4 * head_dim * heads * model_config["num_hidden_layers"]
    steps = step_rows(rows, batch)
    return {
        "kernel": kernel,
        "tokens_per_step": sum(sum(step) for step in steps) / len(steps),
        "executed_flops_per_step": per_pair * sum(executed_pairs(step, kernel) for step in steps) / len(steps),
        "useful_flops_per_step": per_pair * sum(useful_pairs(step) for step in steps) / len(steps),
    }


def attention_kernel(config: object) -> str:
    """The kernel the trainer runs for ``config`` on this bench's CUDA GPU (auto: flex_attention for packed rows in
    compiled blocks)."""
    from trainer.attention import attention_kernel
    from trainer.compiled import why_not_compiled

    compiled = why_not_compiled(config.compile_blocks, True, config.sharding) is None
    return attention_kernel(config.attention, config.packing, cuda=True, blocks_compiled=compiled)


def case_config(case: Case, max_length: int, path: str, **run: object) -> object:
    """The trainer's options for ``case`` on ``path``: what the run trains and what the fit check estimates."""
    from trainer.config import TrainConfig

    return TrainConfig(
        method=case.method,
        gradient_checkpointing="true" if case.checkpointing else "false",
        liger_kernels=case.liger,
        per_device_batch_size=case.batch,
        max_length=case.max_length or max_length,
        **PATHS[path],
        **run,
    )


def training_model(model_dir: Path, config: object) -> object:
    """The model the trainer trains for ``config``, on the GPU: LoRA on a bf16 base (fp32 adapters), or fp32 weights
    for full fine-tuning, with the case's attention kernel, checkpointing, Liger's kernels, LoRA dropout and
    compiled blocks (the trainer's own ``attention_kernel`` and ``compile_blocks``)."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from trainer.compiled import compile_blocks
    from trainer.train import lora_config

    model = AutoModelForCausalLM.from_pretrained(
        model_dir,
        dtype=torch.float32 if config.method == "full" else torch.bfloat16,
        attn_implementation=attention_kernel(config),
    ).cuda()
    if config.recomputes_activations:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.liger_kernels:
        from transformers.integrations.liger import apply_liger_kernel

        apply_liger_kernel(model, None)
    if config.method != "full":
        model = get_peft_model(model, lora_config(config))
    if config.compile_blocks:
        compile_blocks(model)
    return model.train()


def profiled_steps(model_dir: Path, tokens_dir: Path, config: object, steps: int) -> object:
    """A profiler that recorded ``steps`` steps of forward, backward and AdamW, after ``steps`` unprofiled ones
    (compilation), on the first step's rows as the trainer's collator joins (and, compiled, pads) them, under bf16
    autocast."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from common.run_layout import TRAIN_ROWS
    from trainer.compiled import PAD_MULTIPLE
    from trainer.token_cache import open_rows
    from trainer.train import lora_inputs_as_they_come

    model = training_model(model_dir, config)
    rows = open_rows(tokens_dir, TRAIN_ROWS)
    collate = DataCollatorForLanguageModeling(
        pad_token_id=model.config.pad_token_id or 0,
        padding_free=True,
        pad_to_multiple_of=PAD_MULTIPLE if config.compile_blocks else None,
    )
    batch = collate([rows[index] for index in range(config.per_device_batch_size)])
    batch = {name: value.cuda() if isinstance(value, torch.Tensor) else value for name, value in batch.items()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)

    def train_steps() -> None:
        for _ in range(steps):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    with lora_inputs_as_they_come(model, config, mixed_precision=True):
        train_steps()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            train_steps()
    return profiler


def profile_case(model_dir: Path, tokens_dir: Path, config: object, steps: int) -> dict:
    """The CUDA kernels that took the most time in ``steps`` training steps of ``config``, in this process.

    The trainer runs in a subprocess the bench cannot instrument, so this builds what it trains with the same
    choices (``training_model``). Its GPU memory is handed back before the next case's trainer starts.
    """
    import gc

    import torch
    from torch.autograd import DeviceType

    torch._dynamo.reset()  # each case compiles its own blocks, as the trainer's fresh process does
    try:
        events = profiled_steps(model_dir, tokens_dir, config, steps).key_averages()
    finally:
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
    kernels = sorted(
        (event for event in events if event.device_type == DeviceType.CUDA),
        key=lambda event: event.self_device_time_total,
        reverse=True,
    )
    total_us = sum(event.self_device_time_total for event in kernels)
    return {
        "steps": steps,
        "kernel_ms_per_step": total_us / 1e3 / steps,
        "top_kernels": [
            {
                "name": event.key[:200],
                "total_ms": event.self_device_time_total / 1e3,
                "share": event.self_device_time_total / total_us,
                "calls": event.count,
            }
            for event in kernels[:TOP_KERNELS]
        ],
    }


def print_profile(name: str, profiled: dict) -> None:
    print(f"{name}: {profiled['kernel_ms_per_step']:,.1f} ms of CUDA kernels per step; those that took the most:")
    for kernel in profiled["top_kernels"]:
        print(f"  {kernel['share']:6.1%} {kernel['total_ms']:9.1f} ms {kernel['calls']:6d} x  {kernel['name'][:110]}")


def run_case(args: argparse.Namespace, model: Path, case: Case, path: str) -> dict:
    import dataclasses

    from components.tokenise.options import TokeniseOptions
    from components.tokenise.stage import tokenise
    from trainer.config import to_args

    output = args.work / "run"
    config = case_config(
        case,
        args.max_length,
        path,
        model=str(model),
        output_dir=output,
        max_steps=args.steps,
        logging_steps=1,
        save_steps=100000,
        eval_steps=args.steps,  # one evaluation, after the last timed step: see the module's docstring
        require_cuda=True,
    )
    # The pipeline's tokenise step, on the CPU before the timed run (an entry per max_length, reused across cases).
    tokens_dir, _ = tokenise(
        TokeniseOptions(data_dir=args.data_dir, model=str(model), cache_dir=args.work / "tokens"), config
    )
    config = dataclasses.replace(config, tokens_dir=tokens_dir)
    started = time.monotonic()
    process = subprocess.run(
        [sys.executable, "-m", "trainer", *to_args(config)], cwd=REPO_ROOT, capture_output=True, text=True
    )
    kernel = attention_kernel(config)
    result: dict = {
        "case": case,
        "path": path,
        "wall_s": time.monotonic() - started,
        "attention": attention_flops(tokens_dir, case.batch, kernel, json.loads(args.config.read_text())),
    }
    if process.returncode != 0:
        result["error"] = process.stderr[-3000:]
    else:
        summary = json.loads((output / "training_summary.json").read_text())
        history = json.loads((output / "training_history.json").read_text())
        speed, steps = steady_tokens_per_second(history, args.warmup_steps)
        result.update(
            tokens_per_s=speed,
            timed_steps=steps,
            whole_run_tokens_per_s=summary["non_padding_tokens_per_s"],
            peak_mb=summary["ranks"][0]["peak_memory_mb"],
            precision=summary["precision"],
            trained_weights_dtype=summary["trained_weights_dtype"],
            device=summary["devices"][0],
            final_train_loss=summary["final_train_loss"],
        )
    shutil.rmtree(output, ignore_errors=True)  # a full checkpoint is tens of GB
    if args.profile_steps:
        try:
            result["profile"] = profile_case(model, tokens_dir, config, args.profile_steps)
            print_profile(f"{case_name(case, args.max_length)}, {path}", result["profile"])
        except Exception as error:  # the measured run above stands without its profile
            result["profile_error"] = repr(error)[-3000:]
    return result


def measure(args: argparse.Namespace) -> dict:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu_train_bench.py measures GPU training: torch sees no CUDA device here.")
    model = args.work / "model"
    matmul_weights = build_model(args.config, args.tokenizer, model)
    results = {
        "config": args.config.name,
        "gpu": torch.cuda.get_device_name(),
        "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
        "versions": {name: __import__(name).__version__ for name in ("torch", "transformers", "trl", "peft")},
        "matmul_weights": matmul_weights,
        "measured_matmul_flops": measured_matmul_peak(),
        "peak": "reserved",
        "max_length": args.max_length,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "paths": PATHS,
        "cases": [],
    }
    for index in args.cases:
        for path in PATHS:
            print(f"running {case_name(CASES[index], args.max_length)}, {path} path ...", flush=True)
            results["cases"].append(run_case(args, model, CASES[index], path))
            args.results.write_text(json.dumps(results, indent=1))  # partial results survive a time-out
    return results


def model_flops_per_token(method: str, matmul_weights: int) -> float:
    """The trainer's count (trainer/mfu.py): 6 FLOPs a weight for full fine-tuning, 4 for adapters."""
    return mfu.flops_per_token(matmul_weights, method_named(method).trains_adapter)


def attention_cells(result: dict, matmul_weights: int) -> str:
    """Executed (useful) attention TFLOP per step, and as shares of the step's model FLOPs."""
    attention = result.get("attention")
    if not attention:
        return " | "
    model = attention["tokens_per_step"] * model_flops_per_token(result["case"][0], matmul_weights)
    executed, useful = attention["executed_flops_per_step"], attention["useful_flops_per_step"]
    return (
        f"{attention['kernel']}: {executed / 1e12:.2f} ({useful / 1e12:.2f}) "
        f"| {executed / model:.1%} ({useful / model:.1%})"
    )


def report_row(result: dict, results: dict, shape: object, peak: float | None) -> str:
    from components.train.fit import estimate

    case, path = Case(*result["case"]), result.get("path", "old")
    name = case_name(case, results["max_length"])
    if "error" in result:
        return f"| {name} | {path} | failed: {result['error'].strip().splitlines()[-1]} |||||||||"
    config = case_config(case, results["max_length"], path, model="", output_dir=Path("."))
    predicted = estimate(shape, config, 1, on_gpu=True).total / 2**30
    used = result["peak_mb"] / 1024
    flops = result["tokens_per_s"] * model_flops_per_token(case.method, results["matmul_weights"])
    return (
        f"| {name} | {path} | {result['tokens_per_s']:,.0f} | {f'{flops / peak:.1%}' if peak else 'n/a'} "
        f"| {flops / results['measured_matmul_flops']:.1%} | {used:.1f} | {predicted:.1f} "
        f"| {(predicted - used) / used:+.0%} | {result['final_train_loss']:.4f} "
        f"| {attention_cells(result, results['matmul_weights'])} |"
    )


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def comparison_row(old: dict, new: dict, results: dict, peak: float | None) -> str:
    """New ÷ old for one case, with issue 25's targets and whether they are met."""
    case = Case(*new["case"])
    length = case.max_length or results["max_length"]
    speedup = new["tokens_per_s"] / old["tokens_per_s"]
    memory = new["peak_mb"] / old["peak_mb"]
    absolute = ""
    target = ABSOLUTE_TARGETS.get((*case[:4], length)) if "H100" in results["gpu"] else None
    if target:
        tokens, mfu = target
        new_mfu = new["tokens_per_s"] * model_flops_per_token(case.method, results["matmul_weights"]) / peak
        met = new["tokens_per_s"] >= tokens and (mfu is None or new_mfu >= mfu)
        absolute = f"≥ {tokens:,} tokens/s{f' and ≥ {mfu:.0%} MFU' if mfu else ''}: {verdict(met)}"
    return (
        f"| {case_name(case, results['max_length'])} | {speedup:.2f}× ({verdict(speedup >= SPEEDUP_TARGET)}) "
        f"| {absolute} | {memory:.2f}× ({verdict(memory <= 1)}) "
        f"| {new['final_train_loss'] - old['final_train_loss']:+.4f} |"
    )


def paths_line(results: dict) -> str:
    if "paths" not in results:
        return "the old path alone (results from before old and new ran side by side)"
    return "; ".join(f"{path}: {options or 'the defaults'}" for path, options in results["paths"].items())


def report(results: dict) -> None:
    from components.train.fit import ModelShape

    shape = ModelShape.from_config(json.loads(DEFAULT_CONFIG.parent.joinpath(results["config"]).read_text()), "")
    peak = mfu.peak_flops(results["gpu"], "bf16")
    print(
        f"{results['gpu']} ({results['gpu_memory_gib']:.0f} GiB); {results['versions']}; random-initialised "
        f"{results['config'].removesuffix('.json')} ({results['matmul_weights'] / 1e9:.2f}B matmul weights); "
        f"packed sequences, tokens/s over steps {results['warmup_steps']}-{results['steps']}; bf16 matmul measured "
        f"at {results['measured_matmul_flops'] / 1e12:.0f} TFLOP/s, datasheet "
        f"{f'{peak / 1e12:.0f}' if peak else 'unknown'}; {paths_line(results)}\n"
    )
    print(
        f"| case | path | tokens/s | MFU (datasheet) | MFU (measured matmul) | peak {results.get('peak', 'allocated')} "
        "GiB | fit estimate GiB | estimate error | final loss | attention TFLOP/step executed (useful) "
        "| attention ÷ model FLOPs executed (useful) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for result in results["cases"]:
        print(report_row(result, results, shape, peak))
    by_path: dict[str, dict[tuple, dict]] = {}
    for result in results["cases"]:
        if "error" not in result:
            by_path.setdefault(result.get("path", "old"), {})[tuple(result["case"])] = result
    pairs = [
        (old, by_path["new"][case]) for case, old in by_path.get("old", {}).items() if case in by_path.get("new", {})
    ]
    if pairs:
        print(
            f"\n| case | tokens/s new ÷ old (target ≥ {SPEEDUP_TARGET:g}×) | absolute target (H100) "
            "| peak memory new ÷ old (target ≤ 1×) | final loss new − old |"
        )
        print("|---|---:|---|---:|---:|")
        for old, new in pairs:
            print(comparison_row(old, new, results, peak))
    for result in results["cases"]:
        if "profile" in result:
            print()
            print_profile(
                f"{case_name(Case(*result['case']), results['max_length'])}, {result['path']}", result["profile"]
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the model's config.json")
    parser.add_argument("--tokenizer", type=Path, help="a directory holding tokenizer.json and its config")
    parser.add_argument("--data-dir", type=Path, help="the prepare stage's output (train.parquet, eval.parquet)")
    parser.add_argument("--work", type=Path, help="scratch space: the model and one run at a time")
    parser.add_argument("--results", type=Path, help="where the measurements are written")
    parser.add_argument("--cases", type=lambda text: [int(i) for i in text.split(",")], default=range(len(CASES)))
    parser.add_argument("--max-length", type=int, default=4096, help="tokens per packed sequence, unless the case says")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--profile-steps", type=int, default=3, help="steps profiled per case and path (0: none)")
    parser.add_argument("--report", type=Path, help="print the tables of a results file (needs the fit check)")
    args = parser.parse_args(argv)
    if args.report:
        report(json.loads(args.report.read_text()))
        return
    results = measure(args)
    for case in results["cases"]:
        print(json.dumps(case)[:2000])


if __name__ == "__main__":
    main()
