"""Compile the pipeline to the YAML you upload to OpenShift AI / Kubeflow Pipelines.

    python -m pipelines.compile                 # writes compiled/fine_tune_pipeline.yaml
    python -m pipelines.compile --check         # exit 1 if that file is stale
    python -m pipelines.compile --image REGISTRY/IMAGE:TAG --output my.yaml

The KFP SDK that compiles it is the one pyproject.toml pins (kfp 2.17, which the
YAML records). The YAML needs a Kubeflow Pipelines 2.15 or newer backend; on
OpenShift AI, 3.0 or newer: ``pipelines/backend_versions.py`` names the feature
that sets the minimum, and docs/getting-started/openshift-ai.md says why.
"""

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

from common.atomic import write_text_atomic
from components.runtime_image import IMAGE_ENV_VAR

DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "compiled" / "fine_tune_pipeline.yaml"
SDK_VERSION = re.compile(r"^sdkVersion: (\S+)$", flags=re.MULTILINE)  # the KFP SDK that compiled a pipeline YAML


def compile_to(path: Path) -> None:
    # Imported here so that --image, applied to the environment first, reaches
    # every @dsl.component decorator when the modules are imported.
    from kfp import compiler

    from pipelines.fine_tune import fine_tune_pipeline

    compiler.Compiler().compile(fine_tune_pipeline, str(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.compile", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the YAML (default: %(default)s)"
    )
    parser.add_argument(
        "--image", help=f"runtime image for every step (default: ${IMAGE_ENV_VAR} or the project's image)"
    )
    parser.add_argument("--check", action="store_true", help="compile to a temporary file and fail if --output differs")
    args = parser.parse_args(argv)
    if args.image:
        os.environ[IMAGE_ENV_VAR] = args.image
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch) / "pipeline.yaml"
        compile_to(fresh)
        if args.check:
            if not args.output.exists() or args.output.read_text() != fresh.read_text():
                print(stale_message(args.output, fresh.read_text()), file=sys.stderr)
                return 1
            print(f"{args.output} is up to date")
            return 0
        write_text_atomic(args.output, fresh.read_text())
    print(f"wrote {args.output}")
    return 0


def stale_message(committed: Path, fresh: str) -> str:
    """Why ``committed`` differs from a fresh compile, and the fix. A different KFP SDK writes its own version
    into the YAML, so a committed file compiled with another kfp than this environment's is named as such: the
    fix is then the environment (the lock's kfp), not the pipeline."""
    stale = f"{committed} is stale: run `python -m pipelines.compile` and commit the result."
    ours = SDK_VERSION.search(fresh)
    theirs = SDK_VERSION.search(committed.read_text()) if committed.exists() else None
    if not ours or not theirs or ours[1] == theirs[1]:
        return stale
    return (
        f"{committed} was compiled with {theirs[1]} and this environment has {ours[1]}. If this environment is not "
        "the locked one, `make install` installs the lock's kfp; if the lock moved to a new kfp, "
        f"the YAML is stale: run `python -m pipelines.compile` and commit the result."
    )


if __name__ == "__main__":
    sys.exit(main())
