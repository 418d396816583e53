"""benchmarks/gpu_check.py: its verdicts, the wheels it carries, its GPU report, and its CPU mode end to end.

The GPU mode needs a lent GPU machine (docs/benchmarks.md, "The GPU check"). The CPU mode runs the same
code on the tiny model with the blocks compiled by dynamo's eager backend, so the script cannot rot
between loans; the verdicts are tested on made-up results, since two correct runs never disagree.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import zipfile

import pytest
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))  # the benchmarks are scripts, not a package
from gpu_check import (  # noqa: E402
    CARRIED,
    FINAL_STEPS,
    IMAGE_LOCK,
    LOSS_TOLERANCE,
    compare_losses,
    failures,
    install_carried,
    main,
    pinned,
    report,
    run_problems,
    skip_for_time,
    trim_wheel,
)

CURVE = [10.83, 10.41, 9.97, 9.62]


def finished(name: str = "lora-defaults", options: dict | None = None, **fields) -> dict:
    """A run as the check records it, on its fast path, unless ``fields`` say otherwise."""
    return {
        "name": name,
        "options": options or {},
        "log": f"{name}.log",
        "exit_code": 0,
        "speed_fallback": None,
        "compiled_blocks": True,
        "compile": {"graphs": 4, "graphs_after_rehearsal": 0, "seconds": 50.0},
        **fields,
    }


def test_the_first_step_and_the_final_steps_are_judged_and_the_bulge_between_is_reported():
    # The H100's curves of 2026-11-27: identical at step 1, 0.056 apart at step 3 (AdamW's first updates), close at
    # the end. They pass; the largest difference is reported where it was.
    defaults = [12.1933, 12.2329, 12.1062, 11.9108, 11.634, 11.2933, 9.5718, 9.5411, 9.49, 9.557, 9.4969]
    sdpa = [12.1933, 12.2324, 12.1621, 11.9578, 11.668, 11.3139, 9.5798, 9.5484, 9.4967, 9.5643, 9.5044]
    comparison = compare_losses(defaults, sdpa, LOSS_TOLERANCE)
    assert comparison["ok"] and comparison["at_step"] == 3 and comparison["final_steps"] == FINAL_STEPS
    assert comparison["max_abs_difference"] == pytest.approx(0.0559)
    assert comparison["final_mean_difference"] == pytest.approx(-0.00736)

    first_step_off = [CURVE[0] + 2 * LOSS_TOLERANCE, *CURVE[1:]]  # the kernels disagree on the same weights
    comparison = compare_losses(first_step_off, CURVE, LOSS_TOLERANCE)
    assert not comparison["ok"] and comparison["first_step_difference"] == pytest.approx(2 * LOSS_TOLERANCE)
    results = {"runs": [finished()], "loss_comparison": comparison}
    assert failures(results) == [f"the losses of lora-defaults and lora-sdpa-eager differ: {comparison}"]

    ended_apart = [*CURVE[:2], *(loss + 3 * LOSS_TOLERANCE for loss in CURVE[2:])]  # a mean 0.03 apart
    assert not compare_losses(ended_apart, CURVE, LOSS_TOLERANCE)["ok"]
    assert compare_losses([loss + LOSS_TOLERANCE / 2 for loss in CURVE], CURVE, LOSS_TOLERANCE)["ok"]

    assert not compare_losses(CURVE, [*CURVE[:2], math.nan, CURVE[3]], LOSS_TOLERANCE)["ok"]  # NaN in between
    assert not compare_losses(CURVE, CURVE[:3], LOSS_TOLERANCE)["ok"]  # a run that stopped early
    assert not compare_losses([], [], LOSS_TOLERANCE)["ok"]  # a run that failed


def test_a_failed_run_a_fallback_eager_blocks_or_a_late_graph_fail_the_check():
    assert run_problems(finished()) == []
    assert run_problems(finished("lora-sdpa-eager", {"compile_blocks": False}, compiled_blocks=False)) == []

    assert run_problems(finished(exit_code=2, error="error: The speed path failed")) == [
        "lora-defaults: the trainer exited with 2 (lora-defaults.log): error: The speed path failed"
    ]
    assert run_problems(finished(speed_fallback="compiled blocks, flex_attention failed")) == [
        "lora-defaults: speed fallback: compiled blocks, flex_attention failed"
    ]
    assert run_problems(finished(compiled_blocks=False, compile=None)) == [
        "lora-defaults: its blocks were not compiled (lora-defaults.log says why)"
    ]
    late = finished(compile={"graphs": 5, "graphs_after_rehearsal": 1, "seconds": 60.0})
    assert run_problems(late) == [
        "lora-defaults: 1 graph(s) compiled after the rehearsal (TORCH_LOGS=recompiles in lora-defaults.log)"
    ]


def test_an_optional_run_runs_only_when_it_fits_the_budget():
    assert skip_for_time(elapsed=200, lora_wall=120, beyond_lora_s=90, budget=480) is None
    skipped = skip_for_time(elapsed=300, lora_wall=120, beyond_lora_s=90, budget=480)
    assert skipped.startswith("time: 300 s elapsed + about 210 s")
    assert skip_for_time(elapsed=9999, lora_wall=120, beyond_lora_s=90, budget=0) is None  # no budget: always


def test_runs_left_out_are_named_and_only_a_comparison_of_both_lora_runs_is_judged(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--runs", "full-checkpointing,lora-fast", "--out", str(tmp_path), "--tokenizer", str(tmp_path)])
    assert "--runs: no run named lora-fast; the runs are lora-defaults, lora-sdpa-eager" in capsys.readouterr().err

    alone = {
        "runs": [finished("full-checkpointing")],
        "loss_comparison": {"skipped": "--runs left out lora-sdpa-eager"},
    }
    assert failures(alone) == []
    late = finished("full-checkpointing", compile={"graphs": 5, "graphs_after_rehearsal": 2, "seconds": 60.0})
    assert failures({**alone, "runs": [late]}) == [
        "full-checkpointing: 2 graph(s) compiled after the rehearsal (TORCH_LOGS=recompiles in full-checkpointing.log)"
    ]


def test_the_carried_wheels_are_the_image_locks_pins_with_their_hashes():
    lines = pinned(IMAGE_LOCK.read_text(), CARRIED)
    assert [line.split("==")[0] for line in lines] == list(CARRIED)
    assert all(" --hash=sha256:" in line for line in lines)
    assert "huggingface-hub" not in CARRIED  # 2.x needs httpx2, which the GPU image lacks
    with pytest.raises(SystemExit, match="pins no not-a-package"):
        pinned(IMAGE_LOCK.read_text(), ["not-a-package"])


def test_a_carried_wheel_keeps_only_the_native_libraries_named_and_installs(tmp_path, monkeypatch):
    """bitsandbytes' wheel holds a library per CUDA and ROCm release, 43 MB: the device call carries 64 MiB in all."""
    wheel = tmp_path / "wheels" / "pkg-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    libraries = ["libpkg_cuda128.so", "libpkg_cuda130.so", "libpkg_cuda118.so", "libpkg_rocm64.so"]
    files = {"pkg/__init__.py": "VERSION = '1.0'\n", **{f"pkg/{name}": "x" * 1000 for name in libraries}}
    record = "".join(f"{name},sha256=x,{len(text)}\n" for name, text in files.items()) + "pkg-1.0.dist-info/RECORD,,\n"
    metadata = "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n"
    wheel_info = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr("pkg-1.0.dist-info/METADATA", metadata)
        archive.writestr("pkg-1.0.dist-info/WHEEL", wheel_info)
        archive.writestr("pkg-1.0.dist-info/RECORD", record)

    trim_wheel(wheel, ("libpkg_cuda128.so", "libpkg_cuda130.so"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        kept_record = archive.read("pkg-1.0.dist-info/RECORD").decode()
    assert {"pkg/libpkg_cuda128.so", "pkg/libpkg_cuda130.so", "pkg/__init__.py"} <= names
    assert not names & {"pkg/libpkg_cuda118.so", "pkg/libpkg_rocm64.so"} and "cuda118" not in kept_record
    monkeypatch.setattr(sys, "path", [*sys.path])  # install_carried puts the site first on both paths
    monkeypatch.delenv("PYTHONPATH", raising=False)
    install_carried(wheel.parent, tmp_path / "site")
    assert sorted(path.name for path in (tmp_path / "site" / "pkg").glob("*.so")) == libraries[:2]
    with pytest.raises(SystemExit, match="holds no libpkg_cuda132.so: update KEPT_LIBRARIES"):
        trim_wheel(wheel, ("libpkg_cuda132.so",))


def test_the_gpu_report_compares_with_the_2026_11_24_figures_and_the_targets(capsys):
    lora = {"tokens_per_s": 16_000.0, "mfu": 0.2, "attention": "flex_attention", "recompiles_logged": 3}
    lora |= {"peak_memory_mb": 30_000.0, "final_train_loss": 9.02, "wall_s": 150.0}
    sdpa = {**lora, "tokens_per_s": 8_000.0, "mfu": 0.1, "attention": "sdpa", "compiled_blocks": False, "compile": None}
    full = {**lora, "tokens_per_s": 17_500.0, "mfu": 0.29}
    qlora = {**lora, "tokens_per_s": 12_000.0, "mfu": 0.15, "peak_memory_mb": 12_000.0}
    report(
        {
            "mode": "gpu",
            "device": "NVIDIA H100 80GB HBM3",
            "model": "SmolLM3-3B.json",
            "versions": {"torch": "2.11.0+cu130"},
            "max_length": 4096,
            "steps": 25,
            "warmup_steps": 5,
            "baseline": {"max_length": 4096, "lora": 7853.8, "full": 8493.9},
            "runs": [
                finished(**lora),
                finished("lora-sdpa-eager", {"attention": "sdpa", "compile_blocks": False}, **sdpa),
                finished("full-checkpointing", {"method": "full", "gradient_checkpointing": "true"}, **full),
                finished("qlora-defaults", {"method": "qlora", "strict_compile": True}, **qlora),
            ],
            "loss_comparison": compare_losses(CURVE, CURVE, LOSS_TOLERANCE),
            "failures": [],
            "elapsed_s": 470.0,
        }
    )
    table = capsys.readouterr().out
    assert (
        "| lora-defaults | flex_attention, compiled | 16,000 | 20.0% | 2.04× of 7,854 | ≥ 15,700: met | 4 (0) |"
        in table
    )
    assert "| lora-sdpa-eager | sdpa, eager | 8,000 | 10.0% | 1.02× of 7,854 |  | - |" in table  # no target: old path
    assert "| 2.06× of 8,494 | ≥ 17,000, ≥ 30% MFU: MISSED |" in table
    assert "| qlora-defaults | flex_attention, compiled | 12,000 | 15.0% |  |  | 4 (0) |" in table  # no figure of old
    assert "qlora-defaults ÷ lora-defaults: tokens/s 0.75×, peak memory 0.40× (11.7 GiB against 29.3; " in table
    assert "check passed in 470 s" in table


@pytest.mark.slow
def test_the_cpu_mode_trains_both_lora_paths_alike_and_keeps_every_log(tiny_model_dir, tmp_path, capsys):
    """One invocation: LoRA on the defaults (blocks compiled by the eager backend, strict) and on sdpa with eager
    blocks, three steps each; full fine-tuning and QLoRA skipped for time by a one-second budget."""
    out = tmp_path / "out"
    command = [sys.executable, "benchmarks/gpu_check.py", "--cpu", "--model", str(tiny_model_dir), "--out", str(out)]
    process = subprocess.run(
        [*command, "--steps", "3", "--budget-s", "1"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )

    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    assert sorted(path.name for path in out.iterdir()) == ["gpu_check.json", "lora-defaults.log", "lora-sdpa-eager.log"]
    results = json.loads((out / "gpu_check.json").read_text())
    defaults, eager, full, qlora = results["runs"]
    assert full["name"] == "full-checkpointing" and full["skipped"].startswith("time: ")
    assert qlora["name"] == "qlora-defaults" and qlora["skipped"].startswith("time: ")
    assert (defaults["attention"], defaults["compiled_blocks"], defaults["speed_fallback"]) == ("sdpa", True, None)
    assert defaults["compile"]["graphs"] > 0 and defaults["compile"]["graphs_after_rehearsal"] == 0
    assert defaults["recompiles_logged"] > 0 and "Recompiling function" in (out / defaults["log"]).read_text()
    assert (eager["compiled_blocks"], eager["compile"], eager["recompiles_logged"]) == (False, None, 0)
    assert len(defaults["losses"]) == len(eager["losses"]) == 3
    assert results["loss_comparison"]["ok"] and results["failures"] == []
    assert defaults["tokens_per_s"] > 0 and eager["tokens_per_s"] > 0
    assert "| lora-defaults | sdpa, compiled |" in process.stdout and "check passed" in process.stdout

    assert main(["--report", str(out / "gpu_check.json")]) == 0
    assert "| lora-sdpa-eager | sdpa, eager |" in capsys.readouterr().out
