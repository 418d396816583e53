"""The fit check's estimate against the memory training really used, on CPU runs of SmolLM2-135M.

Each configuration trains a few steps in its own process with ``python -m trainer``'s ``run``.
Measured = the process's peak resident memory (``peak_memory_mb`` in training_summary.json) minus
its resident memory once torch, transformers and TRL are imported, before the model loads. The
estimate is ``components.train.fit.estimate`` for one CPU process (fp32, no GPU overhead).

    python benchmarks/fit_bench.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

# method, gradient checkpointing, micro-batch, max_length
CASES = [
    ("full", False, 1, 512),
    ("full", True, 1, 512),
    ("full", False, 2, 1024),
    ("lora", False, 1, 512),
    ("lora", False, 2, 1024),
]


def config_for(model: str, output: Path, case: tuple) -> object:
    from trainer.config import TrainConfig

    method, checkpointing, batch, length = case
    return TrainConfig(
        model=model,
        output_dir=output,
        method=method,
        gradient_checkpointing="true" if checkpointing else "false",
        per_device_batch_size=batch,
        max_length=length,
        max_steps=4,
        save_steps=1000,
        logging_steps=1,
    )


def run_one(model: str, data: Path, output: Path, case: tuple) -> None:
    import dataclasses

    from components.tokenise.options import TokeniseOptions
    from components.tokenise.stage import tokenise
    from trainer.train import run  # imports torch, transformers, TRL and PEFT

    config = config_for(model, output, case)
    options = TokeniseOptions(data_dir=data, model=model, cache_dir=data.parent / "tokens", workers=1)
    config = dataclasses.replace(config, tokens_dir=tokenise(options, config)[0])
    baseline_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert run(config) == 0
    summary = json.loads((output / "training_summary.json").read_text())
    (output / "measured.json").write_text(
        json.dumps({"baseline_mb": baseline_mb, "peak_mb": summary["ranks"][0]["peak_memory_mb"]})
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_one is not None:
        run_one(args.model, args.data, args.output, CASES[args.run_one])
        return

    from components.data.options import PrepareOptions
    from components.data.prepare import prepare
    from components.local_model import local_base_model
    from components.sample_data import bundled_dataset_path
    from components.train.fit import ModelShape, estimate

    model = str(local_base_model())
    work = Path(tempfile.mkdtemp(prefix="fit-bench-"))
    prepare(str(bundled_dataset_path()), work / "data", PrepareOptions())
    shape = ModelShape.from_config(json.loads((Path(model) / "config.json").read_text()), model)
    print(f"model {model}: {shape.parameters / 1e6:.1f}M parameters; one CPU process, fp32, 4 steps\n")
    print("| method | gradient checkpointing | micro-batch x max_length | estimate MiB | measured MiB | error |")
    print("|---|---|---|---:|---:|---:|")
    errors = []
    for index, case in enumerate(CASES):
        output = work / f"case{index}"
        command = [sys.executable, __file__, "--run-one", str(index), "--model", model]
        command += ["--data", str(work / "data"), "--output", str(output)]
        subprocess.run(command, check=True, cwd=REPO_ROOT, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        measured = json.loads((output / "measured.json").read_text())
        used = measured["peak_mb"] - measured["baseline_mb"]
        predicted = estimate(shape, config_for(model, output, case), 1, on_gpu=False).total / 2**20
        errors.append((predicted - used) / used)
        method, checkpointing, batch, length = case
        print(
            f"| {method} | {'on' if checkpointing else 'off'} | {batch} x {length} | {predicted:,.0f} | {used:,.0f} "
            f"| {errors[-1]:+.0%} |"
        )
    print(f"\nlargest error {max(errors, key=abs):+.0%} (positive: the estimate is above what was used)")


if __name__ == "__main__":
    main()
