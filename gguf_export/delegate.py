"""Hand architectures we do not convert to a configured llama.cpp checkout.

When ``LLAMA_CPP_DIR`` points at a llama.cpp checkout (or any directory with
its ``convert_hf_to_gguf.py`` and ``gguf-py``), checkpoints the built-in
converter refuses are converted by that script in a subprocess, with its own
gguf-py, into a temporary name that is renamed when the script succeeds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from common.errors import UserError
from gguf_export.convert import ConversionResult, atomic_output

LLAMA_CPP_DIR_ENV = "LLAMA_CPP_DIR"
SCRIPT = "convert_hf_to_gguf.py"
SCRIPT_OUTTYPES = ("f32", "f16", "bf16", "q8_0", "auto")


def configured_llama_cpp() -> Path | None:
    value = os.environ.get(LLAMA_CPP_DIR_ENV, "").strip()
    return Path(value).expanduser() if value else None


def delegate(model_dir: Path, outfile: Path, outtype: str, llama_cpp_dir: Path, reason: str) -> ConversionResult:
    script = llama_cpp_dir / SCRIPT
    if not script.is_file():
        raise UserError(
            f"{LLAMA_CPP_DIR_ENV}={llama_cpp_dir} has no {SCRIPT}; point it at a llama.cpp checkout. "
            f"(Needed because: {reason})"
        )
    if outtype not in SCRIPT_OUTTYPES:
        raise UserError(
            f"llama.cpp's {SCRIPT} writes only {', '.join(SCRIPT_OUTTYPES)}, not {outtype}. (Needed because: {reason})"
        )
    started = time.perf_counter()
    outfile = Path(outfile)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(llama_cpp_dir / "gguf-py"), os.environ.get("PYTHONPATH", "")])),
    }
    with atomic_output(outfile) as temporary:
        command = [sys.executable, str(script), str(model_dir), "--outfile", str(temporary), "--outtype", outtype]
        print(
            f"built-in converter declined ({reason.split(';')[0]}); converting with {script}",
            file=sys.stderr,
            flush=True,
        )
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise UserError(
                f"llama.cpp's {SCRIPT} could not convert {model_dir} (exit {result.returncode}): "
                f"{result.stderr.strip()[-1500:]}"
            )
    return ConversionResult(
        path=outfile,
        outtype=outtype,
        architecture="(llama.cpp)",
        hf_architecture="(delegated)",
        tensor_count=0,
        parameters=0,
        size_bytes=outfile.stat().st_size,
        seconds=time.perf_counter() - started,
        notes=[f"converted by {script}"],
    )
