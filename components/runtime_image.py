"""The one runtime image every component and training pod runs in.

Set once here; override with the ``LLM_FT_IMAGE`` environment variable or with
``python -m pipelines.compile --image``. It is read when the component modules
are imported, because ``@dsl.component`` records ``base_image`` at decoration
time.
"""

import os

IMAGE_ENV_VAR = "LLM_FT_IMAGE"
DEFAULT_IMAGE = "quay.io/llm-finetune-pipeline/runtime:0.1.0"


def runtime_image() -> str:
    """The image reference components are compiled against."""
    return os.environ.get(IMAGE_ENV_VAR, "").strip() or DEFAULT_IMAGE
