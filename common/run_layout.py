"""The run directory: what each stage reads and writes under ``<workspace>/runs/<run id>/``.

This module is the contract between the stages. Every path a stage hands to
another is named here; a stage that writes a new file for a later stage adds its
name here first. Every run writes only below its own run directory, so runs that
share a PVC (scheduled retraining) never overwrite each other; the one thing
shared across runs is the publish record. The one exception: a run on unchanged
data whose last published version never completed store, register or serve runs
those steps on that version, so they write in that version's run directory.

    <workspace>/
      runs/<run id>/
        data/          written by prepare; read by train, evaluate, publish
          train.parquet, eval.parquet   chat ``messages`` rows (see components.data.schema)
          rejects.jsonl                 every refused record: file, line, reason
          stats.json                    counts, length percentiles, the data ``fingerprint``;
                                        written last: its presence means the split is complete
        train/         written by the training pods (rank 0); read by evaluate, export, publish
          checkpoints/checkpoint-<step>/  resumable Trainer state, each with checkpoint_complete.json
          adapter/                      the PEFT LoRA adapter (lora and qlora only)
          merged/                       the full fine-tuned checkpoint (config.json, safetensors, tokenizer)
          training_summary.json         resolved options, losses, tokens/s, world size; written last
          training_history.json, loss_curve.png, data_shards.json
          progress.json                 where training is: rewritten by rank 0 at each logging step and
                                        checkpoint; the train step prints it as its progress lines
          training_failure.txt          written by the train step when training failed or timed out: a
                                        retried step reports it again instead of training a second time
        evaluate/      written by evaluate; read by publish
          evaluation.json               losses of the base, published and new model, ROUGE-L, the gate
                                        decision and which published model it compared with; written last
          report.md, report.html, demo_outputs/sample_responses.json
        export/        written by export; read by publish
          <model>-<outtype>.gguf        one per requested type; the first is the Modelfile's
          <model>-lora-<type>.gguf      the LoRA adapter as a GGUF adapter (gguf_lora_adapter)
          Modelfile                     Ollama, FROM ./<model>-<outtype>.gguf
          verification.json, verification.md   llama.cpp vs transformers; the JSON is written last
        publish/       written by publish
          upload/                       exactly what was (or, in a dry run, would be) committed to the Hub
          delivery.json                 which of store, register and serve completed for this version: written
                                        by publish before its Hub commit (none yet, and the repository), then
                                        by each of them as it completes, also when a later run on the same
                                        data finishes them (components.champion.record)
        store/         written by store; read by register, serve and the run summary
          stored.json                   where the version was copied: its s3:// URI (model_s3_uri) and oci://
                                        image and digest (model_oci_uri), files, bytes
                                        (common.records.StoredCopies)
        register/      written by register
          registered.json               the Model Registry's ids of the model, version and artifacts
                                        (common.records.Registration)
        serve/         written by serve
          inferenceservice.yaml         the KServe InferenceService (vLLM) of the stored version, for oc apply
          served.json                   deploy: the endpoint, and the question asked and its answer (none: not
                                        deployed; common.records.Served)
          previous.json                 deploy: the InferenceService as it was before this run's spec replaced
                                        it (null: none), saved before the apply, to put back on a failure
      token-cache/<key>/                written by tokenise; read by train and evaluate of every run whose data,
                                        tokenizer and settings give the same key (see trainer.token_cache)
      .cache/huggingface/               HF_HOME of the training pods; the tokenise step fetches tokenizers here
      published/<owner>--<name>.json    the last publish of that repository (dry-run.json without one);
                                        read by the next run's data-change check, and by its evaluation,
                                        which loads that run's publish/upload/ as the model to beat

Files are written under a temporary name and renamed into place
(``common.atomic``), so a name listed here is always a complete file.
"""

from __future__ import annotations

from pathlib import Path

# Where the workspace PVC is mounted in every pipeline step and training pod on a cluster.
CLUSTER_WORKSPACE = "/mnt/workspace"
# Shared by every run on the workspace (below its root, beside runs/).
TOKEN_CACHE = "token-cache"
HF_HOME = ".cache/huggingface"
# token-cache/<key>/ (see trainer.token_cache)
TRAIN_ROWS = "train.arrow"
EVAL_ROWS = "eval.arrow"
EVAL_CONVERSATIONS = "eval_conversations.arrow"
TOKENS_MANIFEST = "manifest.json"
RUNS = "runs"
DATA, TRAIN, EVALUATE, EXPORT, PUBLISH = "data", "train", "evaluate", "export", "publish"
STORE, REGISTER, SERVE = "store", "register", "serve"
STAGES = (DATA, TRAIN, EVALUATE, EXPORT, PUBLISH, STORE, REGISTER, SERVE)

# data/
TRAIN_SPLIT = "train.parquet"
EVAL_SPLIT = "eval.parquet"
REJECTS = "rejects.jsonl"
DATA_STATS = "stats.json"
DATA_REPORT = "report.md"  # what went in, source by source (components/data/report.py)
# train/
CHECKPOINTS = "checkpoints"
ADAPTER = "adapter"
MERGED = "merged"
TRAINING_SUMMARY = "training_summary.json"
TRAINING_HISTORY = "training_history.json"
TRAINING_PROGRESS = "progress.json"
LOSS_CURVE = "loss_curve.png"
DATA_SHARDS = "data_shards.json"
TRAINING_FAILURE = "training_failure.txt"
# evaluate/
EVALUATION = "evaluation.json"
EVALUATION_MARKDOWN = "report.md"
EVALUATION_HTML = "report.html"
SAMPLE_RESPONSES = "demo_outputs/sample_responses.json"
# export/
MODELFILE = "Modelfile"
VERIFICATION_JSON = "verification.json"
VERIFICATION_MARKDOWN = "verification.md"
LORA_MARKER = "-lora-"  # in the file name of an adapter GGUF: <model>-lora-<type>.gguf
# publish/
UPLOAD = "upload"
DELIVERY = "delivery.json"
# store/
STORED = "stored.json"
# register/
REGISTERED = "registered.json"
# serve/
SERVICE_MANIFEST = "inferenceservice.yaml"
SERVED = "served.json"
PREVIOUS_SERVICE = "previous.json"
# beside runs/
PUBLISHED = "published"


def stage_dir(workspace_root: str | Path, run_id: str, stage: str) -> Path:
    """The directory of ``stage`` (one of ``STAGES``) for run ``run_id``."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
    return Path(workspace_root) / RUNS / run_id / stage
