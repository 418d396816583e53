"""The trainer as it runs in the pods: real torchrun, two ranks on gloo, real checkpoints and signals.

The model is a tiny randomly initialised Llama with SmolLM2's real tokenizer (cut to its first 2048 ids) and
chat template (see conftest), so each step takes a fraction of a second on CPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, read_stats, run_module, tokenised
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer import checkpoints
from trainer.diagnostics import SAMPLE_SIZE

pytestmark = pytest.mark.slow

# Logs every file a rank opens for writing (and every rename/mkdir/remove) to
# $AUDIT_WRITES_DIR/rank<N>.log, through Python's audit hooks: how a test can see
# which rank wrote what without changing the trainer. At exit it also notes whether bitsandbytes was loaded and
# whether the rank was still in its process group.
AUDIT_SITECUSTOMIZE = """
import os, sys
_directory = os.environ.get("AUDIT_WRITES_DIR")
if _directory and "RANK" in os.environ:
    _log = open(os.path.join(_directory, "rank%s.log" % os.environ["RANK"]), "a", buffering=1)
    _WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    def _hook(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            mode, flags = args[1], args[2] or 0
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or flags & _WRITE_FLAGS:
                _log.write("open %s\\n" % os.path.abspath(os.fsdecode(args[0])))
        elif event in ("os.rename", "os.replace"):
            _log.write("%s %s -> %s\\n" % (event, os.path.abspath(os.fsdecode(args[0])),
                                            os.path.abspath(os.fsdecode(args[1]))))
        elif event in ("os.mkdir", "os.remove", "os.rmdir", "shutil.rmtree"):
            _log.write("%s %s\\n" % (event, os.path.abspath(os.fsdecode(args[0]))))
    sys.addaudithook(_hook)
    import atexit
    atexit.register(lambda: sys.modules.get("bitsandbytes") and _log.write("loaded bitsandbytes\\n"))
    def _group_left():
        distributed = sys.modules.get("torch.distributed")
        if distributed is not None and distributed.is_available() and distributed.is_initialized():
            _log.write("process group alive at exit\\n")
    atexit.register(_group_left)
    class _Teardown:
        # freed when the interpreter tears its modules down: a process that skips the teardown never writes
        def __del__(self, _write=os.write, _fd=os.open(os.path.join(_directory, "rank%s.log" % os.environ["RANK"]),
                                                        os.O_WRONLY | os.O_APPEND)):
            _write(_fd, b"interpreter teardown\\n")
    _teardown = _Teardown()
"""


def trainer_args(model: Path | str, data: Path, output: Path, *extra, tokenizer: Path | None = None) -> list[str]:
    """The trainer's command line on ``data`` (the data stage's output), tokenised first as the pipeline's tokenise
    step does, with the model's tokenizer (or ``tokenizer``'s, for a Hub id)."""
    packing = "--no-packing" not in map(str, extra)
    return [
        "--model",
        str(model),
        "--tokens-dir",
        str(tokenised(Path(tokenizer or model), data, packing=packing)),
        "--output-dir",
        str(output),
        "--max-length",
        "128",
        "--per-device-batch-size",
        "2",
        "--logging-steps",
        "1",
        *map(str, extra),
    ]


def torchrun(
    args: list[str],
    env: dict[str, str] | None = None,
    log: Path | None = None,
    ranks: int = 2,
    *torchrun_flags: str,
    entry: tuple[str, ...] = ("-m", "trainer"),
) -> subprocess.Popen:
    """Start ``torchrun --standalone --nproc_per_node=<ranks> -m trainer args`` (or another ``entry``) with output
    going to ``log``."""
    handle = open(log, "w") if log else subprocess.DEVNULL
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    command += torchrun_flags
    return subprocess.Popen(
        [*command, *entry, *args],
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        stdout=handle,
        stderr=subprocess.STDOUT,
    )


def finish(process: subprocess.Popen, timeout: float = 600) -> int:
    return process.wait(timeout=timeout)


SHUTDOWN_SECONDS = 20  # torchrun's --shutdown-timeout in the eviction test (the launcher sets grace - 10 s)
TORCHRUN_SIGTERM_EXIT = 1  # torchrun exits with this after forwarding SIGTERM (measured; docs/stages/train.md)


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def worker_pid(agent: subprocess.Popen, rank: int) -> int:
    """The PID of the torchrun worker with ``RANK=rank``, found through /proc."""
    for children in Path(f"/proc/{agent.pid}/task").glob("*/children"):
        for pid in children.read_text().split():
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in environ:
                return int(pid)
    raise AssertionError(f"no worker with RANK={rank} under torchrun {agent.pid}")


def summary(output: Path) -> dict:
    return json.loads((output / "training_summary.json").read_text())


def test_two_ranks_split_the_data_agree_on_weights_and_only_rank_0_writes(tiny_model_dir, prepared_data_dir, tmp_path):
    """What makes data parallelism worth paying for: disjoint shards, identical weights, one writer, a usable model.

    ``--scale-lr`` is on, so the run also shows the learning rate scaled by the world size it really had.
    """
    output, audit = tmp_path / "out", tmp_path / "audit"
    audit.mkdir()
    (audit / "sitecustomize.py").write_text(AUDIT_SITECUSTOMIZE)
    args = trainer_args(
        tiny_model_dir,
        prepared_data_dir,
        output,
        "--method",
        "full",
        "--learning-rate",
        "1e-3",
        "--scale-lr",
        "--epochs",
        "2",
        "--per-device-batch-size",
        "8",
        "--save-steps",
        "10",
        "--expected-world-size",
        "2",
    )
    process = torchrun(args, env={"AUDIT_WRITES_DIR": str(audit), "PYTHONPATH": str(audit)}, log=tmp_path / "log")
    assert finish(process) == 0, (tmp_path / "log").read_text()[-3000:]

    result = summary(output)
    assert result["world_size"] == 2 and len(result["devices"]) == 2
    assert result["data_sources"] == read_stats(prepared_data_dir)["lineage"] != []  # the data step's lineage
    assert result["learning_rate"] == pytest.approx(2e-3)  # --scale-lr: 1e-3 times the world size
    assert result["precision"] == "fp32" and result["trained_weights_dtype"] == "float32"  # on CPU
    assert result["ranks"][0]["weights_sha256"] == result["ranks"][1]["weights_sha256"]

    shards = json.loads((output / "data_shards.json").read_text())
    assert [shard["rank"] for shard in shards] == [0, 1]
    for epoch in ("0", "1"):
        first, second = (shard["epochs"][epoch] for shard in shards)
        assert first["sequences"] == second["sequences"] > 0  # equal batch counts: no rank waits for another
        assert first["digest_sum"] != second["digest_sum"], f"epoch {epoch}: both ranks trained on the same data"
        shared = set(first["first"]) & set(second["first"])
        assert first["first"] and second["first"] and not shared, f"epoch {epoch}: ranks shared {len(shared)} sequences"
        assert len(first["first"]) <= SAMPLE_SIZE  # bounded, whatever the size of the data

    losses = [entry["loss"] for entry in json.loads((output / "training_history.json").read_text()) if "loss" in entry]
    assert losses[-1] < losses[0] - 0.5, losses

    # The Trainer has every rank create the checkpoint directory (idempotent) and store its own
    # RNG state there (rng_state_<rank>.pth, via torch.save, for an exact resume); beyond that
    # rank 1 must write nothing into the shared output.
    rank1_writes = [line for line in (audit / "rank1.log").read_text().splitlines() if str(output) in line]
    assert rank1_writes and all(
        line.startswith(f"os.mkdir {output / 'checkpoints'}/checkpoint-") for line in rank1_writes
    )
    assert any(line.endswith(f"-> {output / 'merged'}") for line in (audit / "rank0.log").read_text().splitlines())
    # trainer/unused_packages.py: only qlora's ranks import bitsandbytes (PEFT would, whenever it is installed)
    assert not [log for log in audit.glob("rank*.log") if "loaded bitsandbytes" in log.read_text()]
    # trainer/distributed.finish: each rank leaves the process group before it exits (not in C++ teardown)
    assert not [log for log in audit.glob("rank*.log") if "process group alive at exit" in log.read_text()]
    # trainer/distributed.exit_process: a finished rank exits without the interpreter's teardown, in whose C++ part
    # ranks aborted after writing everything (the job then failed)
    assert not [log for log in audit.glob("rank*.log") if "interpreter teardown" in log.read_text()]

    model = AutoModelForCausalLM.from_pretrained(output / "merged")
    tokenizer = AutoTokenizer.from_pretrained(output / "merged")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "For knots, what is a bowline?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    generated = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert generated.shape[1] > prompt["input_ids"].shape[1]
    for name in ("loss_curve.png", "training_history.json"):
        assert (output / name).stat().st_size > 0
    assert list((output / "tensorboard").rglob("events.out.tfevents.*"))


# Two ranks trained with today's defaults, read by the three tests below: steps and evaluations enough for a loss
# curve, the base model from the Hub.
HUB_MODEL = "test-org/tiny-chat"
TODAYS_RUN = ("--max-steps", "6", "--save-steps", "10", "--eval-steps", "3", "--learning-rate", "1e-3")


def two_rank_history(
    model: Path | str, data: Path, output: Path, *settings: str, env=None, entry=("-m", "trainer"), tokenizer=None
) -> list[dict]:
    """The training history of two ranks trained for ``TODAYS_RUN`` with ``settings``, started through ``entry``."""
    args = trainer_args(model, data, output, *TODAYS_RUN, *settings, tokenizer=tokenizer)
    log = output.parent / f"{output.name}.log"
    assert finish(torchrun(args, env, log, entry=entry)) == 0, log.read_text()[-3000:]
    return json.loads((output / "training_history.json").read_text())


@dataclass(frozen=True)
class HubRun:
    """A run whose base model came from the (fake) Hub: its output directory, the requests the Hub saw for the
    model's repository, and the commit the run was pinned to."""

    output: Path
    requests: list[tuple[str, str]]
    revision: str


@pytest.fixture(scope="module")
def todays_run(tiny_model_dir, prepared_data_dir, tmp_path_factory) -> HubRun:
    """Two ranks with today's defaults, reading the tokenise step's cache, the base model downloaded from the Hub at
    a pinned revision (the tiny model, so its loss curve is the local directory's).

    The Hub is the fake one on 127.0.0.1 (no real Hub can be reached from the test machines)."""
    from fake_hub import FakeHub

    scratch = tmp_path_factory.mktemp("todays-run")
    with FakeHub(set()) as hub:
        repo = hub_serving(hub, tiny_model_dir, HUB_MODEL)
        env = hub.client_env(scratch / "hf-home")  # on the workspace PVC in a job: one cache for every pod
        pinned = ("--base-model-revision", repo.head)
        two_rank_history(HUB_MODEL, prepared_data_dir, scratch / "out", *pinned, env=env, tokenizer=tiny_model_dir)
        requests = [(method, path) for method, path, _ in hub.requests_to(f"/{HUB_MODEL}/")]
    return HubRun(scratch / "out", requests, repo.head)


def curves(histories: dict[str, list[dict]], key: str) -> dict[str, list[float]]:
    return {name: [entry[key] for entry in history if key in entry] for name, history in histories.items()}


def test_two_ranks_reading_the_cache_log_todays_loss_curve(todays_run, tiny_model_dir, prepared_data_dir, tmp_path):
    """The tokenise step moves tokenisation out of the ranks without changing what they train on: two ranks reading
    its rows log the same training and eval losses as two ranks that each tokenised the splits themselves and let
    TRL prepare them (the path before it, ``tests/todays_path.py``)."""
    env = {"TODAYS_DATA_DIR": str(prepared_data_dir), "PYTHONPATH": f"{REPO_ROOT}:{REPO_ROOT / 'tests'}"}
    entry = (str(REPO_ROOT / "tests" / "todays_path.py"),)
    today = two_rank_history(tiny_model_dir, prepared_data_dir, tmp_path / "today", env=env, entry=entry)
    histories = {"cache": json.loads((todays_run.output / "training_history.json").read_text()), "today": today}
    for key in ("loss", "eval_loss"):
        found = curves(histories, key)
        assert len(found["cache"]) >= 2 and found["cache"] == pytest.approx(found["today"], rel=1e-5), key
    assert summary(todays_run.output)["train_examples"] == summary(tmp_path / "today")["train_examples"]


# The settings before issue 25 (its defaults, and PEFT's cast of LoRA inputs) against today's defaults.
SETTINGS_BEFORE_ISSUE_25 = (
    "--attention",
    "sdpa",
    "--lora-dropout",
    "0.05",
    "--lora-cast-inputs",
    "--no-compile-blocks",
)
# What dropout 0.05 on the LoRA inputs may move the tiny model's losses by over these steps (measured: 0.002%).
DROPOUT_NOISE = 1e-3


def test_two_ranks_with_todays_defaults_follow_the_loss_curve_of_the_settings_before(
    todays_run, tiny_model_dir, prepared_data_dir, tmp_path
):
    """The faster defaults change how a step is computed, not what is learnt: two ranks trained with them log the
    training and eval losses of two ranks trained with the settings before them, within dropout's noise."""
    before = two_rank_history(tiny_model_dir, prepared_data_dir, tmp_path / "before", *SETTINGS_BEFORE_ISSUE_25)
    histories = {"defaults": json.loads((todays_run.output / "training_history.json").read_text()), "before": before}
    for key in ("loss", "eval_loss"):
        found = curves(histories, key)
        assert len(found["defaults"]) >= 2 and found["defaults"] == pytest.approx(found["before"], rel=DROPOUT_NOISE)
    assert found["defaults"] != found["before"], "the two runs must differ in their settings"


def single_process_eval_loss(model_dir: Path, data_dir: Path, scratch: Path, packing: bool) -> float:
    """The eval loss of ``model_dir`` on ``data_dir``'s eval split, by the trainer's own settings, in one process,
    on the rows today's data path gives (per-conversation tokenisation, then TRL's own preparation)."""
    from todays_path import tokenise_split, trl_arguments
    from trl import SFTTrainer

    from trainer import data
    from trainer.config import TrainConfig

    config = TrainConfig(
        model=str(model_dir), output_dir=scratch, max_length=128, per_device_batch_size=2, packing=packing
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eval_split = tokenise_split(data.load_split(data_dir, "eval"), tokenizer, config.loss_on)
    args = trl_arguments(config, has_eval=True)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        args=args,
        train_dataset=eval_split,  # required, never trained on here
        eval_dataset=eval_split,
        processing_class=tokenizer,
    )
    return trainer.evaluate()["eval_loss"]


@pytest.mark.parametrize(
    ("records", "packing"),
    [(60, "--packing"), (40, "--no-packing")],
    ids=["4-rows-packed-into-one", "3-rows-unpacked"],
)
def test_more_ranks_than_eval_rows_finish_and_count_each_eval_row_once(tiny_model_dir, tmp_path, records, packing):
    """Four ranks and a held-out split smaller than that (issue 12, defect 1): it used to train, then crash on every
    rank with KeyError 'eval_loss' (each rank's eval loader dropped its only, incomplete batch), so a restarted job
    crashed again until its backoff limit was spent. Now every rank evaluates, each eval row counts once, and the
    eval loss equals what one process computes for the same model on the same rows. Unpacked, three rows over four
    ranks give one rank a repeated row: a loss counted twice would move the mean."""
    import pyarrow.parquet as pq
    from conftest import qa, write_jsonl

    from components.data.options import PrepareOptions
    from components.data.prepare import prepare

    data, output = tmp_path / "data", tmp_path / "out"
    prepare(str(write_jsonl(tmp_path / "qa.jsonl", [qa(i) for i in range(records)])), data, PrepareOptions(0.04))
    assert 1 <= pq.read_table(data / "eval.parquet").num_rows <= 4  # no more than one per rank, before packing
    args = trainer_args(tiny_model_dir, data, output, "--max-steps", "2", "--save-steps", "2", "--lora-r", "4", packing)
    process = torchrun(args, log=tmp_path / "log", ranks=4)
    assert finish(process) == 0, (tmp_path / "log").read_text()[-3000:]

    result = summary(output)
    assert result["world_size"] == 4 and (output / "merged" / "config.json").is_file()
    reference = single_process_eval_loss(output / "merged", data, tmp_path / "reference", packing == "--packing")
    assert result["final_eval_loss"] == pytest.approx(reference, rel=1e-4)


def kill_rank_1_after_checkpoint_3(args: list[str], output: Path, log: Path) -> Path | None:
    """Train with ``args`` on two ranks, SIGKILL rank 1 once checkpoint-3 is complete (a pod lost mid-run), and
    return the checkpoint a relaunch would resume from."""
    process = torchrun(args, log=log)
    wait_for(
        lambda: (output / "checkpoints" / "checkpoint-3" / checkpoints.MANIFEST).exists() or process.poll() is not None,
        300,
        "the first checkpoint",
    )
    assert process.poll() is None, "training finished before it could be interrupted"
    os.kill(worker_pid(process, rank=1), signal.SIGKILL)
    assert finish(process) != 0
    return checkpoints.newest_complete(checkpoints.inspect_all(output / "checkpoints"))


def test_interrupted_checkpoint_is_skipped_and_removed(tiny_model_dir, prepared_data_dir, tmp_path):
    """A checkpoint whose save was cut short must never be loaded: resume from the one before it."""
    output = tmp_path / "out"
    first = run_module(
        "trainer",
        *trainer_args(tiny_model_dir, prepared_data_dir, output, "--max-steps", "4", "--save-steps", "2"),
        timeout=600,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    newest = output / "checkpoints" / "checkpoint-4"
    weights = newest / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated mid-write
    unmarked = output / "checkpoints" / "checkpoint-5"
    unmarked.mkdir()
    (unmarked / "trainer_state.json").write_text("{")  # a save that never finished

    second = run_module(
        "trainer",
        *trainer_args(tiny_model_dir, prepared_data_dir, output, "--max-steps", "6", "--save-steps", "2"),
        timeout=600,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert summary(output)["resumed_from"] == str(output / "checkpoints" / "checkpoint-2")
    assert summary(output)["global_step"] == 6
    assert "checkpoint-4" in second.stderr and "adapter_model.safetensors has" in second.stderr
    assert "checkpoint-5" in second.stderr and "no completion manifest" in second.stderr
    assert all(verdict.complete for verdict in checkpoints.inspect_all(output / "checkpoints"))


def test_sigterm_to_torchrun_saves_within_its_shutdown_timeout_and_a_relaunch_resumes(
    tiny_model_dir, prepared_data_dir, tmp_path
):
    """Eviction: the kubelet sends SIGTERM to the container's torchrun (the agent, not a worker), which forwards it
    and kills its workers after --shutdown-timeout (issue 12, defect 2). With gradient accumulation a step is four
    micro-batches, yet the save starts at the next micro-batch, finishes well inside the timeout, and the restarted
    job resumes from it."""
    output, log = tmp_path / "out", tmp_path / "log"
    args = trainer_args(
        tiny_model_dir, prepared_data_dir, output, "--gradient-accumulation-steps", "4", "--save-steps", "1000"
    )
    process = torchrun([*args, "--max-steps", "500"], None, log, 2, f"--shutdown-timeout={SHUTDOWN_SECONDS}")
    wait_for(lambda: "step 2/" in log.read_text() or process.poll() is not None, 300, "training to start")
    assert process.poll() is None, log.read_text()[-3000:]
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    returncode = finish(process, timeout=120)
    stopped_after = time.monotonic() - signalled
    text = log.read_text()
    (saved,) = checkpoints.inspect_all(output / "checkpoints")
    assert saved.complete and saved.step >= 2, text[-3000:]
    assert "termination requested" in text and not (output / "merged").exists()
    assert stopped_after < SHUTDOWN_SECONDS, f"the workers were killed, not stopped: {stopped_after:.1f} s"
    assert returncode == TORCHRUN_SIGTERM_EXIT, text[-3000:]  # non-zero: restartPolicy OnFailure restarts the pod

    relaunch = torchrun([*args, "--max-steps", str(saved.step + 2)], None, tmp_path / "log2")
    assert finish(relaunch) == 0, (tmp_path / "log2").read_text()[-3000:]
    result = summary(output)
    assert result["resumed_from"] == str(saved.path) and result["global_step"] == saved.step + 2
    # The rate is this attempt's two steps over its runtime; tokens_seen counts the first attempt's steps too.
    attempt_tokens = result["non_padding_tokens_per_s"] * result["train_runtime_s"]
    assert 0 < attempt_tokens < result["tokens_seen"] * 2 / (saved.step + 2) * 1.5
    progress = json.loads((output / "progress.json").read_text())  # names a checkpoint from its first record on
    assert progress["finished"] and int(progress["last_checkpoint"].removeprefix("checkpoint-")) >= saved.step


def test_world_size_mismatch_fails_at_start(tiny_model_dir, prepared_data_dir, tmp_path):
    """A PyTorchJob whose workers never joined must not train alone on everything."""
    result = run_module(
        "trainer", *trainer_args(tiny_model_dir, prepared_data_dir, tmp_path / "out", "--expected-world-size", "2")
    )
    assert result.returncode == 2
    assert "--expected-world-size is 2" in result.stderr and "WORLD_SIZE=1" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_options_a_rank_cannot_honour_are_refused_before_transformers_peft_and_trl_load(
    tiny_model_dir, prepared_data_dir, tmp_path
):
    """trainer/preflight.py: the refusal costs torch's import, not the whole trainer's (-X importtime lists every
    module the process imported)."""
    args = trainer_args(tiny_model_dir, prepared_data_dir, tmp_path / "out", "--liger-kernels")
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "trainer", *args], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 2 and "--liger-kernels needs a CUDA GPU" in result.stderr
    lines = result.stderr.splitlines()
    imported = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}
    assert "torch" in imported and not imported & {"transformers", "peft", "trl", "datasets"}


def test_a_pod_given_gpus_without_usable_cuda_stops_instead_of_training_on_the_cpu(
    tiny_model_dir, prepared_data_dir, tmp_path
):
    """Issue 12, defect 3: the launcher's command for a GPU job, run where CUDA does not work (here: no GPU at all,
    as in a pod whose driver is too old for the image's torch), must stop at once with what to change."""
    import dataclasses

    from train_jobs import example_spec

    assert not torch.cuda.is_available()
    spec = example_spec(nodes=1, gpus=1)
    spec = dataclasses.replace(
        spec, train=dataclasses.replace(spec.train, model=str(tiny_model_dir), tokens_dir=prepared_data_dir)
    )
    output = tmp_path / "out"
    command = spec.trainer_command()
    assert "--require-cuda" in command
    args = command[command.index("trainer") + 1 :]
    args[args.index("--output-dir") + 1] = str(output)
    args[args.index("--expected-world-size") + 1] = "1"
    result = run_module("trainer", *args)
    assert result.returncode == 2, result.stderr
    error = " ".join(result.stderr.split())
    assert error.startswith("error: The training job was given GPUs, but CUDA is not usable in this pod")
    assert f"built for CUDA {torch.version.cuda or 'none'}" in error and "NVIDIA driver is" in error
    assert "gpus_per_node to 0" in error and "Traceback" not in error
    assert not output.exists()


def hub_serving(hub, model_dir: Path, repo_id: str):
    return hub.add_repo(
        "model", repo_id, {path.name: path.read_bytes() for path in model_dir.iterdir() if path.is_file()}
    )


def test_two_ranks_download_a_hub_model_once_at_the_pinned_revision(todays_run):
    """Issue 12, defect 5: rank 0 downloads the base model into the shared cache while the other ranks wait, so each
    file crosses the network once per job; the pinned revision is what was trained, and it is recorded."""
    # One rank's snapshot download: the file list once, then each file's metadata (HEAD) and body (GET) once.
    requests = todays_run.requests
    assert len(requests) == len(set(requests)), f"the Hub was asked more than once: {sorted(requests)}"
    downloads = [path for method, path in requests if method == "GET" and "/resolve/" in path]
    weights = [path for path in downloads if path.endswith(".safetensors")]
    assert weights and len(downloads) == len(set(downloads))
    result = summary(todays_run.output)
    assert result["config"]["model"] == HUB_MODEL and result["config"]["base_model_revision"] == todays_run.revision
    assert (
        result["base_model_commit"] == todays_run.revision and (todays_run.output / "merged" / "config.json").is_file()
    )


def test_an_unknown_base_model_revision_is_a_clear_error(tiny_model_dir, prepared_data_dir, tmp_path):
    """A mistyped revision must be named with the fix, not end in a traceback from the download code."""
    from fake_hub import FakeHub

    with FakeHub(set()) as hub:
        hub_serving(hub, tiny_model_dir, HUB_MODEL)
        env = hub.client_env(tmp_path / "hf")
        args = trainer_args(
            HUB_MODEL,
            prepared_data_dir,
            tmp_path / "out",
            "--base-model-revision",
            "v9",
            tokenizer=tiny_model_dir,
        )
        result = subprocess.run(
            [sys.executable, "-m", "trainer", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True
        )
    assert result.returncode == 2, result.stderr[-2000:]
    error = " ".join(result.stderr.split())
    assert f"Could not download the base model '{HUB_MODEL}' at revision 'v9'" in error
    assert "Traceback" not in error


def test_a_base_stored_quantised_is_refused_for_lora_naming_the_fix(tiny_model_dir, prepared_data_dir, tmp_path):
    """trainer/base_model.check_unquantised: a LoRA rank runs without bitsandbytes (trainer/unused_packages.py),
    so a pre-quantised base must be named before transformers asks for bitsandbytes to load it."""
    base = tmp_path / "base-bnb-4bit"
    base.mkdir()
    for file in tiny_model_dir.iterdir():
        (base / file.name).symlink_to(file)
    settings = json.loads((tiny_model_dir / "config.json").read_text())
    settings["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (base / "config.json").unlink()
    (base / "config.json").write_text(json.dumps(settings))

    args = trainer_args(base, prepared_data_dir, tmp_path / "out", tokenizer=tiny_model_dir)
    result = run_module("trainer", *args)

    assert result.returncode == 2, result.stderr[-2000:]
    error = " ".join(result.stderr.split())
    assert f"The base model '{base}' is stored quantised (bitsandbytes, in its config.json)" in error
    assert "method lora trains and merges unquantised weights" in error and "Traceback" not in error
    assert not (tmp_path / "out").exists()
