"""An S3 client configured from the environment, shared by the data sources and the model storage target.

Credentials and the endpoint come from the standard ``AWS_*`` variables, in the
cluster from a Secret given to the step (an OpenShift AI data connection's keys
work as they are: its ``AWS_S3_ENDPOINT`` is read when ``AWS_ENDPOINT_URL`` is
not set). botocore's standard retry mode retries throttling, 5xx answers and
dropped connections; boto3's transfer manager retries a multipart upload's parts.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

S3_ATTEMPTS = 5
ACCESS_DENIED = ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")
NOT_FOUND = ("404", "NoSuchKey", "NoSuchBucket")


def client_from_environment():
    """A boto3 S3 client that reads the environment as it is now."""
    import boto3
    from botocore.config import Config

    # botocore reads AWS_ENDPOINT_URL itself; an OpenShift AI data connection names the endpoint AWS_S3_ENDPOINT.
    standard = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
    endpoint = None if standard else os.environ.get("AWS_S3_ENDPOINT") or None
    # S3-compatible stores (MinIO, NooBaa, Ceph RGW) want path-style bucket addressing.
    config = Config(
        retries={"max_attempts": S3_ATTEMPTS, "mode": "standard"},
        s3={"addressing_style": "path"} if standard or endpoint else None,
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)


def bucket_and_key(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` as (bucket, key); the key may be empty."""
    parts = urlsplit(uri)
    return parts.netloc, parts.path.lstrip("/")


def error_code(error) -> str:
    """The S3 error code of a botocore ``ClientError``."""
    return str(error.response.get("Error", {}).get("Code", ""))


def keys_under(client, bucket: str, prefix: str) -> list[str]:
    """Every key under ``prefix`` in ``bucket``, sorted (all pages of the listing)."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))
