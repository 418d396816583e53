"""A run that failed after publish is finished by the next run on the same data, without training again.

The scenario, on one workspace, as scheduled runs share a PVC:

1. a version is published (a dry run of the publish stage on a run's files as
   ``tests/fake_run.py`` lays them out, with the fingerprint the bundled data
   really has), and then its store step fails in a real process: the models
   bucket does not exist yet on S3 (moto's server on 127.0.0.1), an answer no
   retry changes, so the step fails at once. The model is published, but
   stored, registered and served nowhere;
2. the bucket is created, and ``python -m pipelines.run`` runs on the same data,
   with the Model Registry (the fake one, which checks every exchange against
   the published spec) up: the data-change check finds the data
   unchanged and the published version unfinished, so the run stores,
   registers and serves that version, and trains, evaluates, exports and
   publishes nothing;
3. the same run again: nothing is left to finish, so it stops after the check.

The published version is made from small files rather than by a first pipeline
run, which would train for minutes: the two runs here take about a minute.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import boto3
import pytest
from conftest import read_stats, run_module
from fake_model_registry import FakeModelRegistry
from fake_run import make_run
from test_local_run import executed, run_pipeline

from common.records import StoredCopies
from common.s3 import keys_under
from components.champion.record import DELIVERY_STEPS, DeliveryRecord
from components.publish.options import PublishOptions
from components.publish.publish import publish

pytestmark = pytest.mark.slow

RUN = "run-published"  # the run that published the version and failed after it
MODEL = "SmolLM3-3B-ft"  # the export's name for fake_run's base model, HuggingFaceTB/SmolLM3-3B
BUCKET = "models"
MODELS_URI = f"s3://{BUCKET}/local"
REGISTRY_TOKEN = "finish-after-publish-registry-token"


@pytest.fixture(scope="module")
def scenario(tmp_path_factory, prepared_data_dir, s3_server):
    """The published version whose store failed, then the two runs on the same data: (workspace, client, results,
    registry)."""
    output_dir = tmp_path_factory.mktemp("finish") / "out"
    workspace = output_dir / "workspace"
    # The fingerprint the pipeline's prepare step gives the bundled data with the run form's defaults.
    make_run(workspace, RUN, fingerprint=read_stats(prepared_data_dir)["fingerprint"])
    publish(str(workspace), RUN, "", PublishOptions(publish_merged="true"), token=None)

    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    env |= {"AWS_DEFAULT_REGION": "us-east-1", "MODEL_REGISTRY_TOKEN": REGISTRY_TOKEN, "AWS_ENDPOINT_URL": s3_server}
    # The bucket does not exist yet: S3 answers NoSuchBucket, which botocore does not retry, so the step fails
    # at once (an endpoint that is down would fail too, after botocore's randomised backoff).
    store = ("--workspace-root", workspace, "--run-id", RUN, "--model-name", MODEL, "--s3-uri", MODELS_URI)
    failed_store = run_module("components.store.stage", *store, env=env)
    failed_store.delivery = DeliveryRecord.read(workspace, RUN)
    failed_store.stored = (workspace / "runs" / RUN / "store").exists()

    client = boto3.client(
        "s3",
        endpoint_url=s3_server,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=BUCKET)
    with FakeModelRegistry(token=REGISTRY_TOKEN) as registry:
        storage = ("--param", f"model_s3_uri={MODELS_URI}", "--param", f"model_registry_url={registry.url}")
        finishing = run_pipeline("--output-dir", output_dir, *storage, env=env, timeout=600)
        delivery_after_finishing = DeliveryRecord.read(workspace, RUN)
        nothing_left = run_pipeline("--output-dir", output_dir, *storage, env=env, timeout=600)
        yield workspace, client, (failed_store, finishing, delivery_after_finishing, nothing_left), registry
        assert registry.violations == []


def new_runs(workspace: Path) -> list[Path]:
    """The run directories the pipeline runs made (every one but the published version's)."""
    return sorted(path for path in (workspace / "runs").iterdir() if path.name != RUN)


def test_a_store_that_fails_after_publish_leaves_the_version_unfinished(scenario):
    workspace, _, (failed_store, *_), _ = scenario
    assert failed_store.returncode == 2 and "Traceback" not in failed_store.stderr, failed_store.stderr
    assert f"The bucket of {MODELS_URI}/{MODEL}/{RUN}/ does not exist (NoSuchBucket)" in " ".join(
        failed_store.stderr.split()
    )
    assert not failed_store.stored  # no record of a copy that was never made
    assert failed_store.delivery.missing == DELIVERY_STEPS  # published, and nothing after it


def test_a_rerun_on_the_same_data_stores_registers_and_serves_the_published_version_without_training(scenario):
    workspace, client, (_, finishing, delivery, _), registry = scenario
    assert finishing.returncode == 0, finishing.stdout[-5000:] + finishing.stderr[-3000:]
    assert executed(finishing) == [
        "validate-parameters",
        "prepare-dataset",
        "check-data-changed",
        "store-model-2",
        "register-model-2",
        "serve-model-2",
    ]
    assert (
        f"data unchanged: training is skipped, and store, register and serve run on the published version (run {RUN})"
        in (finishing.log)
    )
    # Nothing was trained, evaluated, exported or published: the new run holds its prepared data only, and the
    # publish record still names the published version.
    first, *_ = new_runs(workspace)
    assert sorted(path.name for path in first.iterdir()) == ["data"]
    assert not (workspace / "token-cache").exists()
    assert json.loads((workspace / "published" / "dry-run.json").read_text())["run_id"] == RUN
    # The published version is stored, registered and served, as its own run would have done.
    version = workspace / "runs" / RUN
    (stored,) = StoredCopies.read(version / "store" / "stored.json").copies
    assert stored.uri == f"{MODELS_URI}/{MODEL}/{RUN}/"
    upload = version / "publish" / "upload"
    files = sorted(path.relative_to(upload).as_posix() for path in upload.rglob("*") if path.is_file())
    prefix = f"local/{MODEL}/{RUN}/"
    assert keys_under(client, BUCKET, prefix) == sorted([prefix + "_COMPLETE.json", *(prefix + f for f in files)])
    (model,) = registry.registered_models.values()
    (registered,) = registry.model_versions.values()
    assert (model["name"], registered["name"]) == (MODEL, RUN)
    assert [artifact["uri"] for artifact in registry.version_artifacts(registered["id"])] == [stored.uri]
    assert (version / "serve" / "inferenceservice.yaml").is_file()
    assert delivery.missing == () and set(delivery.completed) == set(DELIVERY_STEPS)


def test_once_finished_the_next_run_on_the_same_data_stops_after_the_check(scenario):
    workspace, _, (*_, nothing_left), registry = scenario
    assert nothing_left.returncode == 0, nothing_left.stdout[-5000:] + nothing_left.stderr[-3000:]
    assert executed(nothing_left) == [
        "validate-parameters",
        "prepare-dataset",
        "check-data-changed",
        "report-skipped-2",
    ]
    assert "data unchanged: training is skipped. Why:" in nothing_left.log
    assert len(registry.model_versions) == 1
    assert [sorted(path.name for path in run.iterdir()) for run in new_runs(workspace)] == [["data"], ["data"]]
