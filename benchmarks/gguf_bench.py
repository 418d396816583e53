"""Benchmark GGUF conversion: llama.cpp's convert_hf_to_gguf.py against gguf_export.

What is measured: wall time and peak resident memory of converting the same
checkpoint to the same output type, once by llama.cpp's own converter (from the
installed llama-cpp-python's sdist, see tests/llama_cpp_reference.py) and once
by ``python -m gguf_export``, for

* SmolLM2-135M-Instruct, stored in float32 (the local base model), and
* a random Llama of about 1.07B parameters (hidden 2048, 16 layers, FFN 8192,
  SmolLM2's 49152-token vocabulary) built by this script and stored in bf16,
  as Hub checkpoints usually are;

each to f16 and q8_0. Every conversion runs in its own fresh process: peak RSS
(``ru_maxrss`` of that child, from ``os.wait4``) is a high-water mark that would
otherwise carry over, and both converters pay their own interpreter start and
imports (torch for llama.cpp's, numpy for ours), as a user does. The outputs are
also compared: "identical" means same tensor directory and byte-identical
tensor data (metadata differs by design: see gguf_export/vocab.py).

The machine's load average is printed before and after: on a shared machine
other processes inflate both converters' wall times.

Usage: ``python benchmarks/gguf_bench.py [--workdir DIR] [--keep] [--skip-large]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from gguf_export.reader import read_gguf  # noqa: E402
from tests.gguf_files import first_difference  # noqa: E402
from tests.llama_cpp_reference import reference_convert_cli, reference_dir  # noqa: E402

OUTTYPES = ("f16", "q8_0")
TARGET_RATIO = 0.5


@dataclass(frozen=True)
class Measurement:
    checkpoint: str
    outtype: str
    converter: str
    seconds: float
    rss_mb: float
    output: Path


def build_large_llama(tokenizer_dir: Path, target: Path) -> Path:
    """A ~1.07B-parameter Llama with random bf16 weights, written shard by shard (no model object in memory)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, LlamaConfig

    if (target / "config.json").is_file():
        return target
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        rope_theta=100000.0,
        torch_dtype="bfloat16",
        architectures=["LlamaForCausalLM"],
    )
    target.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)

    def random(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    hidden, ffn = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (hidden // config.num_attention_heads)

    def layer(index: int) -> dict[str, torch.Tensor]:
        prefix = f"model.layers.{index}."
        return {
            prefix + "self_attn.q_proj.weight": random(hidden, hidden),
            prefix + "self_attn.k_proj.weight": random(kv, hidden),
            prefix + "self_attn.v_proj.weight": random(kv, hidden),
            prefix + "self_attn.o_proj.weight": random(hidden, hidden),
            prefix + "mlp.gate_proj.weight": random(ffn, hidden),
            prefix + "mlp.up_proj.weight": random(ffn, hidden),
            prefix + "mlp.down_proj.weight": random(hidden, ffn),
            prefix + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            prefix + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        }

    # Shard 1: embeddings and final norm; then two layers per shard, each generated just before it is saved.
    layers = config.num_hidden_layers
    count = 1 + (layers + 1) // 2
    weight_map = {}
    for index in range(1, count + 1):
        if index == 1:
            group = {
                "model.embed_tokens.weight": random(config.vocab_size, hidden),
                "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            }
        else:
            first = 2 * (index - 2)
            group = {name: tensor for i in range(first, min(first + 2, layers)) for name, tensor in layer(i).items()}
        name = f"model-{index:05d}-of-{count:05d}.safetensors"
        save_file(group, target / name, metadata={"format": "pt"})
        weight_map.update({tensor: name for tensor in group})
    (target / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config.save_pretrained(target)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(target)
    return target


# Runs one command and reports its wall time and peak RSS. It is a fresh, small process on
# purpose: a child's ru_maxrss starts from its parent's size at fork, so measuring from this
# benchmark (which holds torch after building the 1B checkpoint) would inflate every number.
MEASURER = r"""
import json, os, subprocess, sys, time
with open(sys.argv[1], "wb") as log:
    started = time.perf_counter()
    process = subprocess.Popen(sys.argv[3:], cwd=sys.argv[2], stdout=log, stderr=log)
    _, status, usage = os.wait4(process.pid, 0)
print(json.dumps({"seconds": time.perf_counter() - started, "rss_mb": usage.ru_maxrss / 1024,
                  "status": os.waitstatus_to_exitcode(status)}))
"""


def measure(command: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one child process (its log goes to a file)."""
    with tempfile.NamedTemporaryFile(suffix=".log") as log:
        result = subprocess.run(
            [sys.executable, "-c", MEASURER, log.name, str(cwd), *command], capture_output=True, text=True, check=True
        )
        measured = json.loads(result.stdout)
        if measured["status"] != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{Path(log.name).read_text(errors='replace')[-3000:]}")
    return measured["seconds"], measured["rss_mb"]


def run(checkpoint: str, model_dir: Path, outtype: str, workdir: Path) -> list[Measurement]:
    results = []
    for converter in ("llama.cpp", "gguf_export"):
        output = workdir / f"{checkpoint}-{outtype}-{converter}.gguf"
        if converter == "llama.cpp":
            command, cwd = reference_convert_cli(model_dir, outtype, output), reference_dir()
        else:
            command, cwd = (
                [sys.executable, "-m", "gguf_export", str(model_dir), "--outfile", str(output), "--outtype", outtype],
                REPO_ROOT,
            )
        seconds, rss = measure(command, cwd)
        results.append(Measurement(checkpoint, outtype, converter, seconds, rss, output))
        print(f"  {checkpoint} {outtype} {converter}: {seconds:.1f} s, {rss:.0f} MiB", file=sys.stderr, flush=True)
    return results


def tables(measurements: list[Measurement]) -> str:
    lines = [
        "| checkpoint | outtype | converter | wall time (s) | peak RSS (MiB) |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    lines += [
        f"| {m.checkpoint} | {m.outtype} | {m.converter} | {m.seconds:.1f} | {m.rss_mb:.0f} |" for m in measurements
    ]
    lines += [
        "",
        (
            "| checkpoint | outtype | time ours/llama.cpp | RSS ours/llama.cpp | tensors identical "
            f"| target ≤ {TARGET_RATIO} both |"
        ),
        "| --- | --- | ---: | ---: | --- | --- |",
    ]
    for reference, ours in zip(measurements[::2], measurements[1::2]):
        time_ratio, rss_ratio = ours.seconds / reference.seconds, ours.rss_mb / reference.rss_mb
        identical = first_difference(read_gguf(ours.output), read_gguf(reference.output)) is None
        met = "yes" if time_ratio <= TARGET_RATIO and rss_ratio <= TARGET_RATIO else "no"
        lines.append(
            f"| {ours.checkpoint} | {ours.outtype} | {time_ratio:.2f} | {rss_ratio:.2f} "
            f"| {'yes' if identical else 'NO'} | {met} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workdir", type=Path, help="where checkpoints and outputs go (default: a temporary directory)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--skip-large", action="store_true", help="only SmolLM2-135M (no 1B checkpoint)")
    args = parser.parse_args()

    from components.local_model import local_base_model

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gguf-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        smollm2 = local_base_model()
        checkpoints = [("SmolLM2-135M (f32)", smollm2)]
        if not args.skip_large:
            checkpoints.append(("random Llama 1.07B (bf16)", build_large_llama(smollm2, workdir / "llama-1b")))
        reference_dir()  # fetched before timing anything
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
        measurements = []
        for label, model_dir in checkpoints:
            for outtype in OUTTYPES:
                measurements += run(label, model_dir, outtype, workdir)
        print(f"load average after: {os.getloadavg()[0]:.2f}\n", flush=True)
        print(tables(measurements))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
