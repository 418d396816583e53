"""How the steps after publish are retried depends on where the pipeline runs (``pipelines.workspace``).

On a cluster nobody watches a scheduled run, so store, register and serve run again
after half a minute and a minute; under ``kfp.local`` a person is at the terminal,
and kfp.local honours the same retry policy (it sleeps out the backoff in the
foreground), so the local pipeline gives those steps none: a failure shows at once,
and the next run on the same data finishes the version.
"""

from __future__ import annotations

from google.protobuf import json_format

from pipelines.fine_tune import build_pipeline, fine_tune_pipeline
from pipelines.workspace import AFTER_PUBLISH_RETRY, LocalWorkspace

# Both places the steps after publish are wired: after a new publish, and finishing the published version.
AFTER_PUBLISH = {
    f"{step}{suffix}" for step in ("store-model", "register-model", "serve-model") for suffix in ("", "-2")
}


def tasks(pipeline) -> dict[str, dict]:
    """Task name -> task, for every task of ``pipeline`` at every nesting level."""
    spec = json_format.MessageToDict(pipeline.pipeline_spec)
    dags = [spec["root"]["dag"], *(c["dag"] for c in spec["components"].values() if "dag" in c)]
    return {name: task for dag in dags for name, task in dag["tasks"].items()}


def retry_policies(pipeline) -> dict[str, dict]:
    """Task name -> retry policy, for every task of ``pipeline`` that has one."""
    return {name: task["retryPolicy"] for name, task in tasks(pipeline).items() if "retryPolicy" in task}


def test_a_cluster_run_retries_the_steps_after_publish_with_backoff():
    retried = retry_policies(fine_tune_pipeline)
    for name in AFTER_PUBLISH:
        assert retried[name]["maxRetryCount"] == AFTER_PUBLISH_RETRY["num_retries"] == 2, name
        assert retried[name]["backoffDuration"] == AFTER_PUBLISH_RETRY["backoff_duration"] == "30s", name


def test_a_local_run_does_not_retry_the_steps_after_publish(tmp_path):
    """kfp.local would wait 30 s, then 60 s, before each failing step after publish gave up (and three times the
    serving timeout for a model that never becomes Ready): a local run shows the failure at once instead."""
    local = build_pipeline(LocalWorkspace(tmp_path / "workspace"))
    assert AFTER_PUBLISH <= set(tasks(local))  # the steps are there, on both paths
    assert AFTER_PUBLISH.isdisjoint(retry_policies(local))
    # What `python -m pipelines.run` checks a run's parameters against before it builds the local pipeline.
    assert local.component_spec.inputs == fine_tune_pipeline.component_spec.inputs
