"""Rendered PyTorchJob and TrainJob manifests against the published CRD schemas, and what the pods will run."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml
from conftest import REPO_ROOT
from crd_schemas import PYTORCHJOB_CRD, TRAINJOB_CRD, schema_errors
from train_jobs import GPU_TOLERATION, RUN_ID
from train_jobs import example_spec as spec

from common.tracking import SECRET_KEYS as MLFLOW_SECRET_KEYS
from components.hub_auth import READ_SECRET_NAME, WRITE_SECRET_NAME
from components.train.manifests import JobSpec, job_name, label_value, render_pytorchjob, render_trainjob, to_yaml
from components.train.options import TORCHRUN_EXIT_SECONDS, LaunchOptions
from tests.yaml_files import read_yaml_documents
from trainer.config import parse_config

RANK_FLAGS = (
    "--nnodes",
    "--nproc-per-node",
    "--nproc_per_node",
    "--node-rank",
    "--node_rank",
    "--master-addr",
    "--master_addr",
    "--rdzv",
)

CASES = [
    pytest.param(spec(1, 0), id="1-node-cpu"),
    pytest.param(spec(2, 0, secret="hf-read-token"), id="2-nodes-cpu-secret"),
    pytest.param(
        spec(2, 1, tolerations=[GPU_TOLERATION], secret="hf-read-token"), id="2-nodes-1-gpu-tolerations-secret"
    ),
    pytest.param(
        spec(
            4,
            8,
            tolerations=[GPU_TOLERATION, {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoExecute"}],
            node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        ),
        id="4-nodes-8-gpus-placement",
    ),
]


def pod_specs_of_pytorchjob(manifest: dict) -> list[dict]:
    return [replica["template"]["spec"] for replica in manifest["spec"]["pytorchReplicaSpecs"].values()]


def check_trainer_command(command: list[str], job: JobSpec) -> None:
    """torchrun lets its workers save for all of the pod's grace period but its own exit time, then the trainer."""
    shutdown = job.launch.grace_period_seconds - TORCHRUN_EXIT_SECONDS
    assert command[:4] == ["torchrun", f"--shutdown-timeout={shutdown}", "-m", "trainer"]
    assert 0 < shutdown < job.launch.grace_period_seconds
    assert not [arg for arg in command if arg.startswith(RANK_FLAGS)], (
        "rank and rendezvous come from the PET_* environment"
    )
    assert parse_config(command[4:]) == dataclasses.replace(
        job.train,
        require_cuda=job.launch.gpus_per_node > 0,
        expected_world_size=job.launch.nodes * max(job.launch.gpus_per_node, 1),
    )


def check_container_env(env: list[dict], job: JobSpec) -> None:
    by_name = {item["name"]: item for item in env}
    assert by_name["HOME"]["value"] == "/tmp" and by_name["TRITON_CACHE_DIR"]["value"].startswith("/tmp/")
    assert by_name["HF_HOME"]["value"].startswith(job.mount_path + "/")
    if job.launch.hf_token_secret:
        assert "value" not in by_name["HF_TOKEN"], "the token comes from the Secret, never inline"
        assert by_name["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": job.launch.hf_token_secret,
            "key": "HF_TOKEN",
            "optional": True,
        }
    else:
        assert "HF_TOKEN" not in by_name


def check_resources(resources: dict, job: JobSpec) -> None:
    # Limits equal requests: namespaces with a ResourceQuota on limits refuse pods without them.
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"] == "8"
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == "64Gi"
    if job.launch.gpus_per_node:
        assert (
            resources["limits"]["nvidia.com/gpu"]
            == resources["requests"]["nvidia.com/gpu"]
            == str(job.launch.gpus_per_node)
        )
    else:
        assert "nvidia.com/gpu" not in resources["limits"] and "nvidia.com/gpu" not in resources["requests"]


def check_pod(pod: dict, mounts: list[dict], job: JobSpec) -> None:
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounted = {mount["name"]: mount["mountPath"] for mount in mounts}
    assert (
        volumes["workspace"]["persistentVolumeClaim"] == {"claimName": "ws-pvc"}
        and mounted["workspace"] == job.mount_path
    )
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"} and mounted["dshm"] == "/dev/shm"
    assert mounted["scratch"] == "/tmp"
    assert pod.get("tolerations", []) == list(job.tolerations)
    assert pod.get("nodeSelector", {}) == job.node_selector
    grace = job.launch.grace_period_seconds
    assert pod["terminationGracePeriodSeconds"] == grace  # the kubelet's SIGTERM-to-SIGKILL


@pytest.mark.parametrize("job", CASES)
def test_pytorchjob_validates_against_the_training_operator_crd(job):
    manifest = render_pytorchjob(job)
    assert schema_errors(manifest, PYTORCHJOB_CRD) == []
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1
    assert replicas.get("Worker", {}).get("replicas", 0) == job.launch.nodes - 1
    assert manifest["spec"]["nprocPerNode"] == str(max(job.launch.gpus_per_node, 1))
    assert manifest["spec"]["runPolicy"] == {
        "backoffLimit": 3,
        "cleanPodPolicy": "Running",
        "activeDeadlineSeconds": 86400,
        "ttlSecondsAfterFinished": 3600,
    }
    for replica in replicas.values():
        assert replica["restartPolicy"] == "OnFailure"
        assert replica["template"]["metadata"]["labels"]["llm-finetune-pipeline/run-id"] == RUN_ID
        (container,) = replica["template"]["spec"]["containers"]
        assert container["name"] == "pytorch" and container["image"] == job.image
        assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]
        check_trainer_command(container["command"], job)
        check_container_env(container["env"], job)
        check_resources(container["resources"], job)
        check_pod(replica["template"]["spec"], container["volumeMounts"], job)


@pytest.mark.parametrize("job", CASES)
def test_trainjob_validates_against_the_trainer_v2_crd(job):
    manifest = render_trainjob(job, "torch-distributed")
    assert schema_errors(manifest, TRAINJOB_CRD) == []
    trainer = manifest["spec"]["trainer"]
    assert manifest["spec"]["runtimeRef"] == {
        "name": "torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    assert trainer["numNodes"] == job.launch.nodes and trainer["numProcPerNode"] == max(job.launch.gpus_per_node, 1)
    assert trainer["image"] == job.image
    check_trainer_command(trainer["command"], job)
    check_container_env(trainer["env"], job)
    check_resources(trainer["resourcesPerNode"], job)
    (patch,) = manifest["spec"]["runtimePatches"]
    (replicated,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert replicated["name"] == "node"
    pod_template = replicated["template"]["spec"]["template"]
    assert pod_template["metadata"]["labels"]["llm-finetune-pipeline/run-id"] == RUN_ID
    (container,) = pod_template["spec"]["containers"]
    assert container["name"] == "node"
    check_pod(pod_template["spec"], container["volumeMounts"], job)


def test_the_training_pods_get_the_read_token_never_the_write_token():
    """Training only downloads the base model, so its pods get hf-read-token: LaunchOptions' default and what the
    compiled pipeline passes the train step. hf-token, which may write to the Hub, is the publish step's alone."""
    compiled = read_yaml_documents(REPO_ROOT / "compiled" / "fine_tune_pipeline.yaml")
    tasks = [component["dag"]["tasks"] for component in compiled[0]["components"].values() if "dag" in component]
    (train,) = [dag["train-model"] for dag in tasks if "train-model" in dag]
    passed = train["inputs"]["parameters"]["hf_token_secret"]["runtimeValue"]["constant"]
    assert passed == LaunchOptions().hf_token_secret == READ_SECRET_NAME == "hf-read-token"
    job = spec(2, 1, secret=passed)
    pytorchjob = render_pytorchjob(job)
    containers = [pod["containers"][0] for pod in pod_specs_of_pytorchjob(pytorchjob)]
    for env in [container["env"] for container in containers] + [render_trainjob(job)["spec"]["trainer"]["env"]]:
        (token,) = [item for item in env if item["name"] == "HF_TOKEN"]
        assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-read-token", "key": "HF_TOKEN", "optional": True}
    assert WRITE_SECRET_NAME not in to_yaml(pytorchjob) + to_yaml(render_trainjob(job))


def test_the_training_pods_get_the_mlflow_credentials_only_when_they_log_to_mlflow():
    """Rank 0 logs to MLflow with the Secret mlflow_secret names, each key optional (a server without login needs
    none); without mlflow_tracking_uri no pod gets them. The MLflow address travels as a trainer option, and the run
    is named after the run folder (runs/<run id>/train)."""
    plain = spec(2, 1)
    tracked = dataclasses.replace(
        plain,
        train=dataclasses.replace(plain.train, mlflow_tracking_uri="https://mlflow.example"),
        launch=dataclasses.replace(plain.launch, mlflow_secret="team-mlflow"),
    )
    for job, expected in ((plain, []), (tracked, list(MLFLOW_SECRET_KEYS))):
        pytorchjob, trainjob = render_pytorchjob(job), render_trainjob(job)
        containers = [pod["containers"][0] for pod in pod_specs_of_pytorchjob(pytorchjob)]
        for env in [container["env"] for container in containers] + [trainjob["spec"]["trainer"]["env"]]:
            mlflow = [item for item in env if item["name"].startswith("MLFLOW_")]
            assert [item["name"] for item in mlflow] == expected
            for item in mlflow:
                assert item["valueFrom"]["secretKeyRef"] == {
                    "name": "team-mlflow",
                    "key": item["name"],
                    "optional": True,
                }
        assert not schema_errors(pytorchjob, PYTORCHJOB_CRD) and not schema_errors(trainjob, TRAINJOB_CRD)
    command = " ".join(containers[0]["command"] + containers[0].get("args", []))
    assert "--mlflow-tracking-uri https://mlflow.example" in command and f"/runs/{RUN_ID}/train" in command


def test_the_schema_check_catches_what_the_api_server_would_drop_or_reject():
    """Proof that the validation above can fail: an unknown (pruned) field, a wrong type, a missing field."""
    manifest = render_pytorchjob(spec(2, 1))
    manifest["spec"]["nprocsPerNode"] = "1"
    manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "1"
    del manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["name"]
    errors = schema_errors(manifest, PYTORCHJOB_CRD)
    assert any("'nprocsPerNode' was unexpected" in error for error in errors)
    assert any(error.startswith("spec.pytorchReplicaSpecs.Worker.replicas:") for error in errors)
    assert any("'name' is a required property" in error for error in errors)
    trainjob = render_trainjob(spec(2, 1))
    trainjob["spec"]["trainer"]["volumes"] = []  # not a trainer field in v2.3: it belongs in runtimePatches
    assert any("'volumes' was unexpected" in error for error in schema_errors(trainjob, TRAINJOB_CRD))


def test_job_names_are_dns_labels_stable_per_run_and_distinct_between_runs():
    dns1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    ids = [RUN_ID, "Run_2024/11/05 nightly", "x" * 200, "x" * 199 + "y", "---", "7"]
    names = [job_name(run_id) for run_id in ids]
    assert all(dns1035.match(name) and len(name) <= 45 for name in names), names
    assert len(set(names)) == len(names)
    assert job_name(RUN_ID) == job_name(RUN_ID) == f"llm-ft-{RUN_ID}"


def test_labels_are_valid_label_values():
    value = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
    for text in ("llm-finetune", "My pipeline (nightly)!", "-x-", "a" * 100):
        assert value.match(label_value(text)) and len(label_value(text)) <= 63


def test_yaml_is_the_manifest():
    manifest = render_trainjob(spec(2, 1, secret="hf-read-token"))
    assert yaml.safe_load(to_yaml(manifest)) == manifest
