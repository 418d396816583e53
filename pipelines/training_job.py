"""Show the training job a run would create, without a cluster.

    python -m pipelines.training_job render --param training_nodes=4 --param gpus_per_node=8 \\
        --param queue_name=team-a --namespace ml-team > job.yaml

prints, as YAML, the PyTorchJob or TrainJob the pipeline's train step creates
for those run parameters: the pipeline's parameter names and defaults, checked
by the same validation as the pipeline's first step (a bad value exits 2 with
one paragraph naming it). The manifest comes from the function the train step
itself calls (``components.train.stage.render_job``). Review it before a run,
diff it between two parameter sets, or attach it to a support request.

Five things only a run knows are filled in with what the options here say: the
run id (which names the job), the namespace, the workspace PVC (a created one is
named per run), the token-cache entry (named by the data) and the ownerReference
to the run's Argo Workflow, which the train step adds. The YAML's leading comment says which values stand in.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common.errors import UserError, exit_on_user_error
from common.kube import default_namespace
from common.run_layout import CLUSTER_WORKSPACE, TOKEN_CACHE, stage_dir
from components.default_base_model import LOCAL_BACKEND, resolve_base_model
from components.run_form.command_line import checked_overrides
from components.run_form.table import PIPELINE_NAME, RUN_PARAMETERS, arguments_for
from components.runtime_image import runtime_image
from components.train.fit import check_fit
from components.train.kinds import KINDS
from components.train.manifests import to_yaml
from components.train.options import LaunchOptions
from components.train.stage import render_job
from trainer.config import TrainConfig

EXAMPLE_RUN_ID = "example-run"
CREATED_PVC = "<created-per-run>-llm-finetune-workspace"
TOKENS_KEY = "<key-of-the-tokenised-data>"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines.training_job", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    render = commands.add_parser(
        "render", help="print the PyTorchJob/TrainJob manifest the train step would create, as YAML"
    )
    render.add_argument(
        "--param", action="append", default=[], metavar="NAME=VALUE", help="set a pipeline run parameter (repeatable)"
    )
    render.add_argument(
        "--namespace", help="the run's namespace (default: the current kubeconfig context's, else 'default')"
    )
    render.add_argument(
        "--run-id", default=EXAMPLE_RUN_ID, help="the run's id, which names the job (default: %(default)s)"
    )
    render.add_argument("--image", default=runtime_image(), help="the runtime image (default: %(default)s)")
    return parser


def run_values(pairs: list[str]) -> dict:
    """Every run parameter's value: the pipeline's defaults overridden by ``pairs``, validated as a run is."""
    declared = {parameter.name: parameter.kfp_type for parameter in RUN_PARAMETERS}
    defaults = {parameter.name: parameter.default for parameter in RUN_PARAMETERS}
    return defaults | checked_overrides(pairs, declared, defaults)


def render(pairs: list[str], *, namespace: str, run_id: str, image: str) -> str:
    """The YAML the train step would create for run parameters ``pairs``, with a comment naming the stand-ins."""
    values = run_values(pairs)
    launch = LaunchOptions(**arguments_for(LaunchOptions, values))
    if launch.backend == LOCAL_BACKEND:
        raise UserError(
            "training_backend is local: that runs torchrun on this machine (python -m pipelines.run) and creates "
            f"no Kubernetes job, so there is nothing to render. Use one of {', '.join(KINDS)}."
        )
    config = TrainConfig(
        model=resolve_base_model(values["base_model"], launch.backend),
        tokens_dir=Path(CLUSTER_WORKSPACE) / TOKEN_CACHE / TOKENS_KEY,
        output_dir=stage_dir(CLUSTER_WORKSPACE, run_id, "train"),
        **arguments_for(TrainConfig, values),
    )
    pvc_name = values["pvc_name"] or CREATED_PVC
    manifest = render_job(
        config,
        launch,
        namespace=namespace,
        run_id=run_id,
        pipeline_name=PIPELINE_NAME,
        pvc_name=pvc_name,
        mount_path=CLUSTER_WORKSPACE,
        image=image,
    )
    header = (
        f"# The {manifest['kind']} the train step creates for these run parameters "
        "(python -m pipelines.training_job render).\n"
        f"# Stand-ins for what only a run knows: run id {run_id!r} (it names the job), namespace {namespace!r}, "
        f"workspace PVC {pvc_name!r}, token-cache entry {TOKENS_KEY!r} (named by the data the tokenise step read).\n"
        "# A run also adds an ownerReference to its Argo Workflow, so deleting the run deletes the job.\n"
        + "".join(
            f"# {line}\n"
            for line in check_fit(config, launch.nodes, launch.gpus_per_node, launch.gpu_memory, values["pvc_size"])
        )
    )
    return header + to_yaml(manifest)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    namespace = args.namespace or default_namespace()
    sys.stdout.write(render(args.param, namespace=namespace, run_id=args.run_id, image=args.image))
    return 0


if __name__ == "__main__":
    sys.exit(main())
