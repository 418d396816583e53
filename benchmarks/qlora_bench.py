"""QLoRA against LoRA: the memory of loading the base and of training steps, on CPU, at two model sizes.

Issue 43 asks what the 4-bit base saves. Each (size, method) runs in a process of its own: the trainer's own
``load_model`` and ``lora_config`` (so the same 4-bit settings and the same all-linear adapters), then a few AdamW
steps on 512-token rows of random tokens. Measured: the peak of the process's resident memory (RSS) while it loads
the bf16 checkpoint and over the steps, each above what it held once torch, transformers, PEFT and bitsandbytes were
imported, and the bytes of the loaded model's tensors (4-bit weights with their quantisation constants). The models are
random-initialised at SmolLM2-135M's and SmolLM2-360M's public shapes (their config.json values), with SmolLM2's
tokenizer's vocabulary; random weights weigh what trained ones do.

On CPU the trainer computes in fp32, so LoRA's frozen base and the part of QLoRA's base not held in 4-bit (the
embeddings and norms) are fp32 here; on a GPU both are bf16, and the ratio of the loaded models is smaller (about
2.4x at 135M and 2.8x at 362M, by the fit check's terms, against 3.2x and 4.1x here).

    python benchmarks/qlora_bench.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

# SmolLM2-135M and SmolLM2-360M (HuggingFaceTB's config.json): Llama blocks, tied embeddings, 49,152 tokens
SHAPES = {
    "SmolLM2-135M shape": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9),
    "SmolLM2-360M shape": dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15),
}
KV_HEADS = {"SmolLM2-135M shape": 3, "SmolLM2-360M shape": 5}
VOCAB = 49152
METHODS = ("lora", "qlora")
STEPS, ROWS, TOKENS = 4, 1, 512
PHASES = {
    "load_peak_mb": "peak while loading",
    "held_mb": "the loaded model's tensors",
    "step_peak_mb": "peak over the steps",
}


def status_mb(field: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (its peak since the last ``reset_peak``) from /proc/self/status."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def tensor_mb(model: Any) -> float:
    """The bytes of the model's weights and buffers, with each 4-bit weight's quantisation constants: what it holds
    (RSS after a load also holds what the loader freed and the allocator kept, which varies from run to run)."""
    tensors = [*model.parameters(), *model.buffers()]
    for weight in model.parameters():
        state = getattr(weight, "quant_state", None)
        if state is not None:
            tensors += [state.absmax, state.code, *((state.state2.absmax, state.state2.code) if state.nested else ())]
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors) / 2**20


def reset_peak() -> None:
    """Start VmHWM again from the resident size now (Linux: 5 to clear_refs), so each phase has its own peak."""
    Path("/proc/self/clear_refs").write_text("5")


def run_one(model: Path, method: str, out: Path) -> None:
    import bitsandbytes  # noqa: F401  (imported before the baseline, as the trainer's load imports it)
    import peft
    import torch

    from trainer.config import TrainConfig
    from trainer.train import load_model, lora_config

    config = TrainConfig(model=str(model), method=method)
    baseline = status_mb("VmRSS")
    reset_peak()
    base = load_model(config, model, bf16=False)
    load_peak, held = status_mb("VmHWM") - baseline, tensor_mb(base)
    reset_peak()
    trained = peft.get_peft_model(base, lora_config(config))
    optimizer = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (ROWS, TOKENS), generator=generator)
        trained(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    out.write_text(
        json.dumps({"load_peak_mb": load_peak, "held_mb": held, "step_peak_mb": status_mb("VmHWM") - baseline})
    )


def build(name: str, directory: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, num_key_value_heads=KV_HEADS[name], tie_word_embeddings=True, **SHAPES[name])
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)  # as published: bf16


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-one", nargs=3, metavar=("MODEL", "METHOD", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_one:
        model, method, out = args.run_one
        run_one(Path(model), method, Path(out))
        return

    work = Path(tempfile.mkdtemp(prefix="qlora-bench-"))
    print(f"one CPU process per run; peaks of RSS above the imports; {STEPS} AdamW steps of {ROWS} x {TOKENS} tokens\n")
    print("| model | parameters | memory | LoRA MiB | QLoRA MiB | LoRA ÷ QLoRA |")
    print("|---|---:|---|---:|---:|---:|")
    for name in SHAPES:
        directory = work / name.replace(" ", "-")
        build(name, directory)
        measured = {}
        for method in METHODS:
            out = work / f"{directory.name}-{method}.json"
            command = [sys.executable, __file__, "--run-one", str(directory), method, str(out)]
            subprocess.run(command, check=True, cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
            measured[method] = json.loads(out.read_text())
        from components.train.fit import ModelShape

        parameters = ModelShape.from_config(json.loads((directory / "config.json").read_text()), name).parameters
        lora, qlora = measured["lora"], measured["qlora"]
        for key, what in PHASES.items():
            print(
                f"| {name} | {parameters / 1e6:.0f}M | {what} | {lora[key]:,.0f} | {qlora[key]:,.0f} "
                f"| {lora[key] / qlora[key]:.2f}× |"
            )


if __name__ == "__main__":
    main()
