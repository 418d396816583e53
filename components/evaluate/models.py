"""Loading the two models one at a time, on the GPU when there is one.

Both models of a comparison never sit in memory together: a 3B model in bf16
takes 6 GB, and the evaluation pod is sized for one. Each is loaded, used for
everything it has to do inside one function, and freed when that returns.
"""

from __future__ import annotations

import gc
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from common.errors import UserError
from trainer.precision import native_bf16


def device_and_dtype() -> tuple[torch.device, torch.dtype]:
    """The first CUDA device in bf16 (fp16 where the GPU has no native bf16), else the CPU in fp32."""
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16 if native_bf16() else torch.float16
    return torch.device("cpu"), torch.float32


def check_fine_tuned_dir(path: Path) -> None:
    """A clear error when the fine-tuned checkpoint is not the training stage's merged/ directory."""
    if not (path / "config.json").is_file():
        raise UserError(
            f"{path} is not a model checkpoint (no config.json). The fine-tuned model must be the merged/ directory "
            "that the training stage (python -m trainer --output-dir DIR) writes into DIR; check that training "
            "finished."
        )


def load_tokenizer(name_or_path: str | Path, revision: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer with a pad token (its EOS when it has none), since prompts and conversations are batched.

    ``revision``: the Hub commit to read (the one training used), for a Hub id.
    """
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, revision=revision)
    except OSError as error:
        raise UserError(
            f"cannot load the tokenizer of {name_or_path}: {error}. "
            "Pass a local checkpoint directory or a Hub id this machine can reach."
        ) from None
    if tokenizer.chat_template is None:
        raise UserError(
            f"the tokenizer of {name_or_path} has no chat template; "
            "evaluation renders conversations with it, as training did."
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_same_vocabulary(base: PreTrainedTokenizerBase, fine_tuned: PreTrainedTokenizerBase, base_name: str) -> None:
    """Losses over the same token ids are comparable only when both models read them the same way."""
    if base.get_vocab() != fine_tuned.get_vocab():
        raise UserError(
            f"the base model {base_name} has a different vocabulary from the fine-tuned model, so their losses "
            "cannot be compared. "
            "Pass the base model the run was trained from (training_summary.json, config.model)."
        )


def load_model(name_or_path: str | Path, revision: str | None = None) -> PreTrainedModel:
    """The model in eval mode on the best device. Callers keep it in a local only, then call ``release_memory``."""
    device, dtype = device_and_dtype()
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, revision=revision)
    except OSError as error:
        raise UserError(
            f"cannot load the model {name_or_path}: {error}. "
            "Pass a local checkpoint directory or a Hub id this machine can reach."
        ) from None
    return model.to(device).eval()


def parameter_count(path: Path) -> int:
    """The parameters of the checkpoint at ``path``, counted on the meta device from its config alone (no weights
    are read)."""
    from transformers import AutoConfig

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return sum(parameter.numel() for parameter in model.parameters())


def release_memory() -> None:
    """Return a freed model's memory (module reference cycles included) before the next one loads."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
