"""The model storage targets' run parameters: their defaults, help texts and validation, in one place."""

from __future__ import annotations

from dataclasses import dataclass

from common.cli_options import run_option
from common.kube import is_subdomain_name
from components.data.sources import credential_problem, describe_uri
from components.store.oci_target import oci_location_problem
from components.store.s3_target import s3_location_problem


@dataclass(frozen=True)
class StorageOptions:
    """Where a model version that passed the gate is kept besides the Hub."""

    s3_uri: str = run_option(
        "",
        "S3 location that keeps a copy of every model version that passes the gate: s3://bucket or "
        "s3://bucket/prefix. Each run's version (what is published to the Hub: the GGUF, Modelfile, model card and "
        "reports, and the merged checkpoint that a serving runtime loads when publish_merged says so) goes under "
        "<model_name>/<run id>/ and is complete once its _COMPLETE.json is there. Credentials from the Secret "
        "model_s3_secret names. Empty: no S3 copy.",
        name="model_s3_uri",
    )
    s3_secret: str = run_option(
        "aws-connection-models",
        "Secret of the OpenShift AI data connection with the S3 credentials and endpoint for model_s3_uri (keys "
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_S3_ENDPOINT, ...); the default is the Secret of a connection "
        "named models.",
        name="model_s3_secret",
    )
    oci_uri: str = run_option(
        "",
        "OCI repository that receives every model version that passes the gate as a KServe modelcar image: "
        "oci://registry[:port]/repository, no tag. Each run's image is tagged with its run id and holds the same "
        "files as the S3 copy under /models, on a static busybox base (an InferenceService's storageUri takes it as "
        "it is). Pushed without a container daemon; credentials from the Secret model_oci_secret names. Empty: no "
        "image.",
        name="model_oci_uri",
    )
    oci_secret: str = run_option(
        "oci-connection-models",
        "Secret of type kubernetes.io/dockerconfigjson with push credentials for model_oci_uri's registry (an "
        "OpenShift AI OCI connection's Secret, or oc create secret docker-registry).",
        name="model_oci_secret",
    )


def option_problems(options: StorageOptions) -> dict[str, str]:
    """Field name -> what is wrong with its value; callers name the field their way."""
    problems = {}
    if options.s3_uri and (problem := s3_location_problem(options.s3_uri)):
        problems["s3_uri"] = problem
    carried = options.oci_uri and credential_problem(
        options.oci_uri,
        f"Write it without the credential ({describe_uri(options.oci_uri)}) and put the registry's push credentials "
        f"in the Secret '{options.oci_secret}' (named by model_oci_secret): `oc create secret docker-registry "
        f"{options.oci_secret} --docker-server=<registry> --docker-username=<user> --docker-password=<password>`",
    )
    if carried:
        problems["oci_uri"] = carried
    elif options.oci_uri and (problem := oci_location_problem(options.oci_uri)):
        problems["oci_uri"] = problem
    for field in ("s3_secret", "oci_secret"):
        if not is_subdomain_name(secret := getattr(options, field)):
            problems[field] = f"{secret!r} is not a valid Secret name (lowercase letters, digits, '-' and '.')"
    return problems
