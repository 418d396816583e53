"""Which base model a run fine-tunes (and evaluates against) when the run form leaves it empty.

Local runs use SmolLM2-135M-Instruct, materialised from a PyPI package so they
need no model hub; cluster runs use ``CLUSTER_BASE_MODEL`` from the Hub. The
tokenise step, the train step and the training job's ``render`` all call
``resolve_base_model``, so the token cache, the trained model and the job
agree on what "the base model" was; the evaluate step takes the one the train
step resolved (its ``base_model`` output).
"""

from __future__ import annotations

from components.local_model import CLUSTER_BASE_MODEL, local_base_model

LOCAL_BACKEND = "local"


def resolve_base_model(base_model: str, backend: str) -> str:
    """``base_model`` when given, else the local checkpoint directory (backend ``local``) or the cluster default."""
    base_model = base_model.strip()
    if base_model:
        return base_model
    return str(local_base_model()) if backend == LOCAL_BACKEND else CLUSTER_BASE_MODEL
