"""Benchmark reading a GGUF header: gguf-py's GGUFReader against gguf_export.reader.

What is measured: CPU seconds (best of three, each contender in its own process) to read the metadata and tensor
directory of a GGUF file whose vocabulary has N tokens and N merges with their scores and types, the part of a
header that grows with the model's tokenizer, at two sizes: SmolLM2's 49,152 and Llama 3's 128,256. The files are
generated here with gguf-py's own writer (one small tensor) and removed afterwards. The export's verification and
the chat command read every file they open this way before llama.cpp loads it.

Usage: ``python benchmarks/gguf_reader_bench.py [--sizes 49152 128256]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from gguf_export.reader import read_gguf  # noqa: E402

REPEATS = 3


def write_file(path: Path, vocabulary: int) -> None:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"Ġtoken{index}é" for index in range(vocabulary)])
    writer.add_token_merges([f"Ġtok en{index}" for index in range(vocabulary)])
    writer.add_token_scores([float(-index) for index in range(vocabulary)])
    writer.add_token_types([1] * vocabulary)
    writer.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def best_cpu_seconds(read) -> float:
    times = []
    for _ in range(REPEATS):
        started = time.process_time()
        read()
        times.append(time.process_time() - started)
    return min(times)


def gguf_py(path: Path) -> list[str]:
    from gguf import GGUFReader

    return GGUFReader(path).fields["tokenizer.ggml.tokens"].contents()


def ours(path: Path) -> list[str]:
    return read_gguf(path).metadata["tokenizer.ggml.tokens"]


READERS = {"gguf-py": gguf_py, "ours": ours}


def measured(reader: str, path: Path) -> float:
    """Best CPU seconds of ``reader`` on ``path``, in a fresh process that imports only that reader."""
    command = [sys.executable, __file__, "--measure", reader, str(path)]
    return float(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[49152, 128256])
    parser.add_argument("--measure", nargs=2, metavar=("READER", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        reader, path = READERS[args.measure[0]], Path(args.measure[1])
        reader(path)  # imports, outside the measurement
        print(best_cpu_seconds(lambda: reader(path)))
        return 0
    print("| tokens and merges | GGUFReader s | gguf_export.reader s | ratio |")
    print("| ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as directory:
        for size in args.sizes:
            path = Path(directory) / f"vocabulary-{size}.gguf"
            write_file(path, size)
            assert gguf_py(path) == ours(path)
            baseline, ours_seconds = measured("gguf-py", path), measured("ours", path)
            print(f"| {size:,} | {baseline:.2f} | {ours_seconds:.3f} | {baseline / ours_seconds:.0f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
