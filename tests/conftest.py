"""Helpers and fixtures shared by the tests: JSONL files, CLI runs, outputs, models for the trainer."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Generator
from pathlib import Path

import process_settings
import pyarrow.parquet as pq
import pytest
from outside_reads import OutsideReads, interpreter_dirs
from shared_builds import build_once
from suite_order import Kind, run_order

from common.startup import imports_without_collection

# Under pytest-xdist, the tests that share a module fixture run in one worker (its hooks; tests/worker_groups.py).
pytest_plugins = ("worker_groups",)

REPO_ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ("train.parquet", "eval.parquet", "rejects.jsonl", "report.md", "stats.json")

# --- No test reads beside the repository ---------------------------------------------------------
# A file opened in the repository's parent directory (../<sibling>/...) fails the test or the collection
# during which it was opened: a clone of the repository does not have it (tests/outside_reads.py).

OUTSIDE_READS = OutsideReads(REPO_ROOT, allowed=interpreter_dirs())
sys.addaudithook(OUTSIDE_READS.audit)  # for the rest of the process: an audit hook cannot be removed


def fail_on_outside_reads(report: pytest.TestReport | pytest.CollectReport, where: str) -> None:
    """Turn ``report`` into a failure naming the files opened beside the repository since the last report, if any."""
    paths = OUTSIDE_READS.take()
    if paths:
        message = OUTSIDE_READS.message(where, paths)
        report.longrepr = f"{message}\n\n{report.longrepr}" if report.failed else message
        report.outcome = "failed"


def pytest_configure(config: pytest.Config) -> None:
    """Share the cores among xdist's workers and keep freed memory (tests/process_settings.py). The controller runs
    this before it starts the workers, which inherit the environment it sets."""
    from worker_groups import (
        is_worker,
    )  # imported by pytest first, as a plugin (pytest_plugins), to rewrite its asserts

    if is_worker(config):
        workers = config.workerinput["workercount"]
    else:
        workers = getattr(config.option, "numprocesses", None) or 1
    process_settings.apply(int(workers))


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Generator[None, object, object]:
    """Collecting imports every test module and, through them, torch, transformers, PEFT and TRL: with the garbage
    collector paused, as the trainer's ranks do (common/startup.py), and what they built frozen for the tests."""
    with imports_without_collection():
        return (yield)


def pytest_report_header() -> str | None:
    """Say at the top of the run when the guard cannot watch this checkout's layout, rather than pass quietly."""
    if OUTSIDE_READS.off_because:
        return f"reads beside the repository: not watched ({OUTSIDE_READS.off_because}); the static scan still runs"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Each phase of a test (setup, call, teardown) answers for the files opened while it ran."""
    report = yield
    fail_on_outside_reads(report, f"{item.nodeid} ({call.when})")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """Collecting a test module answers for the files its import opened (a path read at module level)."""
    report = yield
    fail_on_outside_reads(report, f"collecting {collector.nodeid or 'the tests'}")
    return report


def write_jsonl(path: Path, lines, *, gz: bool | None = None) -> Path:
    """Write one line per item: dicts/lists/numbers as JSON, str as UTF-8 text, bytes as is.

    Every line ends with a newline. ``gz`` defaults to compressing when the name ends in .gz.
    """
    encoded = []
    for item in lines:
        if isinstance(item, bytes):
            encoded.append(item)
        elif isinstance(item, str):
            encoded.append(item.encode("utf-8"))
        else:
            encoded.append(json.dumps(item, ensure_ascii=False).encode("utf-8"))
    data = b"".join(line + b"\n" for line in encoded)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz if gz is not None else path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def inner_pytest_environment(**extra: str) -> dict[str, str]:
    """The environment for a pytest that a test starts: this one's, less what xdist set for this worker (the inner
    run is not one of its workers), plus ``extra``."""
    return {**{key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST_")}, **extra}


def run_module(
    module: str, *args, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run ``python -m module args`` from the repository root in a real subprocess, capturing text output."""
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_cli(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -m components.data.stage`` with ``args`` in a real subprocess."""
    return run_module("components.data.stage", *args, timeout=timeout)


def read_split(output_dir: Path, split: str) -> list[dict]:
    """Rows of ``train`` or ``eval`` Parquet as dicts with ``id`` and ``messages``."""
    return pq.read_table(Path(output_dir) / f"{split}.parquet").to_pylist()


def all_rows(output_dir: Path) -> list[dict]:
    """Train rows then eval rows."""
    return read_split(output_dir, "train") + read_split(output_dir, "eval")


def read_stats(output_dir: Path) -> dict:
    return json.loads((Path(output_dir) / "stats.json").read_text(encoding="utf-8"))


def read_rejects(output_dir: Path, name: str = "rejects.jsonl") -> list[dict]:
    text = (Path(output_dir) / name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def snapshot(output_dir: Path) -> dict[str, bytes]:
    """Bytes of every published output file present in ``output_dir``."""
    return {name: (Path(output_dir) / name).read_bytes() for name in PUBLISHED if (Path(output_dir) / name).exists()}


def qa(i: int, topic: str = "knots") -> dict:
    """A distinct, valid topic/question/answer record."""
    return {"topic": topic, "question": f"question number {i}?", "answer": f"Answer number {i}."}


# --- The fake Kubernetes API ---------------------------------------------------------------------


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake Kubernetes API server (tests/fake_kube.py) as the current kubeconfig context: no cluster runs here."""
    from fake_kube import FakeKube

    server = FakeKube().start()
    monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod: the kubeconfig is used
    yield server
    server.stop()


# --- Trainer fixtures -------------------------------------------------------------------------
# The real SmolLM2 tokenizer and chat template (from the bundled GGUF), and tiny randomly initialised
# models with that tokenizer cut to its first ids: real tokenisation, training steps in milliseconds.


@pytest.fixture
def no_hub(monkeypatch):
    """No Hub can be reached from the test machines: a lookup (the fit check's config.json of a Hub model) fails at
    once instead of after huggingface_hub's five retries, 23 s. Tests of Hub access use tests/fake_hub.py instead."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # for the subprocesses a test starts


# What `python -m components.local_model` did when it built the session's SmolLM2 (tests/test_local_model.py reads
# it): its exit code and output, and each file's (mtime_ns, inode) right after the build.
LOCAL_MODEL_BUILD = "cli-build.json"


def build_local_model(cache: Path) -> None:
    """Materialise SmolLM2 into the empty cache ``cache`` through the command line, recording what it did."""
    from components.local_model import CACHE_ENV_VAR, LOCAL_MODEL_NAME

    result = run_module("components.local_model", env={**os.environ, CACHE_ENV_VAR: str(cache)}, timeout=600)
    target = cache / "models" / LOCAL_MODEL_NAME
    snapshot = {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in target.iterdir()} if target.is_dir() else {}
    record = {"returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr, "snapshot": snapshot}
    (cache / LOCAL_MODEL_BUILD).write_text(json.dumps(record))
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory) -> Path:
    """An LLM_FT_CACHE in which the command line built SmolLM2-135M-Instruct, once per test run."""
    return build_once(tmp_path_factory, "model-cache", build_local_model)


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_cache) -> Path:
    """SmolLM2-135M-Instruct, materialised once per test run into a private cache."""
    from components.local_model import LOCAL_MODEL_NAME

    return smollm2_cache / "models" / LOCAL_MODEL_NAME


# The tiny models' vocabulary: SmolLM2's first 2048 ids. A training step's cost is mostly the logits (tokens x
# vocabulary); at SmolLM2's 49152 ids a 64-wide model spent two thirds of a run computing them.
TINY_VOCABULARY = 2048
# llama.cpp's name of SmolLM2's pre-tokenizer, which a cut tokenizer keeps but cannot be recognised by.
TINY_PRE_TOKENIZER = "smollm"
# SmolLM2's ids below its first merge's: 17 special tokens, then the 235 single characters its merges start from.
SMOLLM2_FIRST_MERGE_ID = 252


def cut_tokenizer(source: Path, target: Path, size: int = TINY_VOCABULARY) -> None:
    """SmolLM2's tokenizer from ``source`` with only its first ``size`` ids, saved into ``target``.

    SmolLM2's byte-level BPE numbers each merge's result after the alphabet, in merge order, so keeping the ids
    below ``size`` and the merges that make them is a complete tokenizer: every byte still encodes, the special
    tokens, chat template and pre-tokenizer are SmolLM2's, and a text takes more (shorter) tokens. llama.cpp
    identifies pre-tokenizers by the ids of a test text, so a GGUF of a cut tokenizer names SmolLM2's explicitly.
    """
    from transformers import AutoTokenizer

    target.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(source / name, target / name)
    tokenizer = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    model = tokenizer["model"]
    merged = [
        model["vocab"].get("".join(pair.split(" ") if isinstance(pair, str) else pair)) for pair in model["merges"]
    ]
    assert model["type"] == "BPE" and merged == list(range(SMOLLM2_FIRST_MERGE_ID, len(model["vocab"]))), (
        "SmolLM2's tokenizer no longer numbers its merges in order; cut_tokenizer relies on that"
    )
    assert all(token["id"] < SMOLLM2_FIRST_MERGE_ID for token in tokenizer["added_tokens"])
    model["vocab"] = {text: id_ for text, id_ in model["vocab"].items() if id_ < size}
    model["merges"] = model["merges"][: size - SMOLLM2_FIRST_MERGE_ID]
    (target / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    assert len(AutoTokenizer.from_pretrained(target)) == size


def tiny_shape(tokenizer) -> dict:
    """The config fields of the tests' tiny models: 64 wide, the tokenizer's vocabulary, SmolLM2's special tokens."""
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )


def save_tiny_model(config, tokenizer, target: Path) -> Path:
    """A model of ``config``, randomly initialised from seed 0, saved with ``tokenizer`` into ``target``."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def save_tiny_llama(tokenizer, target: Path) -> Path:
    """The tests' tiny Llama for ``tokenizer``: 2 layers, tied embeddings, randomly initialised, saved into
    ``target``."""
    from transformers import LlamaConfig

    config = LlamaConfig(**tiny_shape(tokenizer), num_hidden_layers=2, tie_word_embeddings=True)
    return save_tiny_model(config, tokenizer, target)


@pytest.fixture(scope="session")
def tiny_model_dir(smollm2_dir, tmp_path_factory) -> Path:
    """A 2-layer, 64-wide Llama with SmolLM2's tokenizer cut to 2048 ids (``cut_tokenizer``), its chat template and
    special tokens."""
    from transformers import AutoTokenizer

    def build(target: Path) -> None:
        cut_tokenizer(smollm2_dir, target)
        save_tiny_llama(AutoTokenizer.from_pretrained(target), target)

    return build_once(tmp_path_factory, "tiny-model", build)


@pytest.fixture(scope="session")
def tiny_whole_vocabulary_dir(smollm2_dir, tmp_path_factory) -> Path:
    """A 2-layer, 64-wide Llama with SmolLM2's whole tokenizer: for local pipeline runs that check plumbing, not
    text. Its gate can compare it with a SmolLM2 adapter (a gate refuses models of different vocabularies, and
    ``tiny_model_dir``'s is cut), and llama.cpp converts and verifies it as it does SmolLM2."""
    from transformers import AutoTokenizer

    def build(target: Path) -> None:
        save_tiny_llama(AutoTokenizer.from_pretrained(smollm2_dir), target)

    return build_once(tmp_path_factory, "tiny-whole-vocabulary", build)


@pytest.fixture(scope="session")
def prepared_data_dir(tmp_path_factory) -> Path:
    """The bundled sample data through the data stage: train.parquet and eval.parquet."""
    from components.data.options import PrepareOptions
    from components.data.prepare import prepare
    from components.sample_data import bundled_dataset_path

    return build_once(
        tmp_path_factory, "prepared", lambda target: prepare(str(bundled_dataset_path()), target, PrepareOptions())
    )


def tokenised(
    model_dir: Path,
    data_dir: Path,
    *,
    max_length: int = 128,
    loss_on: str = "assistant",
    packing: bool = True,
    eval_max_rows: int = 0,
) -> Path:
    """The tokenise step's entry for ``data_dir``, as the pipeline makes it before training: in a token cache
    beside the data, so tests asking for the same settings reuse it as runs do."""
    from components.tokenise.build import build
    from trainer.token_cache import TokenSettings

    settings = TokenSettings(max_length=max_length, loss_on=loss_on, packing=packing, eval_max_rows=eval_max_rows)
    tokens_dir, _ = build(data_dir, model_dir, settings, data_dir.parent / f"{data_dir.name}-token-cache", workers=1)
    return tokens_dir


# --- GGUF export fixtures -----------------------------------------------------------------------
# SmolLM2-135M plus a tiny random checkpoint of every other architecture the converter handles,
# each converted once per session by llama.cpp's own converter (the reference) and by ours.

GGUF_COMPARED_TYPES = ("f32", "f16", "bf16", "q8_0")


def gguf_files(root: Path, models: dict[str, Path]) -> dict[tuple[str, str], Path]:
    """(model, outtype) -> where a converter writes that GGUF under ``root``."""
    return {(name, kind): root / f"{name}-{kind}.gguf" for name in models for kind in GGUF_COMPARED_TYPES}


@pytest.fixture(scope="session")
def gguf_models(smollm2_dir, tmp_path_factory) -> dict[str, Path]:
    """Checkpoint directory per architecture name: smollm2 (Llama), smollm3, qwen2, qwen3, mistral."""
    from tests.gguf_models import ARCHITECTURES, build_tiny_model

    def build(root: Path) -> None:
        for kind in ARCHITECTURES:
            build_tiny_model(kind, smollm2_dir, root / kind)

    root = build_once(tmp_path_factory, "gguf-models", build)
    return {"smollm2": smollm2_dir, **{kind: root / kind for kind in ARCHITECTURES}}


@pytest.fixture(scope="session")
def reference_ggufs(gguf_models, tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(model, outtype) -> the GGUF llama.cpp's convert_hf_to_gguf.py writes (one subprocess for all)."""
    from tests.gguf_models import PRE_TOKENIZER_OVERRIDES
    from tests.llama_cpp_reference import reference_convert

    def build(root: Path) -> None:
        reference_convert(
            [
                (gguf_models[name], kind, path, PRE_TOKENIZER_OVERRIDES.get(name, ""))
                for (name, kind), path in gguf_files(root, gguf_models).items()
            ]
        )

    return gguf_files(build_once(tmp_path_factory, "gguf-reference", build), gguf_models)


@pytest.fixture(scope="session")
def our_ggufs(gguf_models, tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(model, outtype) -> the GGUF gguf_export writes for the same checkpoint."""
    from gguf_export.convert import convert
    from gguf_export.metadata import MetadataOptions
    from tests.gguf_models import PRE_TOKENIZER_OVERRIDES

    def build(root: Path) -> None:
        for (name, kind), path in gguf_files(root, gguf_models).items():
            convert(gguf_models[name], path, kind, MetadataOptions(), PRE_TOKENIZER_OVERRIDES.get(name, ""))

    return gguf_files(build_once(tmp_path_factory, "gguf-ours", build), gguf_models)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the run: the order pytest-xdist's workers are handed tests in (tests/suite_order.py says which and why;
    tests/worker_groups.py groups them)."""

    def kind_of(item: pytest.Item) -> Kind:
        if item.path.name == "test_lock.py":
            return "lock"
        if item.get_closest_marker("slow"):
            return "slow"
        return "waits" if item.get_closest_marker("waits") else "rest"

    items[:] = run_order(items, kind_of, module_of=lambda item: item.nodeid.split("::")[0])


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 server on 127.0.0.1 (a real HTTP server speaking the S3 REST API): its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """MLflow's own tracking server on 127.0.0.1, SQLite store, artifacts proxied (tests/mlflow_server.py)."""
    from mlflow_server import start_mlflow

    server = start_mlflow(tmp_path_factory.mktemp("mlflow"))
    yield server
    server.stop()


DATA_BUCKET = "qa-data"


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The bucket DATA_BUCKET on the S3 server, reached as an S3-compatible store through AWS_ENDPOINT_URL; every
    object version is deleted after the test (a test may turn versioning on)."""
    import boto3

    for name, value in {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3")
    client.create_bucket(Bucket=DATA_BUCKET)
    yield client
    listing = client.list_object_versions(Bucket=DATA_BUCKET)
    for version in listing.get("Versions", []) + listing.get("DeleteMarkers", []):
        client.delete_object(Bucket=DATA_BUCKET, Key=version["Key"], VersionId=version["VersionId"])
    client.delete_bucket(Bucket=DATA_BUCKET)


@pytest.fixture(scope="module")
def oci_registry(tmp_path_factory):
    """Debian's docker-registry on 127.0.0.1 with Basic auth (tests/oci_registry.py): host and auth file."""
    from tests.oci_registry import start_registry

    registry, process = start_registry(tmp_path_factory.mktemp("oci-registry"))
    yield registry
    process.terminate()
    process.wait(timeout=30)
