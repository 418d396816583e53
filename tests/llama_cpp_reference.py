"""llama.cpp's own converter, as the reference our GGUF files are compared with.

``convert_hf_to_gguf.py`` (with its ``conversion`` package and the ``gguf-py``
it was released with) ships inside the llama-cpp-python sdist on PyPI. It is
downloaded with pip for the installed llama-cpp-python version, extracted once
into the cache (``$LLM_FT_CACHE`` or ``~/.cache/llm-finetune-pipeline``, under
``reference/``) and never committed. The tests and the benchmark run it in a
subprocess with that gguf-py first on the path, exactly as the script runs
itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

from components.local_model import cache_root

PACKAGE = "llama-cpp-python"
MEMBERS = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "conversion/", "gguf-py/")


def reference_dir() -> Path:
    """A directory holding llama.cpp's converter (as LLAMA_CPP_DIR would), fetched on first use."""
    wanted = version(PACKAGE)
    target = cache_root() / "reference" / f"llama.cpp-from-{PACKAGE}-{wanted}"
    if (target / "convert_hf_to_gguf.py").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                f"{PACKAGE}=={wanted}",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--quiet",
                "-d",
                scratch,
            ],
            check=True,
        )
        sdist = next(Path(scratch).glob("*.tar.gz"))
        building = Path(scratch) / "llama.cpp"
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                parts = member.name.split("/", 3)  # <pkg>-<ver>/vendor/llama.cpp/<path>
                if (
                    len(parts) == 4
                    and parts[1:3] == ["vendor", "llama.cpp"]
                    and parts[3].startswith(MEMBERS)
                    and member.isfile()
                ):
                    member.name = parts[3]
                    archive.extract(member, building, filter="data")
        try:
            os.rename(building, target)
        except OSError:
            if not (target / "convert_hf_to_gguf.py").is_file():
                raise
    return target


# Runs several conversions in one process (torch and transformers are imported
# once), the way convert_hf_to_gguf.py's main() does for one.
DRIVER = r"""
import json, sys
from pathlib import Path
converter = Path(sys.argv[1])
sys.path[:0] = [str(converter / "gguf-py"), str(converter)]
import logging, torch, gguf
from conversion import ModelBase, ModelType, get_model_architecture, get_model_class
logging.basicConfig(level=logging.WARNING)
ftypes = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
          "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
with torch.inference_mode():
    for model_dir, outtype, outfile, pre in json.loads(sys.argv[2]):
        hparams = ModelBase.load_hparams(Path(model_dir), False)
        model_class = get_model_class(get_model_architecture(hparams, ModelType.TEXT))
        if pre:  # the converter has no --pre-tokenizer option: stand in for it
            model_class = type(model_class.__name__, (model_class,),
                               {"model_arch": model_class.model_arch,
                                "get_vocab_base_pre": lambda self, tokenizer, pre=pre: pre})
        model_class(Path(model_dir), ftypes[outtype], Path(outfile)).write()
"""


def reference_convert(jobs: list[tuple[Path, str, Path, str]], timeout: float = 900) -> None:
    """Convert each (model_dir, outtype, outfile, pre-tokenizer override or "") with llama.cpp's converter,
    in one subprocess."""
    encoded = json.dumps([[str(model), outtype, str(out), pre] for model, outtype, out, pre in jobs])
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, str(reference_dir()), encoded], capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise RuntimeError(f"llama.cpp's converter failed:\n{result.stderr[-4000:]}")


def reference_convert_cli(model_dir: Path, outtype: str, outfile: Path) -> list[str]:
    """The command line of one conversion by ``convert_hf_to_gguf.py`` itself (for the benchmark)."""
    return [
        sys.executable,
        str(reference_dir() / "convert_hf_to_gguf.py"),
        str(model_dir),
        "--outfile",
        str(outfile),
        "--outtype",
        outtype,
    ]
