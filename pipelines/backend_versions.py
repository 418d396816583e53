"""The oldest Kubeflow Pipelines backend the compiled pipeline runs on, and the check that refuses an older one.

The pipeline relies on features of the KFP backend (its API server's Argo
compiler, the driver and the launcher), not only of the SDK that compiled it. An
older server does not always say no: KFP 2.14 refuses the run (its Argo compiler
parses the Kubernetes config strictly and stops at ``optional``), but 2.5 and
OpenShift AI 2.x accept it and drop what they do not know, so a missing Secret
leaves a step waiting in CreateContainerConfigError and a retry policy inside a
``dsl.If`` is never applied. ``pipelines.submit`` therefore reads the server's
version from ``/apis/v2beta1/healthz`` and refuses an older server before it
creates anything.

``FEATURES`` names, for each backend feature the pipeline uses, the first
kubeflow/pipelines 2.x release whose backend implements it, with the change that
did (the first release tag containing the commit). The newest of them sets
``MINIMUM_BACKEND``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from common.errors import UserError

Version = tuple[int, int, int]


@dataclass(frozen=True)
class Feature:
    uses: str  # what the pipeline does, in kfp / kfp-kubernetes terms
    since: Version  # the first KFP backend release that implements it


FEATURES = (
    # The Argo compiler's commonEnvs (fieldRef metadata.name / metadata.uid) on every executor's main container,
    # backend/src/v2/compiler/argocompiler/common.go and container.go, there since the v2 backend landed (#7173,
    # 1b107eb4), so in 2.0.0. Step pods carry an ownerReference (controller) to their Argo Workflow and the label
    # workflows.argoproj.io/workflow: createWorkflowPod in argoproj/argo-workflows workflow/controller/workflowpod.go.
    Feature("KFP_POD_NAME in a step's container, to give the training job the run's Workflow as owner", (2, 0, 0)),
    # The driver evaluates triggerPolicy.condition as CEL, backend/src/v2/expression/expression.go (2.0.0);
    # dsl.Else compiles to the negation "!(...)" of the same condition.
    Feature("dsl.If / dsl.Else", (2, 0, 0)),
    # The driver's CreatePVC / DeletePVC and PVC mounts named by a task output, backend/src/v2/driver/driver.go
    # (#9106, 761a592b, 2.0.0).
    Feature("kubernetes.CreatePVC / DeletePVC and mount_pvc(pvc_name=<task output>)", (2, 0, 0)),
    # Sub-DAG output resolution, including DagOutputParameterSpec.value_from_oneof, backend/src/v2/driver/driver.go
    # (#11196, c5b787aa, 2.4.0).
    Feature("dsl.OneOf over the outputs of dsl.If / dsl.Else branches", (2, 4, 0)),
    # The driver reads resourceCpuLimit, resourceMemoryRequest, accelerator resourceCount / resourceType ... and
    # resolves their placeholders, backend/src/v2/driver/driver.go (#11501, 7c931ae2, 2.4.0).
    Feature("set_cpu_limit / set_memory_request / set_accelerator_limit ... from a pipeline parameter", (2, 4, 0)),
    # The driver resolves {{$.pipeline_job_uuid}} and the other job and task placeholders (#11599, 6a13f4ba, 2.5.0);
    # before, the step received the placeholder text itself.
    Feature("dsl.PIPELINE_JOB_ID_PLACEHOLDER as a step argument", (2, 5, 0)),
    # The driver resolves secret_name_parameter, node_selector_json and toleration_json, backend/src/v2/driver/
    # driver.go (#11770, fd1b48b4, 2.5.0; a list of tolerations: 90909fc0, 2.5.0).
    Feature("use_secret_as_env(secret_name=<pipeline parameter>)", (2, 5, 0)),
    # The same change resolves SecretAsVolume.secret_name_parameter (the "Get secret mount information" loop of
    # backend/src/v2/driver/driver.go); SecretAsVolume.optional is older.
    Feature("use_secret_as_volume(secret_name=<pipeline parameter>, optional=True)", (2, 5, 0)),
    Feature("add_node_selector_json / add_toleration_json from a pipeline parameter", (2, 5, 0)),
    # An empty toleration list or dict adds no toleration instead of an invalid empty one (#11898, 0010b067, 2.14.0).
    Feature("add_toleration_json given an empty list", (2, 14, 0)),
    # 2.5.0 (#11673, 30210e33) gave a retryStrategy only to tasks of the root DAG; the Argo compiler gives one to
    # any task since #11908 (beae62fb, 2.14.0), backend/src/v2/compiler/argocompiler/container.go.
    Feature("set_retry on a task inside dsl.If", (2, 14, 0)),
    # SecretAsEnv.optional (kubernetes_executor_config.proto) and the driver setting SecretKeySelector.optional,
    # backend/src/v2/driver/k8s.go (#12216, 55ec8469, 2.15.0). The 2.14 Argo compiler unmarshals the Kubernetes
    # config strictly and fails on the unknown field; 2.5 and older discard it, so the key is required.
    Feature("use_secret_as_env(..., optional=True)", (2, 15, 0)),
)
LIMITING = max(FEATURES, key=lambda feature: feature.since)
MINIMUM_BACKEND: Version = LIMITING.since

# The v2beta1 healthz answer has had a pipeline_store field since #11952 (ea207310, 2.14.0; OpenShift AI 2.22
# backported it), backend/src/apiserver/main.go. Its absence dates a server that reports no version.
PIPELINE_STORE_SINCE: Version = (2, 14, 0)

# "2.16.0", "v2.15.0", "2.15.0-rc.1", "2.16.0+abc": a release, its pre-releases and builds.
_RELEASE_TAG = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+].*)?", re.IGNORECASE)


def parse_tag(tag: object) -> Version | None:
    """The release a healthz ``tag_name`` names, or None where it names none.

    The API server reports the TAG_NAME its image was built with, "unknown" if
    none (backend/src/apiserver/main.go). Upstream release images carry their
    release ("2.3.0", "2.16.0") except 2.4 to 2.15, which the GitHub workflow
    built without TAG_NAME (#11573; fixed by #12795 in 2.16.0). Data Science
    Pipelines images, which OpenShift AI runs, never have one: their builds pass
    none and the operator's API server Deployment sets none. Branch builds report
    the branch ("master"). A pre-release counts as its release: it is cut from
    the release branch, with the release's features.
    """
    match = _RELEASE_TAG.fullmatch(tag.strip()) if isinstance(tag, str) else None
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def check_backend(host: str, health: Mapping[str, object]) -> str:
    """The line to print about ``host``'s backend, given its healthz JSON; UserError where it is too old.

    A server that names no release is refused only where its answer proves it
    too old (no ``pipeline_store``: older than 2.14.0). Otherwise the run goes
    ahead and the returned line is a warning that says the version was not
    checked, what the pipeline needs and what an older server does. Refusing
    every unversioned server would refuse every OpenShift AI server, supported
    ones included, and upstream 2.15 servers, exactly the minimum, whose images
    report "unknown"; an option to override that would be given every time and
    prove nothing. The warning is no silent fallback: the output says what ran
    unverified.
    """
    tag = health.get("tag_name")
    version = parse_tag(tag)
    if version is not None:
        if version < MINIMUM_BACKEND:
            raise UserError(_too_old(host, tag, version))
        return f"{host} runs Kubeflow Pipelines backend {tag}; this pipeline needs {_dotted(MINIMUM_BACKEND)} or later"
    if "pipeline_store" not in health:
        raise UserError(_older_than_pipeline_store(host, tag))
    return _unverified(host, tag)


def _too_old(host: str, tag: object, version: Version) -> str:
    lacking = [feature for feature in FEATURES if feature.since > version]
    return (
        f"{host} runs Kubeflow Pipelines backend {tag} (the tag_name of its /apis/v2beta1/healthz), older than "
        f"{_dotted(MINIMUM_BACKEND)}, the oldest this pipeline runs on. It lacks {_listed(lacking)}. " + _upgrade()
    )


def _older_than_pipeline_store(host: str, tag: object) -> str:
    lacking = [feature for feature in FEATURES if feature.since >= PIPELINE_STORE_SINCE]
    return (
        f"{host} does not report its Kubeflow Pipelines backend version ({_reported(tag)}), and its "
        f"/apis/v2beta1/healthz answer has no pipeline_store, which every backend since "
        f"{_dotted(PIPELINE_STORE_SINCE)} sends: it is older than {_dotted(PIPELINE_STORE_SINCE)}, and this pipeline "
        f"needs {_dotted(MINIMUM_BACKEND)} or later. It lacks {_listed(lacking)}. " + _upgrade()
    )


def _unverified(host: str, tag: object) -> str:
    unverified = [feature for feature in FEATURES if feature.since > PIPELINE_STORE_SINCE]
    return (
        f"warning: {host} does not report its Kubeflow Pipelines backend version ({_reported(tag)}: the data science "
        "pipelines of OpenShift AI and Kubeflow Pipelines 2.4 to 2.15 images are built without one), so it was not "
        f"checked. Its healthz answer puts it at {_dotted(PIPELINE_STORE_SINCE)} or later (OpenShift AI 2.22 or "
        f"later); this pipeline needs {_dotted(MINIMUM_BACKEND)} (OpenShift AI 3.0) or later for "
        f"{_listed(unverified)}, and an older one refuses the run or runs it without them."
    )


def _upgrade() -> str:
    return (
        "Nothing was submitted. Upgrade the pipeline server: OpenShift AI to 3.0 or later (its data science pipelines "
        f"server has these), Kubeflow Pipelines to {_dotted(MINIMUM_BACKEND)} or later."
    )


def _reported(tag: object) -> str:
    return "no tag_name" if tag is None else f"tag_name {tag!r}"


def _listed(features: list[Feature]) -> str:
    return "; ".join(f"{feature.uses} (from {_dotted(feature.since)})" for feature in features)


def _dotted(version: Version) -> str:
    return ".".join(map(str, version))
