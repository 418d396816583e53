"""GPU training speed, MFU and peak memory of ``python -m trainer``, with the fit check's estimate beside them.

The model is random-initialised from a public ``config.json`` (default SmolLM3-3B's, kept in
``tests/model_configs``): speed and memory depend on the shapes, not on the weights, and no Hub is
needed. Any tokenizer whose ids are below the config's vocabulary will do (the local SmolLM2's).
Every case trains the prepared bundled data, packed, with ``--require-cuda`` (no silent CPU run):

- lora (the defaults: sdpa attention) and lora with Liger's kernels, one sequence per step;
- full fine-tuning with gradient checkpointing, without and with Liger's kernels;
- two sequences per step: lora, lora with gradient checkpointing, and full with it.

Tokens/s is the steady state: non-padding tokens over time between the ``--warmup-steps``-th and
the last logged step of the trainer's own history (``training_history.json``), so CUDA/Triton
warm-up and the end-of-training checkpoint are left out. MFU = tokens/s x model FLOPs per token /
the GPU's dense bf16 peak, where model FLOPs per token are 6 N for full fine-tuning and 4 N for LoRA
(the frozen base needs no weight gradients) with N the weights of every matrix multiplication (all
``nn.Linear`` layers, the LM head included); recomputation under gradient checkpointing and the
attention scores (conversations average under 200 tokens: below 1% of the FLOPs) are not counted.
Peak memory is what the training process's caching allocator reserved (``peak_memory_mb`` in
``training_summary.json``); the fit check's estimate also counts 1.5 GiB for the CUDA context and
NCCL, outside the allocator.

The GPU image lacks the cluster libraries the fit check imports, so the run writes its measurements
to a JSON file and ``--report`` prints the table with the estimates where the repository's
environment is installed:

    python benchmarks/gpu_train_bench.py --tokenizer DIR --data-dir DIR --work DIR --results r.json   # GPU
    python benchmarks/gpu_train_bench.py --report r.json                                             # anywhere
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

DEFAULT_CONFIG = REPO_ROOT / "tests" / "model_configs" / "SmolLM3-3B.json"
# Dense bf16 tensor-core peaks from NVIDIA's datasheets (SXM parts), in FLOP/s.
DATASHEET_BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}
# method, gradient checkpointing, Liger's kernels, packed sequences per step
CASES = [
    ("lora", False, False, 1),
    ("lora", False, True, 1),
    ("full", True, False, 1),
    ("full", True, True, 1),
    ("lora", False, False, 2),
    ("lora", True, False, 2),
    ("full", True, False, 2),
]


def case_name(case: tuple) -> str:
    method, checkpointing, liger, batch = case
    return f"{method}{', grad. checkpointing' if checkpointing else ''}{', Liger' if liger else ''}, {batch} per step"


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
    matmul_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
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
    """Tokens/s between the warm-up step's log entry and the last one, and the steps it spans."""
    logged = [entry for entry in history if "loss" in entry and "train_runtime" in entry]
    first = next(entry for entry in logged if entry["step"] >= warmup_steps)
    last = logged[-1]
    tokens = last["num_input_tokens_seen"] - first["num_input_tokens_seen"]
    return tokens / (last["train_runtime"] - first["train_runtime"]), last["step"] - first["step"]


def case_config(case: tuple, max_length: int, **run: object) -> object:
    """The trainer's options for ``case``: what the run trains and what the fit check estimates."""
    from trainer.config import TrainConfig

    method, checkpointing, liger, batch = case
    return TrainConfig(
        method=method,
        gradient_checkpointing=checkpointing,
        liger_kernels=liger,
        per_device_batch_size=batch,
        max_length=max_length,
        **run,
    )


def run_case(args: argparse.Namespace, model: Path, case: tuple) -> dict:
    import dataclasses

    from components.tokenise.options import TokeniseOptions
    from components.tokenise.stage import tokenise
    from trainer.config import to_args

    output = args.work / "run"
    config = case_config(
        case,
        args.max_length,
        model=str(model),
        output_dir=output,
        max_steps=args.steps,
        logging_steps=1,
        save_steps=100000,
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
    result: dict = {"case": case, "wall_s": time.monotonic() - started}
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
        "cases": [],
    }
    for index in args.cases:
        print(f"running {case_name(CASES[index])} ...", flush=True)
        results["cases"].append(run_case(args, model, CASES[index]))
        args.results.write_text(json.dumps(results, indent=1))  # partial results survive a time-out
    return results


def report(results: dict) -> None:
    from components.training.fit import ModelShape, estimate

    shape = ModelShape.from_config(json.loads(DEFAULT_CONFIG.parent.joinpath(results["config"]).read_text()), "")
    peak = next((flops for gpu, flops in DATASHEET_BF16_PEAK.items() if gpu in results["gpu"]), None)
    print(
        f"{results['gpu']} ({results['gpu_memory_gib']:.0f} GiB); {results['versions']}; random-initialised "
        f"{results['config'].removesuffix('.json')} ({results['matmul_weights'] / 1e9:.2f}B matmul weights); "
        f"packed sequences of {results['max_length']} tokens, tokens/s over steps "
        f"{results['warmup_steps']}-{results['steps']}; bf16 matmul measured at "
        f"{results['measured_matmul_flops'] / 1e12:.0f} TFLOP/s, datasheet "
        f"{f'{peak / 1e12:.0f}' if peak else 'unknown'}\n"
    )
    print(
        f"| case | tokens/s | MFU (datasheet) | MFU (measured matmul) | peak {results.get('peak', 'allocated')} GiB "
        "| fit estimate GiB | estimate error |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for result in results["cases"]:
        case = tuple(result["case"])
        if "error" in result:
            print(f"| {case_name(case)} | failed: {result['error'].strip().splitlines()[-1]} |||||")
            continue
        config = case_config(case, results["max_length"], model="", output_dir=Path("."))
        predicted = estimate(shape, config, 1, on_gpu=True).total / 2**30
        used = result["peak_mb"] / 1024
        flops = result["tokens_per_s"] * (6 if config.method == "full" else 4) * results["matmul_weights"]
        print(
            f"| {case_name(case)} | {result['tokens_per_s']:,.0f} | {f'{flops / peak:.1%}' if peak else 'n/a'} "
            f"| {flops / results['measured_matmul_flops']:.1%} | {used:.1f} | {predicted:.1f} "
            f"| {(predicted - used) / used:+.0%} |"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the model's config.json")
    parser.add_argument("--tokenizer", type=Path, help="a directory holding tokenizer.json and its config")
    parser.add_argument("--data-dir", type=Path, help="the prepare stage's output (train.parquet, eval.parquet)")
    parser.add_argument("--work", type=Path, help="scratch space: the model and one run at a time")
    parser.add_argument("--results", type=Path, help="where the measurements are written")
    parser.add_argument("--cases", type=lambda text: [int(i) for i in text.split(",")], default=range(len(CASES)))
    parser.add_argument("--max-length", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--report", type=Path, help="print the table of a results file (needs the fit check)")
    args = parser.parse_args(argv)
    if args.report:
        report(json.loads(args.report.read_text()))
        return
    results = measure(args)
    for case in results["cases"]:
        print(json.dumps(case)[:2000])


if __name__ == "__main__":
    main()
