"""Where the pipeline runs: the shared workspace its stages pass large files through, and how it trains.

On a cluster the workspace is a ReadWriteMany PVC: created for the run with
kfp-kubernetes ``CreatePVC`` (or an existing one named by ``pvc_name``),
mounted at ``CLUSTER_WORKSPACE`` in every step that touches it, and deleted after the
last stage unless the first step decided to keep it (``keep_pvc``: true, or auto
when the PVC holds the only copy of the model). A failed run keeps its PVC, so its
checkpoints can be inspected or resumed from. Training runs as a PyTorchJob or
TrainJob whose pods mount the same PVC.

``kfp.local`` cannot run CreatePVC/DeletePVC and ignores mounts, so a local run
uses ``LocalWorkspace``: a directory on this machine standing in for the PVC,
and the trainer as local torchrun processes. Both present the same hooks to the DAG.

They also differ in how a failed step after publish (store, register, serve) is
retried: on a cluster, unattended, after half a minute and a minute; locally not
at all, since a person is watching and the next run on the same data finishes it.
"""

from pathlib import Path
from typing import Protocol

from kfp import dsl, kubernetes

from common.run_layout import CLUSTER_WORKSPACE
from components.default_base_model import LOCAL_BACKEND
from pipelines.tasks import resolve_storage_class, small, use_existing_pvc, workspace_pvc

PVC_NAME_SUFFIX = "-llm-finetune-workspace"
# On a cluster the steps after publish (store, register, serve) run again when they fail, half a minute and then a
# minute later: what fails them is mostly at the other end of the network (an S3 endpoint, an OCI or Model Registry,
# the Kubernetes API restarting), and each can repeat itself safely (the same S3 keys and image tag,
# create-or-update, apply; a step that had completed skips itself). Without them, a blip after publish in a
# scheduled run left the model on the Hub but nowhere else until the next run.
AFTER_PUBLISH_RETRY = dict(num_retries=2, backoff_duration="30s", backoff_factor=2.0, backoff_max_duration="300s")


class Workspace(Protocol):
    root: str
    gpus: bool  # steps get the GPUs they ask for (so a step given one must find CUDA working)

    def attach(self, after: dsl.PipelineTask, pvc_name, pvc_size, pvc_storage_class) -> None:
        """Make the workspace available before the first stage runs."""

    def mount(self, task: dsl.PipelineTask) -> dsl.PipelineTask:
        """Give ``task`` access to the workspace at ``root``."""

    def pvc(self):
        """The PVC name the training pods mount (empty where there is none)."""

    def training_backend(self, requested):
        """How the train step runs the trainer: the run's choice on a cluster, local processes here."""

    def release(self, after: dsl.PipelineTask, pvc_name, keep_workspace) -> None:
        """Clean up after ``after``, the last stage of one path through the DAG (called once per path)."""

    def retry_after_publish(self, task: dsl.PipelineTask) -> dsl.PipelineTask:
        """Give ``task``, a step after publish (store, register, serve), the retries it gets here."""


class ClusterWorkspace:
    """A ReadWriteMany PVC per run, or an existing one."""

    root = CLUSTER_WORKSPACE
    gpus = True

    def __init__(self) -> None:
        self._pvc: dsl.PipelineTask | None = None

    def attach(self, after, pvc_name, pvc_size, pvc_storage_class) -> None:
        with dsl.If(pvc_name == "", name="create-workspace-pvc"):
            storage_class = _uncached(small(resolve_storage_class(requested=pvc_storage_class)).after(after))
            created = _uncached(
                kubernetes.CreatePVC(
                    pvc_name_suffix=PVC_NAME_SUFFIX,
                    access_modes=["ReadWriteMany"],
                    size=pvc_size,
                    storage_class_name=storage_class.output,
                )
            )
        with dsl.Else(name="use-existing-pvc"):
            existing = _uncached(small(use_existing_pvc(pvc_name=pvc_name)).after(after))
        self._pvc = _uncached(small(workspace_pvc(pvc_name=dsl.OneOf(created.outputs["name"], existing.output))))

    def mount(self, task):
        # A cached step would skip writing its files onto this run's PVC.
        kubernetes.mount_pvc(_uncached(task), pvc_name=self._pvc.output, mount_path=CLUSTER_WORKSPACE)
        return task

    def pvc(self):
        return self._pvc.output

    def training_backend(self, requested):
        return requested

    def release(self, after, pvc_name, keep_workspace) -> None:
        with dsl.If(pvc_name == "", name="pvc-was-created"):
            with dsl.If(keep_workspace == False, name="workspace-not-kept"):  # noqa: E712 (a KFP condition)
                _uncached(kubernetes.DeletePVC(pvc_name=self._pvc.output).after(after))

    def retry_after_publish(self, task):
        """``AFTER_PUBLISH_RETRY``: nobody watches a scheduled run, and most failures there are passing ones."""
        return task.set_retry(**AFTER_PUBLISH_RETRY)


class LocalWorkspace:
    """A local directory standing in for the PVC under ``kfp.local``; training as local processes."""

    gpus = False  # kfp.local ignores resource requests: steps use whatever this machine has

    def __init__(self, root: Path) -> None:
        self.root = str(Path(root).resolve())

    def attach(self, after, pvc_name, pvc_size, pvc_storage_class) -> None:
        """Nothing to do here: this runs when the DAG is built, before the run
        parameters are checked, so a directory made now would be left behind by a
        rejected run. ``pipelines.run`` creates ``root`` once they pass."""

    def mount(self, task):
        return task

    def pvc(self):
        return ""

    def training_backend(self, requested):
        return LOCAL_BACKEND

    def release(self, after, pvc_name, keep_workspace) -> None:
        """Nothing to delete: the directory is the run's output."""

    def retry_after_publish(self, task):
        """No retry: kfp.local would sleep 30 s, then 60 s, at a person's terminal (and wait out a serve that never
        becomes Ready three times) before showing an error that is mostly a setting to fix (an endpoint, a bucket,
        a token). The step's own retries of passing network failures (botocore's, the Hub client's) still run, and
        the next run on the same data finishes the version (``components.publish.changes``)."""
        return task


def _uncached(task: dsl.PipelineTask) -> dsl.PipelineTask:
    task.set_caching_options(False)
    return task
