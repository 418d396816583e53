"""``pipelines.backend_versions``: the oldest KFP backend the pipeline runs on, and reading a server's version.

The healthz answers here have the API server's shape (backend/src/apiserver/main.go);
``tests/test_submit.py`` checks the same through ``python -m pipelines.submit``.
"""

from __future__ import annotations

import pytest
from conftest import REPO_ROOT

from common.errors import UserError
from pipelines.backend_versions import FEATURES, LIMITING, MINIMUM_BACKEND, check_backend, parse_tag
from tests.yaml_files import read_yaml_documents

HOST = "https://ds-pipeline-dspa-ml.apps.cluster.example"
PACKAGE = REPO_ROOT / "compiled" / "fine_tune_pipeline.yaml"


@pytest.mark.parametrize(
    ("tag", "version"),
    [
        ("2.16.0", (2, 16, 0)),  # upstream release images since 2.16.0 (#12795)
        ("2.17.0", (2, 17, 0)),
        ("v2.15.0", (2, 15, 0)),
        ("V2.14.4", (2, 14, 4)),
        ("2.15.0-rc.1", (2, 15, 0)),  # a pre-release counts as its release
        ("2.16.1+4a3592cb", (2, 16, 1)),
        ("2.5", (2, 5, 0)),
        (" 2.16.0\n", (2, 16, 0)),
        ("1.8.5", (1, 8, 5)),
        ("unknown", None),  # main.go's default: OpenShift AI's data science pipelines, KFP images 2.4 to 2.15
        ("", None),
        (None, None),  # no tag_name field
        ("master", None),  # the upstream image build from master
        ("dev", None),
        ("latest", None),
        ("sha-4a3592cb2d", None),
        (2.16, None),  # not a string at all
    ],
)
def test_parse_tag(tag, version):
    assert parse_tag(tag) == version


def test_the_minimum_is_the_newest_feature_the_optional_secrets():
    assert MINIMUM_BACKEND == (2, 15, 0) == max(feature.since for feature in FEATURES)
    assert LIMITING.uses == "use_secret_as_env(..., optional=True)"


def test_the_compiled_pipeline_uses_the_feature_that_sets_the_minimum():
    """Else the minimum is stale: drop the feature from FEATURES and the minimum follows."""
    platform = read_yaml_documents(PACKAGE)[1]
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values()
    assert any(secret.get("optional") is True for executor in executors for secret in executor.get("secretAsEnv", []))


@pytest.mark.parametrize("tag", ["2.15.0", "2.15.0-rc.1", "v2.16.0", "3.0.0"])
def test_a_server_at_or_above_the_minimum_is_accepted_and_named(tag):
    line = check_backend(HOST, {"tag_name": tag, "multi_user": False, "pipeline_store": "database"})
    assert line == f"{HOST} runs Kubeflow Pipelines backend {tag}; this pipeline needs 2.15.0 or later"


@pytest.mark.parametrize(
    ("tag", "lacking"),
    [
        ("2.14.4", ["use_secret_as_env(..., optional=True)"]),
        ("2.5.0", ["add_toleration_json given an empty list", "set_retry on a task inside dsl.If", "optional=True"]),
        ("1.8.5", ["dsl.If / dsl.Else", "dsl.OneOf", "optional=True"]),
    ],
)
def test_an_older_server_is_refused_with_what_it_lacks(tag, lacking):
    with pytest.raises(UserError) as refused:
        check_backend(HOST, {"tag_name": tag, "multi_user": False})
    message = str(refused.value)
    assert message.startswith(f"{HOST} runs Kubeflow Pipelines backend {tag} (the tag_name of its /apis/v2beta1/")
    assert "older than 2.15.0, the oldest this pipeline runs on" in message
    assert all(words in message for words in lacking)
    assert message.endswith(
        "Nothing was submitted. Upgrade the pipeline server: OpenShift AI to 3.0 or later (its data science pipelines "
        "server has these), Kubeflow Pipelines to 2.15.0 or later."
    )


def test_just_below_the_minimum_lacks_only_the_newest_feature():
    with pytest.raises(UserError) as refused:
        check_backend(HOST, {"tag_name": "2.14.4", "pipeline_store": "database"})
    assert "It lacks use_secret_as_env(..., optional=True) (from 2.15.0). Nothing" in str(refused.value)


@pytest.mark.parametrize(
    ("health", "reported"),
    [
        (
            {"commit_sha": "unknown", "tag_name": "unknown", "multi_user": False, "pipeline_store": "database"},
            "'unknown'",
        ),
        ({"tag_name": "master", "multi_user": True, "pipeline_store": "kubernetes"}, "'master'"),
        ({"tag_name": "", "pipeline_store": "database"}, "''"),
    ],
)
def test_a_server_without_a_version_proceeds_with_a_warning_saying_so(health, reported):
    line = check_backend(HOST, health)
    assert line.startswith(
        f"warning: {HOST} does not report its Kubeflow Pipelines backend version (tag_name {reported}: the data "
        "science pipelines of OpenShift AI and Kubeflow Pipelines 2.4 to 2.15 images are built without one), so it "
        "was not checked."
    )
    assert (
        "this pipeline needs 2.15.0 (OpenShift AI 3.0) or later for use_secret_as_env(..., optional=True) (from "
        "2.15.0), and an older one refuses the run or runs it without them." in line
    )


def test_a_server_without_a_version_or_pipeline_store_is_older_than_2_14_and_refused():
    """KFP 2.4 and 2.5 images and OpenShift AI up to 2.21 answer like this."""
    with pytest.raises(UserError) as refused:
        check_backend(HOST, {"commit_sha": "unknown", "tag_name": "unknown", "multi_user": False})
    message = str(refused.value)
    assert "(tag_name 'unknown'), and its /apis/v2beta1/healthz answer has no pipeline_store" in message
    assert "it is older than 2.14.0, and this pipeline needs 2.15.0 or later" in message
    assert "set_retry on a task inside dsl.If (from 2.14.0)" in message and "Nothing was submitted" in message


def test_no_tag_name_at_all_is_said_so():
    with pytest.raises(UserError, match=r"does not report its Kubeflow Pipelines backend version \(no tag_name\)"):
        check_backend(HOST, {"multi_user": False})
