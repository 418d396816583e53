"""Copy a model version to S3, under ``<base>/<model>/<run id>/``, complete only once its marker is there.

A reader (KServe's storage initializer, the Model Registry's URI, a person with
``aws s3 ls``) must never take a half-uploaded version for a whole one: every
file goes first, the marker ``_COMPLETE.json`` (each file's size) last. A copy
made again for the same run (a retried step) first deletes the marker, then
uploads every file, removes the keys it no longer has and writes the marker
anew. Large files go up in multipart parts (boto3's transfer manager, which
reads each part from the file as it sends it); every request, each part
included, is retried by botocore on throttling, 5xx answers and dropped
connections (``common.s3``).
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

from common.errors import UserError
from common.records import StoredCopy
from common.s3 import ACCESS_DENIED, NOT_FOUND, bucket_and_key, client_from_environment, error_code, keys_under

COMPLETE_MARKER = "_COMPLETE.json"
MULTIPART_CHUNK = 64 << 20  # parts of 64 MiB: a 16 GB checkpoint file is 250 parts, far below S3's 10,000
CONCURRENT_PARTS = 4  # parts in flight at once: a few connections, as a shared store likes


def version_uri(base_uri: str, model_name: str, run_id: str) -> str:
    """Where run ``run_id`` of ``model_name`` goes under ``base_uri`` (``s3://bucket`` or ``s3://bucket/prefix``)."""
    problem = s3_location_problem(base_uri)
    if problem:
        raise UserError(f"model_s3_uri {problem}.")
    bucket, prefix = bucket_and_key(base_uri)
    parts = [part for part in (prefix.strip("/"), model_name, run_id) if part]
    return f"s3://{bucket}/{'/'.join(parts)}/"


def s3_location_problem(uri: str) -> str | None:
    """What is wrong with ``uri`` as a place to keep versions, or None."""
    parts = urlsplit(uri)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        return f"is {uri!r}, which is not an S3 location; write s3://bucket or s3://bucket/prefix"
    return None


def upload_version(folder: Path, uri: str, secret_hint: str, client=None) -> StoredCopy:
    """Copy every file under ``folder`` to ``uri`` (a version_uri), the marker last.

    ``secret_hint`` says, in an error, where the step's credentials come from.
    """
    from boto3.exceptions import S3UploadFailedError
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    client = client or client_from_environment()
    bucket, prefix = bucket_and_key(uri)
    files = {path.relative_to(folder).as_posix(): path for path in sorted(folder.rglob("*")) if path.is_file()}
    transfer = TransferConfig(
        multipart_threshold=MULTIPART_CHUNK, multipart_chunksize=MULTIPART_CHUNK, max_concurrency=CONCURRENT_PARTS
    )
    try:
        client.delete_object(Bucket=bucket, Key=prefix + COMPLETE_MARKER)
        for name, path in files.items():
            client.upload_file(str(path), bucket, prefix + name, Config=transfer)
        for key in keys_under(client, bucket, prefix):
            if key[len(prefix) :] not in files:
                client.delete_object(Bucket=bucket, Key=key)
        sizes = {name: path.stat().st_size for name, path in files.items()}
        marker = json.dumps({"files": sizes}, indent=1, sort_keys=True).encode()
        client.put_object(Bucket=bucket, Key=prefix + COMPLETE_MARKER, Body=marker, ContentType="application/json")
    except NoCredentialsError:
        raise UserError(
            f"No S3 credentials to write {uri}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
            f"AWS_ENDPOINT_URL for MinIO or OpenShift Data Foundation); {secret_hint}."
        ) from None
    except ClientError as error:
        raise UserError(_refusal(uri, error_code(error), error.operation_name, secret_hint, str(error))) from None
    except S3UploadFailedError as error:  # the transfer manager's wrapping of a refused PutObject or part
        cause = error.__cause__ or error.__context__
        code = error_code(cause) if isinstance(cause, ClientError) else ""
        raise UserError(_refusal(uri, code, "PutObject", secret_hint, str(error))) from None
    except BotoCoreError as error:
        raise UserError(
            f"Could not write {uri}: {error}. Check AWS_ENDPOINT_URL and that the endpoint is reachable."
        ) from None
    return StoredCopy(uri, len(files), sum(sizes.values()))


def _refusal(uri: str, code: str, operation: str, secret_hint: str, detail: str) -> str:
    """What S3's refusal of ``operation`` on ``uri`` means, and what to fix."""
    if code in ACCESS_DENIED:
        return (
            f"S3 refused {operation} on {uri} ({code}): AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are wrong, or "
            f"their policy does not allow {operation} (storing a version needs s3:PutObject, s3:DeleteObject and "
            f"s3:ListBucket on the bucket); {secret_hint}."
        )
    if code in NOT_FOUND:
        return f"The bucket of {uri} does not exist ({code}); create it or fix model_s3_uri."
    return f"S3 answered {code or 'an error'} to {operation} while writing {uri}: {detail}"
