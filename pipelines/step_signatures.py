"""What each pipeline step takes and returns: ``python -m pipelines.generate`` writes its component from this.

A step's inputs are its own (where it works, what an earlier step returned), then the run parameters of its
stage's options under their field names (the DAG passes ``run_arguments(step, run)``), then those of another
stage's options it reads too, then its output artifacts. No input has a default: the pod runs the component's
source as written, so a default could only be a literal copied from the options, and the pipeline passes every
value. Every body has one shape: take the inputs by name, hand them to the stage's ``run_step``, return what it
gives; all logic stays plain Python, testable without KFP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List

from components.data.options import PrepareOptions
from components.evaluate.options import EvaluateOptions
from components.export.options import ExportStageOptions
from components.publish.options import PublishOptions
from components.register.options import RegistryOptions
from components.run_form.table import RunParameter, run_parameters_of
from components.serve.options import ServingOptions
from components.store.options import StorageOptions
from components.tokenise.options import TRAINING_FIELDS, TokeniseOptions
from components.train.options import LaunchOptions
from trainer.config import TrainConfig

# A run parameter's type as it stands in a signature KFP reads (KFP takes typing.List, not list[str]).
ANNOTATIONS = {str: "str", int: "int", float: "float", bool: "bool", dict: "dict", List[str]: "List[str]"}
INDENT = " " * 4
HF_READ_TOKEN = "HF_TOKEN, when the task gets it from the hf-read-token Secret, lets it"


@dataclass(frozen=True)
class Shared:
    """Run parameters of another stage's options that a step reads too, under their field names."""

    options: type
    fields: tuple[str, ...]


@dataclass(frozen=True)
class StepSignature:
    """One step's component: its name, what its body calls, its inputs, outputs and docstring."""

    name: str
    stage: str  # the module whose run_step(inputs) the body calls
    doc: str
    own_inputs: tuple[tuple[str, str], ...]
    options: tuple[type, ...] = ()
    shared: tuple[Shared, ...] = ()
    outputs: tuple[tuple[str, str], ...] = ()  # (name, artifact type): dsl.Output[dsl.<type>]
    returns: str = "str"  # the type of what run_step returns, when it is not a tuple
    returns_tuple: tuple[str, tuple[tuple[str, str], ...]] | None = None  # NamedTuple name and fields

    def run_parameters(self) -> list[RunParameter]:
        """The run parameters this step takes under their field names: its options', then the shared ones."""
        shared = [p for each in self.shared for p in run_parameters_of(each.options) if p.field in each.fields]
        return [p for options in self.options for p in run_parameters_of(options)] + shared

    def inputs(self) -> list[tuple[str, str]]:
        """Every input and output, as (name, annotation), in the order of the ``def``."""
        run = [(p.field, ANNOTATIONS[p.type]) for p in self.run_parameters()]
        outputs = [(name, f"dsl.Output[dsl.{kind}]") for name, kind in self.outputs]
        return [*self.own_inputs, *run, *outputs]

    def run_arguments(self, run: dict[str, Any]) -> dict[str, Any]:
        """The run parameters this step takes, from ``run`` (name -> value), keyed by field name: what the DAG
        passes beside the step's own inputs."""
        return {p.field: run[p.name] for p in self.run_parameters()}


STEPS = (
    StepSignature(
        "prepare_dataset",
        "components.data.stage",
        "Validate and normalise the JSONL dataset into train/eval Parquet on the workspace.",
        (("dataset_uri", "str"), ("dataset_sources", "str"), ("workspace_root", "str"), ("run_id", "str")),
        options=(PrepareOptions,),
        shared=(
            Shared(TrainConfig, ("objective",)),
            Shared(EvaluateOptions, ("benchmark_tasks", "benchmark_limit", "benchmark_allow_code")),
        ),
        outputs=(
            ("train_data", "Dataset"),
            ("eval_data", "Dataset"),
            ("rejects", "Dataset"),
            ("report", "Markdown"),
            ("metrics", "Metrics"),
        ),
        returns_tuple=("PrepareOutputs", (("fingerprint", "str"), ("data_dir", "str"))),
    ),
    StepSignature(
        "check_data_changed",
        "components.publish.change_check",
        "Whether to train: the prepared data's fingerprint differs from the last published model's\n"
        "(Hub model card, else the record on the workspace), nothing was published yet, or ``force``. The reason\n"
        "names each source of ``data_dir``'s stats.json read at another version than the published model's.\n"
        "On unchanged data, ``finish`` says whether the published version still lacks store, register or serve (its\n"
        "run failed after publishing); ``version_run_id`` and ``version_train_dir`` are then that version's.\n\n"
        f"{HF_READ_TOKEN} read the Hub model card.",
        (("fingerprint", "str"), ("data_dir", "str"), ("repo_id", "str"), ("workspace_root", "str"), ("force", "bool")),
        returns_tuple=(
            "DataChange",
            (
                ("changed", "bool"),
                ("reason", "str"),
                ("finish", "bool"),
                ("version_run_id", "str"),
                ("version_train_dir", "str"),
            ),
        ),
    ),
    StepSignature(
        "tokenise_data",
        "components.tokenise.stage",
        "Tokenise the prepared splits once, on this step's CPUs, into the workspace's token cache; returns the entry\n"
        "that the training ranks memory-map and the evaluation reads (an existing entry for the same data, tokenizer\n"
        "and settings is reused). The training options that shape the rows come under their field names.\n\n"
        f"{HF_READ_TOKEN} fetch a gated model's tokenizer.",
        (("workspace_root", "str"), ("data_dir", "str"), ("base_model", "str"), ("backend", "str")),
        options=(TokeniseOptions,),
        shared=(Shared(TrainConfig, TRAINING_FIELDS),),
        outputs=(("metrics", "Metrics"),),
        returns_tuple=("TokeniseOutputs", (("tokens_dir", "str"),)),
    ),
    StepSignature(
        "train_model",
        "components.train.stage",
        "Fine-tune the base model: a PyTorchJob or TrainJob on the cluster, or local torchrun processes.\n\n"
        "After the step's own inputs come the ``LaunchOptions`` fields, then the ``TrainConfig`` fields that are\n"
        "run parameters, under their field names. ``image`` is the training pods' image, ``pvc_name`` the workspace\n"
        "PVC (empty for the local backend) and ``pvc_size`` its size when the run creates it. Returns the run's train\n"
        "directory and the base model it resolved, which the evaluation compares against.",
        (
            ("workspace_root", "str"),
            ("run_id", "str"),
            ("tokens_dir", "str"),
            ("pvc_name", "str"),
            ("pvc_size", "str"),
            ("image", "str"),
            ("base_model", "str"),
            ("pipeline_name", "str"),
            ("hf_token_secret", "str"),
        ),
        options=(LaunchOptions, TrainConfig),
        outputs=(("model", "Model"), ("metrics", "Metrics"), ("manifest", "Artifact")),
        returns_tuple=("TrainOutputs", (("train_dir", "str"), ("base_model", "str"))),
    ),
    StepSignature(
        "evaluate_model",
        "components.evaluate.stage",
        "Compare the fine-tuned model with its base and with the published model (the Hub repository ``repo_id``\n"
        "with HF_TOKEN, else the workspace's publish record) on held-out data and standard benchmarks (lm-eval);\n"
        "report it and decide the quality gate.\n\n"
        "``force`` lets a model that does not beat the published one pass. ``gpus``: the GPUs the step's pod was\n"
        "given (0: none); with any, it stops rather than run on the CPU when CUDA fails.",
        (
            ("workspace_root", "str"),
            ("run_id", "str"),
            ("base_model", "str"),
            ("train_dir", "str"),
            ("data_dir", "str"),
            ("tokens_dir", "str"),
            ("repo_id", "str"),
            ("force", "bool"),
            ("gpus", "int"),
        ),
        options=(EvaluateOptions,),
        shared=(Shared(TrainConfig, ("mlflow_tracking_uri", "mlflow_experiment")),),
        outputs=(("metrics", "Metrics"), ("report_html", "HTML"), ("report_markdown", "Markdown")),
        returns_tuple=("EvaluateOutputs", (("gate_passed", "bool"), ("gate_reason", "str"))),
    ),
    StepSignature(
        "export_gguf",
        "components.export.stage",
        "Convert merged/ to GGUF (comma-separated outtypes), verify it in llama.cpp, write a Modelfile.\n\n"
        "``thresholds`` overrides keys of gguf_export.options.Thresholds; an empty ``model_name`` is derived from the\n"
        "base model. Returns the GGUF's path on the workspace.",
        (("workspace_root", "str"), ("run_id", "str"), ("train_dir", "str")),
        options=(ExportStageOptions,),
        outputs=(("gguf_model", "Model"), ("metrics", "Metrics"), ("report", "Markdown")),
    ),
    StepSignature(
        "publish_model",
        "components.publish.stage",
        "Commit the GGUF, Modelfile, reports and model card to the Hub as one commit, or write the folder (dry "
        "run).\n\n"
        "The token is read from HF_TOKEN, set from the hf-token Secret (the token that may write, mounted in this\n"
        "step alone); it is never a parameter.",
        (("workspace_root", "str"), ("run_id", "str"), ("dataset_uri", "str"), ("base_model", "str")),
        options=(PublishOptions,),
        outputs=(("model_card", "Markdown"), ("metrics", "Metrics")),
        returns_tuple=("PublishOutputs", (("location", "str"), ("dry_run", "bool"))),
    ),
    StepSignature(
        "store_model",
        "components.store.stage",
        "Copy the published version (the publish step's upload folder) to the storage targets the run names: S3,\n"
        "and an OCI registry as a KServe modelcar image.\n\n"
        "The S3 credentials and endpoint are the AWS_* variables from the data connection Secret ``s3_secret``, the\n"
        "registry's the dockerconfigjson Secret ``oci_secret`` mounted as a file; none is a parameter. Returns the\n"
        "first copy's URI, empty when no target is set.",
        (("workspace_root", "str"), ("run_id", "str"), ("train_dir", "str"), ("model_name", "str")),
        options=(StorageOptions,),
    ),
    StepSignature(
        "register_model",
        "components.register.stage",
        "Register the stored version in the Kubeflow Model Registry at ``url``: the model by name, the run as a\n"
        "version, an artifact per place the version went (S3, OCI, the Hub) and its provenance as properties.\n\n"
        "The token is MODEL_REGISTRY_TOKEN from the Secret ``secret`` (key token), else, with\n"
        "``use_service_account`` and over https only, the pod's service account token; never a parameter, and over\n"
        "plain http only to loopback or with ``allow_http``. Returns the version's id, empty when no registry is set.",
        (
            ("workspace_root", "str"),
            ("run_id", "str"),
            ("train_dir", "str"),
            ("model_name", "str"),
            ("repo_id", "str"),
            ("s3_secret", "str"),
        ),
        options=(RegistryOptions,),
    ),
    StepSignature(
        "serve_model",
        "components.serve.stage",
        "Write the stored version's KServe InferenceService (vLLM) to serve/inferenceservice.yaml; with ``deploy``,\n"
        "check that the registry lets its pods pull the image with the read-only Secret ``pull_secret`` (mounted as\n"
        "a file), create or update it in this namespace, wait until Ready, ask it one chat question and record the\n"
        "endpoint and answer (run summary, Model Registry). Returns the endpoint, empty when not deployed.",
        (
            ("workspace_root", "str"),
            ("run_id", "str"),
            ("train_dir", "str"),
            ("model_name", "str"),
            ("s3_secret", "str"),
            ("registry_url", "str"),
            ("registry_secret", "str"),
            ("registry_use_service_account", "bool"),
            ("registry_allow_http", "bool"),
        ),
        options=(ServingOptions,),
    ),
)

COMPONENT = '''

@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def {name}(
{inputs}){returns}:
    """{doc}"""
    inputs = dict(locals())  # every input by name, taken before anything else is bound here
{body}'''


def def_inputs(names_and_annotations: list[tuple[str, str]]) -> str:
    """Inputs, one per line, as they stand in a ``def``."""
    return "".join(f"{INDENT}{name}: {annotation},\n" for name, annotation in names_and_annotations)


def run_arguments(step: str, run: dict[str, Any]) -> dict[str, Any]:
    """The run parameters the step named ``step`` takes, from ``run``, keyed by field name."""
    return next(signature for signature in STEPS if signature.name == step).run_arguments(run)


def _annotation(step: StepSignature) -> str:
    """The ``def``'s return annotation, exploded with trailing commas as ruff keeps it."""
    if step.returns_tuple is None:
        return f" -> {step.returns}"
    name, fields = step.returns_tuple
    items = "".join(f'{INDENT * 2}("{field}", {kind}),\n' for field, kind in fields)
    return f' -> NamedTuple(\n{INDENT}"{name}",\n{INDENT}[\n{items}{INDENT}],\n)'


def _stage_import(step: StepSignature) -> str:
    """The import of the stage's ``run_step``, whose libraries load with the collector paused (common/startup.py)."""
    return (
        f"{INDENT}from common.startup import imports_without_collection\n\n"
        f"{INDENT}with imports_without_collection():\n{INDENT * 2}from {step.stage} import run_step\n\n"
    )


def _body(step: StepSignature) -> str:
    if step.returns_tuple is None:
        return f"{_stage_import(step)}{INDENT}return run_step(inputs)\n"
    name, fields = step.returns_tuple
    names = ", ".join(f'"{field}"' for field, _ in fields)
    outputs = "run_step(inputs)" if len(fields) == 1 else "*run_step(inputs)"
    return (
        f"{INDENT}from collections import namedtuple\n\n{_stage_import(step)}"
        f"{INDENT}fields = [{names}]\n"
        f'{INDENT}return namedtuple("{name}", fields)({outputs})\n'
    )


def component(step: StepSignature) -> str:
    """The source of ``step``'s ``@dsl.component``."""
    inputs = def_inputs(step.inputs())
    doc = step.doc.replace("\n", f"\n{INDENT}").replace(f"\n{INDENT}\n", "\n\n")
    doc += f"\n{INDENT}" if "\n" in step.doc else ""  # a docstring of several lines closes on a line of its own
    return COMPONENT.format(name=step.name, inputs=inputs, returns=_annotation(step), doc=doc, body=_body(step))


def module(steps: tuple[StepSignature, ...]) -> str:
    """The imports and the components of ``steps``, below a generated module's header."""
    annotations = {annotation for step in steps for _, annotation in step.inputs()}
    typing = [
        *(["List"] if any(annotation.startswith("List[") for annotation in annotations) else []),
        *(["NamedTuple"] if any(step.returns_tuple for step in steps) else []),
    ]
    imports = f"from typing import {', '.join(typing)}\n\n" if typing else ""
    sources = "".join(component(step) for step in steps)
    return f"\n{imports}from kfp import dsl\n\nfrom components.runtime_image import runtime_image\n{sources}"
