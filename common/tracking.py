"""An MLflow tracking server, spoken to over its REST API with ``requests``: one run per pipeline run.

Why not the ``mlflow`` package: the trainer logs from rank 0's training loop, which every other rank waits for,
and the pipeline's steps must fail in seconds on an unreachable server. mlflow's client retries each call for
minutes (about four before it gives up on a stopped server), and transformers' ``MLflowCallback`` catches no error
and ends the run itself. Here each call has short timeouts and no retries; the callers decide what a failure costs
(the first step refuses the run, the trainer and the evaluation count it and go on). The image does not install
mlflow; the tests run its own server and read the runs back with its client.

The endpoints (MLflow 2.x and 3.x, ``mlflow/server/handlers.py``): experiments/get-by-name and create,
runs/search, create, log-batch, update, and the artifact proxy ``mlflow-artifacts`` (a server started with
``--serve-artifacts``, the default since 2.0). Credentials come as mlflow's own client takes them, from the
environment: ``MLFLOW_TRACKING_TOKEN`` (a bearer token) or ``MLFLOW_TRACKING_USERNAME`` and
``MLFLOW_TRACKING_PASSWORD`` (basic), and ``MLFLOW_WORKSPACE`` on a server with workspaces (OpenShift AI's: the
namespace), sent as mlflow sends it, in the ``X-MLFLOW-WORKSPACE`` header.
"""

from __future__ import annotations

import base64
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import quote, urlsplit

from common.http_trust import host_in_doubt, token_may_go_to

TOKEN_ENV = "MLFLOW_TRACKING_TOKEN"
USERNAME_ENV = "MLFLOW_TRACKING_USERNAME"
PASSWORD_ENV = "MLFLOW_TRACKING_PASSWORD"
WORKSPACE_ENV = "MLFLOW_WORKSPACE"
WORKSPACE_HEADER = "X-MLFLOW-WORKSPACE"
# The keys of the Secret mlflow_secret names, each mounted as the variable of its name.
SECRET_KEYS = (TOKEN_ENV, USERNAME_ENV, PASSWORD_ENV, WORKSPACE_ENV)
API = "/api/2.0/mlflow"
ARTIFACTS_API = "/api/2.0/mlflow-artifacts/artifacts"
PROXIED_SCHEME = "mlflow-artifacts"
# The tag that ties an MLflow run to its pipeline run: the trainer creates the run, the evaluation finds it.
PIPELINE_RUN_TAG = "kfp.run_id"
TIMEOUTS = (3.0, 10.0)  # connect, read: a server that does not answer costs seconds, never minutes
# log-batch's limits (MLflow's REST API reference): metrics, parameters and tags together per request, parameters
# and tags each, and a parameter value's length.
MAX_ENTRIES, MAX_PARAMS, MAX_TAGS = 1000, 100, 100
MAX_VALUE_CHARS = 6000
_KEY_CHARACTERS = re.compile(r"[^\w./\- :]")


class MlflowError(Exception):
    """A call the server refused or never answered; its text names the call and the server's reason. ``status``:
    the HTTP status of a refusal (None when nothing came back)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def refused(self) -> bool:
        """The server answered and will answer the same to the same request (a 4xx other than 429)."""
        return self.status is not None and 400 <= self.status < 500 and self.status != 429


@dataclass(frozen=True)
class TrackedRun:
    """The MLflow run of one pipeline run."""

    experiment_id: str
    run_id: str
    url: str  # the run's page in the MLflow UI
    artifact_uri: str  # where its artifacts go: mlflow-artifacts:/... on a server that proxies them


@dataclass(frozen=True)
class MlflowServer:
    """The tracking server at ``uri`` with the headers that authenticate this process."""

    uri: str
    headers: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_environment(cls, uri: str, environ: Mapping[str, str] = os.environ) -> MlflowServer:
        """The server at ``uri``, with the credentials ``environ`` holds; refused (ValueError, one clause) when they
        would go over plain http to another machine."""
        uri = uri.strip().rstrip("/")
        headers = {}
        token = environ.get(TOKEN_ENV, "").strip()
        user, password = environ.get(USERNAME_ENV, "").strip(), environ.get(PASSWORD_ENV, "")
        if user and password:  # basic wins, as in mlflow's client
            headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        elif token:
            headers["Authorization"] = f"Bearer {token}"
        if headers and (refused := token_may_go_to(uri)):
            raise ValueError(f"its credentials ({TOKEN_ENV} or {USERNAME_ENV}/{PASSWORD_ENV}) are not sent: {refused}")
        if workspace := environ.get(WORKSPACE_ENV, "").strip():
            headers[WORKSPACE_HEADER] = workspace
        return cls(uri, headers)

    def call(self, method: str, endpoint: str, body: dict[str, Any] | None = None, **query: str) -> dict[str, Any]:
        """The JSON answer to ``method`` on ``API/endpoint``; MlflowError for anything but a 200."""
        response = self._request(method, f"{self.uri}{API}/{endpoint}", endpoint, json=body, params=query or None)
        try:
            answer = response.json() if response.content else {}
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise MlflowError(f"{endpoint}: {self.uri} answered with something other than MLflow's JSON")
        return answer

    def _request(self, method: str, url: str, what: str, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
        """The 200 answer to ``method`` on ``url``; MlflowError naming ``what`` otherwise. No redirect is followed:
        a login page is no answer, and the credentials go to this server only."""
        import requests

        try:
            response = requests.request(
                method,
                url,
                headers={**self.headers, **(headers or {})},
                timeout=TIMEOUTS,
                allow_redirects=False,
                **kwargs,
            )
        except requests.RequestException as error:
            raise MlflowError(f"{what}: {self.uri} did not answer ({type(error).__name__}: {error})") from None
        if response.status_code != 200:
            raise MlflowError(f"{what}: HTTP {response.status_code} {_reason(response)}", response.status_code)
        return response

    def _answer(
        self, method: str, endpoint: str, path: tuple[str, ...], body: dict[str, Any] | None = None, **query: str
    ) -> Any:
        """The entry at ``path`` of the answer; MlflowError when the server's answer lacks it."""
        value: Any = self.call(method, endpoint, body, **query)
        for key in path:
            if not isinstance(value, dict) or key not in value:
                raise MlflowError(f"{endpoint}: {self.uri} answered without {'.'.join(path)}: is it an MLflow server?")
            value = value[key]
        return value

    def experiment(self, name: str) -> dict[str, Any]:
        """The experiment called ``name`` (experiment_id, artifact_location, ...), created when there is none;
        MlflowError for a deleted one, in which MLflow creates no run."""
        try:
            found = self._answer("GET", "experiments/get-by-name", ("experiment",), experiment_name=name)
        except MlflowError as error:
            if "RESOURCE_DOES_NOT_EXIST" not in str(error):
                raise
            try:
                self.call("POST", "experiments/create", {"name": name})
            except MlflowError as error:  # another run created it meanwhile
                if "RESOURCE_ALREADY_EXISTS" not in str(error):
                    raise
            found = self._answer("GET", "experiments/get-by-name", ("experiment",), experiment_name=name)
        if found.get("lifecycle_stage", "active") != "active":
            raise MlflowError(
                f"the experiment {name!r} is deleted, and MLflow logs no run into it: restore it (`mlflow experiments "
                "restore`, or in the UI) or name another mlflow_experiment"
            )
        return found

    def run_of(self, experiment: str, pipeline_run_id: str) -> TrackedRun:
        """The run of ``pipeline_run_id`` in ``experiment``: the one tagged with it, else a new one named after it
        (a restarted trainer, and the evaluation after it, find the run the first attempt created)."""
        experiment_id = str(self.experiment(experiment).get("experiment_id", ""))
        found = self.call(
            "POST",
            "runs/search",
            {
                "experiment_ids": [experiment_id],
                "filter": f"tags.`{PIPELINE_RUN_TAG}` = '{_quoted(pipeline_run_id)}'",
                "max_results": 1,
                "order_by": ["attributes.start_time ASC"],
            },
        ).get("runs")
        if found:
            info = found[0].get("info", {}) if isinstance(found, list) and isinstance(found[0], dict) else {}
        else:
            created = {
                "experiment_id": experiment_id,
                "run_name": pipeline_run_id,
                "start_time": _milliseconds(),
                "tags": [{"key": PIPELINE_RUN_TAG, "value": pipeline_run_id}],
            }
            info = self._answer("POST", "runs/create", ("run", "info"), created)
        if not isinstance(info, dict) or not all(isinstance(info.get(key), str) for key in ("run_id", "artifact_uri")):
            raise MlflowError(f"runs: {self.uri} answered without a run's run_id and artifact_uri")
        run_id = info["run_id"]
        return TrackedRun(experiment_id, run_id, self.run_url(experiment_id, run_id), info["artifact_uri"])

    def run_url(self, experiment_id: str, run_id: str) -> str:
        return f"{self.uri}/#/experiments/{experiment_id}/runs/{run_id}"

    def log(
        self,
        run: TrackedRun,
        metrics: list[dict[str, Any]] = (),
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        """Log ``metrics`` (key, value, step, timestamp), ``params`` and ``tags``, in as many batches as the API's
        limits need. A parameter is written once: logging it again with another value is refused by the server."""
        params = [{"key": _key(k), "value": _value(v)} for k, v in (params or {}).items()]
        tags = [{"key": _key(k), "value": _value(v)} for k, v in (tags or {}).items()]
        metrics = [metric for metric in metrics if math.isfinite(metric["value"])]
        while metrics or params or tags:
            batch_params, batch_tags = params[:MAX_PARAMS], tags[:MAX_TAGS]
            room = MAX_ENTRIES - len(batch_params) - len(batch_tags)  # the limit counts all three together
            batch = {"run_id": run.run_id, "metrics": metrics[:room], "params": batch_params, "tags": batch_tags}
            self.call("POST", "runs/log-batch", batch)
            metrics, params, tags = metrics[room:], params[MAX_PARAMS:], tags[MAX_TAGS:]

    def set_status(self, run: TrackedRun, status: str) -> None:
        """RUNNING, or FINISHED / FAILED, which end the run."""
        body: dict[str, Any] = {"run_id": run.run_id, "status": status}
        if status != "RUNNING":
            body["end_time"] = _milliseconds()
        self.call("POST", "runs/update", body)

    def upload(self, run: TrackedRun, name: str, content: bytes, content_type: str) -> None:
        """Put ``content`` among the run's artifacts as ``name``, through the server's artifact proxy."""
        url = f"{self.uri}{ARTIFACTS_API}/{artifact_path(run.artifact_uri)}/{quote(name)}"
        self._request("PUT", url, f"artifact {name}", headers={"Content-Type": content_type}, data=content)


def metric(key: str, value: float, step: int, timestamp_ms: int | None = None) -> dict[str, Any]:
    """One entry of log-batch's ``metrics``."""
    return {"key": _key(key), "value": float(value), "step": int(step), "timestamp": timestamp_ms or _milliseconds()}


def artifact_path(artifact_uri: str) -> str:
    """The path under the server's artifact proxy of a run's ``artifact_uri``; ValueError for a location the
    server does not proxy (an experiment whose artifacts go straight to a bucket, which this pipeline does not
    write to)."""
    parts = urlsplit(artifact_uri)
    if parts.scheme != PROXIED_SCHEME:
        raise ValueError(
            f"its artifacts go to {artifact_uri}, which the server does not proxy (only {PROXIED_SCHEME}:/ "
            "locations are written through it)"
        )
    return parts.path.strip("/")


def uri_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be a tracking server's address, as a clause; None when it can."""
    try:
        parts = urlsplit(uri.strip())
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return f"is {uri!r}, not an http:// or https:// address of an MLflow tracking server"
    if why := host_in_doubt(uri, parts):
        return why
    if parts.query or parts.fragment or re.search(r"[\s<>\"]", uri.strip()):
        return (
            f"is {uri!r}: give the server's address alone, without a query, fragment, spaces or quotes (e.g. "
            "https://host/mlflow)"
        )
    return None


def _reason(response: Any) -> str:
    """The server's error_code and message, or the start of its answer."""
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):  # a proxy's page, or JSON of another shape
        return response.text.strip()[:300]
    return f"{answer.get('error_code', '')}: {answer.get('message', '')}".strip(": ")[:300]


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _key(key: str) -> str:
    """A key MLflow takes: word characters, '.', '/', '-', ' ' and ':', at most 250 of them."""
    return _KEY_CHARACTERS.sub("_", str(key))[:250]


def _value(value: Any) -> str:
    return str(value)[:MAX_VALUE_CHARS]


def _milliseconds() -> int:
    return int(time.time() * 1000)
