"""Fetch a dataset named by URL into the run's data directory, so the data stage reads local files as always.

``dataset_uri`` forms (a plain path, directory or glob is read in place and never comes here):

``https://host/path/data.jsonl[.gz]`` (or ``http://``)
    One file, read without credentials.
``secret:DATASET_URL``
    Any of the URLs here, read from the environment variable ``DATASET_URL``: in the cluster the key
    ``DATASET_URL`` of the data connection Secret (``data_connection_secret``). This is how a URL that
    carries a credential (a presigned S3 or GCS URL, an Azure SAS URL) reaches the step: a run parameter
    is kept in the run's record and the pods' arguments, so the first step refuses such a URL there
    (``credential_in_url``). Its query string and user info are never printed, by this module or by
    urllib3's retry warnings.
``s3://bucket/key.jsonl[.gz]`` or ``s3://bucket/prefix/``
    One object, or every ``.jsonl`` / ``.jsonl.gz`` object under the prefix. Credentials and endpoint
    come from the standard AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` for MinIO, OpenShift Data
    Foundation / NooBaa or Ceph RGW), in the cluster from a Secret; the ``AWS_S3_ENDPOINT`` of an
    OpenShift AI data connection works too.
``hf://datasets/owner/name[@revision][/path]``
    The ``.jsonl`` / ``.jsonl.gz`` files of a Hugging Face Hub dataset repository (under ``path``, or
    the file ``path``), the syntax of ``huggingface_hub.parse_hf_uri``. Private ones need ``HF_TOKEN``.

Every file appears under its final name only once complete (temporary name, then rename). Each
library retries transient failures itself: urllib3 ``Retry`` for HTTP, botocore's standard retry mode
for S3, huggingface_hub's backoff for the Hub.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterator
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from common.atomic import write_file_atomic
from common.errors import UserError
from common.records import RemoteVersion
from common.s3 import ACCESS_DENIED, NOT_FOUND, bucket_and_key, client_from_environment, error_code, keys_under
from components.data.chunks import SUFFIXES
from components.hub_auth import READ_SECRET_NAME, TOKEN_ENV, hub_token, token_refused

SCHEMES = ("http", "https", "s3", "hf")
ALL_JSONL = str(Path("**") / "*.jsonl*")
HTTP_RETRIES = 5
HTTP_TIMEOUT_S = (30, 300)  # connect, read between bytes
# A dataset_uri that says "the URL is in a Secret": the environment variable, in the cluster the data connection
# Secret's key of the same name (pipelines/fine_tune.py maps it to the first step and the prepare step).
URL_ENV = "DATASET_URL"
SECRET_PREFIX = "secret:"
SECRET_URI = f"{SECRET_PREFIX}{URL_ENV}"
# Query parameters that make a URL a credential: AWS SigV4 and SigV2 presigned URLs, GCS V4 and V2 signed URLs,
# Azure SAS tokens, and the bearer tokens some servers take in the query. Compared lower-cased.
CREDENTIAL_PARAMETERS = (
    "x-amz-signature",
    "x-amz-credential",
    "x-amz-security-token",
    "awsaccesskeyid",
    "signature",
    "x-goog-signature",
    "x-goog-credential",
    "googleaccessid",
    "sig",
    "token",
    "access_token",
    "api_key",
    "apikey",
)
# Loggers that print the URL they retry, query string included: urllib3's "Retrying (...) after connection broken
# by ...: /path?query" is a WARNING, which the KFP executor's logging (INFO and up) prints in the step's log.
URL_LOGGERS = ("urllib3.connectionpool", "urllib3.util.retry", "requests")


def is_secret_reference(dataset_uri: str) -> bool:
    """True for ``secret:...``; only ``secret:DATASET_URL`` is valid (``secret_reference_problem``)."""
    return dataset_uri.strip().lower().startswith(SECRET_PREFIX)


def secret_reference_problem(dataset_uri: str) -> str | None:
    """What is wrong with a ``secret:`` dataset_uri, or None. Only the one environment variable may be named, so
    the URL cannot be read from another Secret key (an access key would be printed as a bad URL)."""
    if not is_secret_reference(dataset_uri) or dataset_uri.strip() == SECRET_URI:
        return None
    return f"is {dataset_uri.strip()!r}: the only Secret reference is {SECRET_URI} (the Secret's key {URL_ENV})"


def secret_url() -> str:
    """The URL in ``$DATASET_URL``; a missing one, or one this module cannot fetch, is a clear error that never
    shows more of it than ``describe_uri`` does."""
    url = os.environ.get(URL_ENV, "").strip()
    if not url:
        raise UserError(
            f"the URI is {SECRET_URI}, but the environment variable {URL_ENV} is empty or unset. In the "
            f"cluster it comes from the key {URL_ENV} of the data connection Secret that the run parameter "
            f"data_connection_secret names: add the key to that Secret (for a local run, export {URL_ENV}), then "
            "start the run again."
        )
    problem = secret_url_problem(url)
    if problem:
        raise UserError(f"The URL in {URL_ENV} {problem}.")
    return url


def secret_url_problem(url: str) -> str | None:
    """Why the URL found in ``$DATASET_URL`` cannot be fetched, or None."""
    scheme, sep, _ = url.partition("://")
    if sep and scheme.lower() in SCHEMES:
        return None
    return (
        f"({describe_uri(url)}) is not an https://, http://, s3:// or hf://datasets/ URL; put the dataset's URL "
        f"in {URL_ENV}"
    )


def credential_in_url(uri: str) -> str | None:
    """What credential ``uri`` carries, for a message that never shows it: a user name or password before the
    host, or the first signing or token query parameter; None when it carries none."""
    parts = urlsplit(uri.strip())
    if not parts.scheme or not parts.netloc:
        return None
    if "@" in parts.netloc:
        return "a user name or password before the host"
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if name.lower() in CREDENTIAL_PARAMETERS:
            return f"the query parameter {name}"
    return None


def redact_urls(text: str) -> str:
    """``text`` with every URL's query string and user info cut out (the rest of the URL stays readable)."""
    text = re.sub(r"\?[^\s'\"<>)]*", "?<redacted>", text)
    return re.sub(r"(://)[^/\s'\"@]*@", r"\1<redacted>@", text)


class _RedactUrls(logging.Filter):
    """Rewrites a log record's message through ``redact_urls`` before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact_urls(record.getMessage()), None
        return True


@contextlib.contextmanager
def redacted_url_logs() -> Iterator[None]:
    """While fetching, what urllib3 and requests log shows no query string or user info."""
    redacting = _RedactUrls()
    loggers = [logging.getLogger(name) for name in URL_LOGGERS]
    for logger in loggers:
        logger.addFilter(redacting)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(redacting)


def is_remote(dataset_uri: str) -> bool:
    """True for a URL or ``secret:DATASET_URL``; a URL of a scheme this module cannot fetch is a clear error."""
    problem = secret_reference_problem(dataset_uri) or scheme_problem(dataset_uri)
    if problem:
        raise UserError(f"the URI {problem}.")
    return is_secret_reference(dataset_uri) or "://" in dataset_uri


def scheme_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be fetched, for its scheme (ending without a full stop, after the parameter's name);
    None for a path, or a URL of a scheme this module fetches."""
    scheme, sep, _ = uri.strip().partition("://")
    if not sep or scheme.lower() in SCHEMES:
        return None
    return (
        f"is {describe_uri(uri)!r}, whose scheme '{scheme}' this pipeline cannot fetch. Use a path on the workspace "
        "PVC, an https:// or s3:// URL, or a Hub dataset as hf://datasets/owner/name"
    )


@dataclass(frozen=True)
class Located:
    """Where the data stage reads a dataset_uri, and how the server it came from identified what was read (part of
    the source's lineage; empty for a local path)."""

    input: str  # a path or glob of the local files
    remote: RemoteVersion = RemoteVersion()


def fetch(dataset_uri: str, destination: Path) -> Located:
    """Download ``dataset_uri`` (or, for ``secret:DATASET_URL``, the URL in ``$DATASET_URL``) into
    ``destination`` (emptied first): the input for the data stage, and the identity of what was read."""
    from_secret = is_secret_reference(dataset_uri)
    url = secret_url() if from_secret else dataset_uri
    shutil.rmtree(destination, ignore_errors=True)
    destination.mkdir(parents=True)
    scheme = url.partition("://")[0].lower()
    print(f"fetching {describe_uri(url)}{f' (from {URL_ENV})' if from_secret else ''} into {destination}", flush=True)
    with redacted_url_logs():
        if scheme in ("http", "https"):
            return _fetch_http(url, destination)
        if scheme == "s3":
            return _fetch_s3(url, destination)
        return _fetch_hub_dataset(url, destination)


def credential_problem(uri: str, instead: str) -> str | None:
    """Why a run parameter may not be ``uri``, when it carries a credential, ending with ``instead`` (where the URL
    or the credential goes); None when it carries none. KFP keeps run parameters in the run's record and shows them
    in the UI and the pods' arguments, so a credential there is leaked; the message never repeats it."""
    carried = credential_in_url(uri)
    if not carried:
        return None
    return (
        f"is a URL that carries a credential ({describe_uri(uri)}, with {carried}), and run parameters are kept in "
        f"the run's record and shown in the pipelines UI and the pods' arguments. {instead}"
    )


def describe_uri(uri: str) -> str:
    """``uri`` without user info or query string, which may hold credentials (presigned URLs)."""
    parts = urlsplit(uri.strip())
    if not parts.scheme or not parts.netloc:
        return uri.strip()
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def hub_dataset_id(dataset_uri: str) -> str | None:
    """``owner/name`` when ``dataset_uri`` is a Hub dataset URI, else None."""
    if not dataset_uri.strip().lower().startswith("hf://"):
        return None
    return _parse_hub_dataset(dataset_uri.strip()).id


# --- HTTP(S) -----------------------------------------------------------------------------------


def _fetch_http(url: str, destination: Path) -> Located:
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    shown = describe_uri(url)
    retry = Retry(
        total=HTTP_RETRIES,
        backoff_factor=1.0,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods=("GET",),
        raise_on_status=False,
    )
    with requests.Session() as session:
        session.mount("http://", HTTPAdapter(max_retries=retry))
        session.mount("https://", HTTPAdapter(max_retries=retry))
        try:
            with session.get(url, stream=True, timeout=HTTP_TIMEOUT_S) as response:
                if response.status_code != 200:
                    raise UserError(_http_problem(shown, response.status_code))
                target = destination / _local_name(PurePosixPath(urlsplit(response.url).path).name)
                write_file_atomic(target, lambda handle: _copy_stream(response.iter_content(1 << 20), handle))
                etag = response.headers.get("ETag", "")
        except requests.RequestException as error:
            raise UserError(
                f"Could not download {shown}: {type(error).__name__} after {HTTP_RETRIES} retries. "
                "Check that the host is reachable from the cluster (proxy, egress rules) and try again."
            ) from None
    return Located(str(_name_by_content(target)), RemoteVersion(etag=etag))


def _http_problem(shown: str, status: int) -> str:
    if status in (401, 403):
        return (
            f"The server refused {shown} (HTTP {status}). This step sends no credentials over HTTP: give a "
            f"presigned URL in the data connection Secret's key {URL_ENV} and {SECRET_URI} instead of the URL, or "
            "put the data on S3 (s3://, credentials from a Secret) or the workspace PVC."
        )
    if status == 404:
        return f"{shown} does not exist (HTTP 404). Check the URL: it must name a .jsonl or .jsonl.gz file."
    return f"The server answered HTTP {status} for {shown}, also after {HTTP_RETRIES} retries. Try again later."


def _copy_stream(chunks, handle: BinaryIO) -> None:
    for chunk in chunks:
        handle.write(chunk)


def _local_name(remote_name: str) -> str:
    return remote_name if remote_name.endswith(SUFFIXES) else "dataset.jsonl"


def _name_by_content(path: Path) -> Path:
    """A download saved as ``dataset.jsonl`` that is gzip data gets the name the data stage decompresses."""
    if path.name != "dataset.jsonl":
        return path
    with open(path, "rb") as handle:
        if handle.read(2) != b"\x1f\x8b":
            return path
    return path.rename(path.with_name("dataset.jsonl.gz"))


# --- S3 ----------------------------------------------------------------------------------------


def _fetch_s3(uri: str, destination: Path) -> Located:
    """The one object's local path, or a glob of the objects under the prefix, with their ETags and VersionIds.

    Each object's head is read first and its download pinned to the version the head named (in a versioned
    bucket), so the identity recorded is the one read even when the object is overwritten meanwhile."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    shown = describe_uri(uri)
    bucket, key = bucket_and_key(uri)
    if not bucket:
        raise UserError(f"{shown!r} names no bucket; write s3://bucket/key.jsonl or s3://bucket/prefix/.")
    client = client_from_environment()
    try:
        if key.endswith(SUFFIXES):
            objects = {key: PurePosixPath(key).name}
        else:
            prefix = f"{key.rstrip('/')}/" if key else ""
            objects = {
                item: item[len(prefix) :] for item in keys_under(client, bucket, prefix) if item.endswith(SUFFIXES)
            }
            if not objects:
                raise UserError(f"No .jsonl or .jsonl.gz objects are under {shown}; check the bucket and prefix.")
        versions = []
        for name, relative in objects.items():
            head = client.head_object(Bucket=bucket, Key=name)
            version = head.get("VersionId") or ""
            pinned = {"VersionId": version} if version and version != "null" else {}
            write_file_atomic(
                destination / _safe_relative(relative, shown),
                lambda handle: client.download_fileobj(bucket, name, handle, ExtraArgs=pinned),
            )
            versions.append((name, head.get("ETag", ""), version))
        if key.endswith(SUFFIXES):
            ((_, etag, version),) = versions
            return Located(str(destination / PurePosixPath(key).name), RemoteVersion(etag=etag, version_id=version))
        listing = "".join(f"{name}\0{etag}\0{version}\n" for name, etag, version in versions)
        digest = f"sha256:{hashlib.sha256(listing.encode()).hexdigest()}"
        return Located(str(destination / ALL_JSONL), RemoteVersion(objects=digest))
    except NoCredentialsError:
        raise UserError(
            f"No S3 credentials for {shown}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for "
            "MinIO or OpenShift Data Foundation). In the cluster, put them in a Secret that the prepare step gets as "
            "environment variables."
        ) from None
    except ClientError as error:
        raise UserError(_s3_problem(shown, error)) from None
    except BotoCoreError as error:
        raise UserError(
            f"Could not read {shown}: {error}. Check AWS_ENDPOINT_URL and that the endpoint is reachable."
        ) from None


def _s3_problem(uri: str, error) -> str:
    code = error_code(error)
    if code in ACCESS_DENIED:
        return (
            f"S3 refused access to {uri} ({code}): the credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
            "are wrong or may not read that bucket. Fix the Secret the prepare step reads them from."
        )
    if code in NOT_FOUND:
        return f"{uri} does not exist ({code}). Check the bucket and key (and AWS_ENDPOINT_URL for non-AWS stores)."
    return f"S3 answered {code or 'an error'} for {uri}: {error}."


def _safe_relative(relative: str, uri: str) -> Path:
    """A key below the prefix as a local relative path; keys that would escape the folder are refused."""
    parts = PurePosixPath(relative).parts
    if not parts or any(part in ("..", "") for part in parts) or relative.startswith("/"):
        raise UserError(f"The object key {relative!r} under {uri} cannot be stored as a local file; rename it.")
    return Path(*parts)


# --- Hugging Face Hub datasets -----------------------------------------------------------------


def _parse_hub_dataset(uri: str):
    from huggingface_hub import parse_hf_uri
    from huggingface_hub.errors import HfUriError

    try:
        parsed = parse_hf_uri(uri)
    except HfUriError as error:
        raise UserError(
            f"{describe_uri(uri)!r} is not a Hub dataset URI ({error}). Write hf://datasets/owner/name."
        ) from None
    if parsed.type != "dataset":
        raise UserError(
            f"{describe_uri(uri)!r} names a Hub {parsed.type}, not a dataset; write hf://datasets/owner/name."
        )
    return parsed


def _fetch_hub_dataset(uri: str, destination: Path) -> Located:
    """The one file's local path, or a glob of the JSONL files fetched, and the commit they were read at: the
    revision is resolved first and the download pinned to it, so a push meanwhile cannot mix two commits."""
    import httpx2  # huggingface_hub's HTTP client: its transport errors are an unreachable Hub
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    parsed = _parse_hub_dataset(uri)
    path = parsed.path_in_repo.strip("/")
    prefix = f"{path}/" if path else ""
    patterns = [path] if path.endswith(SUFFIXES) else [f"{prefix}*{suffix}" for suffix in SUFFIXES]
    token = hub_token()
    try:
        commit = HfApi(token=token or False).dataset_info(parsed.id, revision=parsed.revision).sha
        snapshot_download(
            parsed.id,
            repo_type="dataset",
            revision=commit,
            allow_patterns=patterns,
            local_dir=destination,
            token=token or False,
        )
    except RevisionNotFoundError:
        raise UserError(
            f"The Hub dataset {parsed.id} has no revision {parsed.revision!r}; check the part after '@'."
        ) from None
    except RepositoryNotFoundError:
        hint = (
            ""
            if token
            else f" If it is private or gated, set {TOKEN_ENV} (in the cluster, the {READ_SECRET_NAME} Secret)."
        )
        raise UserError(f"The Hub dataset {parsed.id} does not exist or this token cannot see it.{hint}") from None
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else 0
        if status in (401, 403):
            raise UserError(token_refused(status, f"download the dataset {parsed.id}")) from None
        raise UserError(f"The Hub answered HTTP {status} for the dataset {parsed.id}; try again later.") from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, httpx2.TransportError):
        raise UserError(
            f"Could not reach the Hub to download the dataset {parsed.id}; check the connection (and HF_ENDPOINT)."
        ) from None
    if not any(destination.glob(ALL_JSONL)):
        where = f"at {path}" if path else "in it"
        raise UserError(
            f"The Hub dataset {parsed.id} has no .jsonl or .jsonl.gz files {where}. This pipeline reads JSONL "
            "question/answer records; point the URI at them (hf://datasets/owner/name/path/to/file.jsonl)."
        )
    located = str(destination / path) if path.endswith(SUFFIXES) else str(destination / ALL_JSONL)
    return Located(located, RemoteVersion(revision=commit))
