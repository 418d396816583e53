"""Run the compiled pipeline on a Kubeflow Pipelines / OpenShift AI data science pipelines server.

    python -m pipelines.submit --host https://ds-pipeline-dspa-my-project.apps.example.com \\
        --param dataset_uri=s3://bucket/qa/
    python -m pipelines.submit --host URL --schedule '0 0 3 * * *' --experiment nightly \\
        --param dataset_uri=s3://bucket/qa/ --param pvc_name=llm-workspace

Without ``--schedule`` it starts one run; with it, a recurring run (at most one
run at a time, no catch-up of missed runs unless ``--catchup``). Everything that
can be checked here is checked before the server is contacted: the package, the
parameter names and values, the cron expression. Then the server's Kubeflow
Pipelines backend version is checked against the oldest this pipeline runs on
(``pipelines.backend_versions``) before anything is created there.

The bearer token is ``--token``, else ``$KFP_TOKEN``, else the one in the current
kubeconfig context (``oc login`` puts it there; ``oc whoami -t`` prints it). It is
sent only to ``--host``, never printed, and never over plain http to another
machine (``common.http_trust``): a cluster token read in transit is the cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from common.errors import UserError, exit_on_user_error, one_line
from common.http_trust import token_may_go_to
from components.run_form.command_line import checked_arguments
from pipelines.backend_versions import check_backend
from pipelines.compile import DEFAULT_OUTPUT as DEFAULT_PACKAGE
from pipelines.cron import validate_cron

TOKEN_ENV = "KFP_TOKEN"
DEFAULT_EXPERIMENT = "llm-finetune"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines.submit", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--host", required=True, help="the pipelines API URL, e.g. the data science pipelines route of the project"
    )
    parser.add_argument("--token", help=f"bearer token (default: ${TOKEN_ENV}, else the current kubeconfig context's)")
    parser.add_argument(
        "--param", action="append", default=[], metavar="NAME=VALUE", help="set a pipeline parameter (repeatable)"
    )
    parser.add_argument(
        "--schedule",
        metavar="CRON",
        help=(
            "create a recurring run: six cron fields, seconds first, e.g. '0 0 3 * * *' "
            "(03:00 daily, the server's time zone, usually UTC)"
        ),
    )
    parser.add_argument(
        "--catchup",
        action="store_true",
        help=(
            "with --schedule: start the runs missed while the schedule was paused or the server down "
            "(default: only the latest)"
        ),
    )
    parser.add_argument(
        "--experiment",
        default=DEFAULT_EXPERIMENT,
        help="experiment to file the run under, created if missing (default: %(default)s)",
    )
    parser.add_argument(
        "--name", help="display name of the run or recurring run (default: the pipeline name and the time)"
    )
    parser.add_argument(
        "--package", type=Path, default=DEFAULT_PACKAGE, help="compiled pipeline YAML (default: %(default)s)"
    )
    parser.add_argument(
        "--ca-cert", help="CA bundle to verify the server's TLS certificate (e.g. a cluster's self-signed ingress CA)"
    )
    return parser


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cron = validate_cron(args.schedule) if args.schedule is not None else None
    package = _load_package(args.package)
    arguments = checked_arguments(args.param, package)
    token, source = resolve_token(args.token)
    refuse_untrusted_host(args.host, token, source)
    print(
        f"connecting to {args.host} "
        + (
            f"with the bearer token from {source}"
            if token
            else "without a bearer token (none given, none in $KFP_TOKEN or the kubeconfig)"
        ),
        flush=True,
    )
    client = connect(args.host, token, args.ca_cert)
    name = args.name or f"{package.name} {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S}"
    with _server_errors(args.host):
        if cron is None:
            result = client.create_run_from_pipeline_package(
                str(args.package), arguments=arguments, run_name=name, experiment_name=args.experiment
            )
            print(f"started run {result.run_id} in experiment {args.experiment!r}", flush=True)
        else:
            experiment = client.create_experiment(args.experiment)
            recurring = client.create_recurring_run(
                experiment_id=experiment.experiment_id,
                job_name=name,
                cron_expression=cron,
                max_concurrency=1,
                no_catchup=not args.catchup,
                params=arguments,
                pipeline_package_path=str(args.package),
            )
            print(
                f"created recurring run {recurring.recurring_run_id} ({cron!r}, one at a time, "
                f"catch-up {'on' if args.catchup else 'off'}) in experiment {args.experiment!r}",
                flush=True,
            )
    return 0


def _load_package(path: Path):
    from kfp import components

    if not path.is_file():
        raise UserError(
            f"The pipeline package {path} does not exist; "
            "compile it with `python -m pipelines.compile` or pass --package."
        )
    try:
        return components.load_component_from_file(str(path))
    except Exception as error:  # kfp raises several types for a file that is not a pipeline
        raise UserError(
            f"{path} is not a compiled pipeline ({error}); recompile it with `python -m pipelines.compile`."
        ) from None


def resolve_token(option: str | None) -> tuple[str | None, str]:
    """The bearer token and where it came from (for the log; the token itself is never printed)."""
    if option:
        return option, "--token"
    if os.environ.get(TOKEN_ENV, "").strip():
        return os.environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
    token = kubeconfig_token()
    return (token, "the current kubeconfig context") if token else (None, "")


def refuse_untrusted_host(host: str, token: str | None, source: str) -> None:
    """Stop before any connection when ``host`` may not receive the bearer token (plain http to another machine)."""
    if token and (why := token_may_go_to(host)):
        raise UserError(
            f"Refusing to send the bearer token from {source} to --host: {why}. Use the pipelines API's https "
            "route (oc get route -n <project> ds-pipeline-dspa shows it), with --ca-cert for a self-signed "
            "certificate; plain http is accepted only to this machine (127.0.0.1, ::1, localhost), e.g. through "
            "oc port-forward."
        )


def kubeconfig_token() -> str | None:
    """The bearer token of the current kubeconfig context (static or from an exec plugin), if any."""
    from common.kube import kubeconfig_configuration

    try:
        configuration, _ = kubeconfig_configuration()
    except Exception:  # no kubeconfig, no current context, or a broken one: this source has no token
        return None
    return configuration.api_key.get("authorization", "").removeprefix("Bearer ").strip() or None


def connect(host: str, token: str | None, ca_cert: str | None):
    """A ``kfp.Client`` for ``host``, once its health answer shows a backend this pipeline runs on.

    The version check (``pipelines.backend_versions``) comes before anything is
    created: an older server may accept the run and drop what it does not know.
    """
    import kfp

    health = server_health(host, token, ca_cert)
    print(check_backend(host, health), flush=True)
    warnings.filterwarnings(
        "ignore", message="This client only works with Kubeflow Pipeline v2", category=FutureWarning
    )
    return kfp.Client(host=host, existing_token=token, ssl_ca_cert=ca_cert)


def server_health(host: str, token: str | None, ca_cert: str | None) -> dict:
    """The JSON of ``host``'s /apis/v2beta1/healthz, from one request that turns common mistakes into clear errors.

    kfp.Client itself retries a failing health check for 25 s and then reports a
    timeout, whatever the cause; one direct request tells a wrong token from a
    wrong URL. The body is read raw: kfp_server_api's V2beta1GetHealthzResponse,
    which kfp.Client.get_kfp_healthz() returns, keeps only multi_user and
    pipeline_store and drops the tag_name (the backend version) the server sends.
    """
    import kfp_server_api

    configuration = kfp_server_api.Configuration(host=host.rstrip("/"))
    if token:
        configuration.api_key["authorization"] = token
        configuration.api_key_prefix["authorization"] = "Bearer"
    if ca_cert:
        configuration.ssl_ca_cert = ca_cert
    with _server_errors(host):
        response = kfp_server_api.HealthzServiceApi(
            kfp_server_api.ApiClient(configuration)
        ).healthz_service_get_healthz(_preload_content=False)
        body = response.data
    try:
        health = json.loads(body)
    except ValueError:
        health = None
    if not isinstance(health, dict):
        raise UserError(
            f"{host} answered /apis/v2beta1/healthz with something other than the Kubeflow Pipelines API's JSON "
            f"({one_line(body.decode(errors='replace'), 200)!r}). Check --host: it is the pipelines API "
            "route, not the dashboard or a login page."
        )
    return health


@contextlib.contextmanager
def _server_errors(host: str) -> Iterator[None]:
    """Turn the API client's exceptions into one paragraph each (never including the token)."""
    import kfp_server_api
    import urllib3

    try:
        yield
    except kfp_server_api.ApiException as error:
        raise UserError(_api_problem(host, error.status, error.body)) from None
    except urllib3.exceptions.HTTPError as error:
        raise UserError(
            f"Could not connect to {host} ({type(error).__name__}). Check the URL (the pipelines API route of "
            "the project, e.g. https://ds-pipeline-dspa-<project>.apps.<cluster>), the network, and --ca-cert for a "
            "self-signed certificate."
        ) from None


def _api_problem(host: str, status: int, body) -> str:
    if status in (401, 403):
        return (
            f"{host} refused the request (HTTP {status}): the bearer token is missing, expired or lacks access to the "
            f"project. Log in again (`oc login`, then `oc whoami -t`) and pass it with --token or ${TOKEN_ENV}."
        )
    if status == 404:
        return (
            f"{host} has no Kubeflow Pipelines v2 API (HTTP 404 on /apis/v2beta1). "
            "Check --host: it is the pipelines API route, not the dashboard."
        )
    detail = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    return f"{host} answered HTTP {status}: {one_line(detail, 500)}"


if __name__ == "__main__":
    sys.exit(main())
