"""Held-out loss and perplexity, computed the way training computes its loss.

Conversations come tokenised and masked by the tokenise step, with the trainer's
own code (``trainer.masking``: chat template, assistant-token masks), and are
truncated to the first ``max_length`` tokens as TRL does, and the loss is the cross-entropy of
each assistant token given everything before it. Unlike the Trainer's mean of
per-batch means, the mean here is over all assistant tokens of the split, so the
number does not depend on the batch size or on how conversations are grouped;
that is what makes the base and fine-tuned numbers comparable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from common.errors import UserError
from common.run_layout import EVAL_CONVERSATIONS
from trainer.masking import TokenisedConversation
from trainer.token_cache import open_rows


@dataclass(frozen=True)
class HeldOutLoss:
    eval_loss: float
    perplexity: float
    eval_tokens: int


def usable_conversations(tokens_dir: Path, max_length: int) -> list[TokenisedConversation]:
    """The eval conversations the tokenise step wrote (capped by its eval_max_rows), truncated, keeping those with
    an assistant token left to predict.

    The first token is never predicted (nothing precedes it), so a
    conversation whose only assistant tokens were cut off, or sit at position 0,
    carries no loss, as in TRL, which drops such rows.
    """
    rows = open_rows(tokens_dir, EVAL_CONVERSATIONS)
    conversations = [
        TokenisedConversation(ids[:max_length], masks[:max_length])
        for ids, masks in zip(rows["input_ids"], rows["assistant_masks"])
    ]
    usable = [conversation for conversation in conversations if any(conversation.assistant_masks[1:])]
    if usable:
        return usable
    if not conversations:
        raise UserError(
            f"{tokens_dir / EVAL_CONVERSATIONS} has no rows: the data stage held no rows out, so there is nothing to "
            "compare the base and fine-tuned models on. Re-run the data preparation stage with an eval_fraction "
            "above 0 (for example 0.1; --eval-fraction on the command line) so it holds rows out for evaluation, "
            "then the tokenise step."
        )
    raise UserError(
        f"none of the {len(conversations)} eval conversations in {tokens_dir} has an assistant token within the "
        f"first {max_length} tokens, so no loss can be computed. Raise max_length (--max-length; 0 uses the "
        "training run's) or shorten the conversations' system and user turns."
    )


def _padded_batch(
    batch: Sequence[TokenisedConversation], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """Right-padded ids, attention mask and assistant mask; padding sits after the tokens, so causal attention
    never sees it.
    """
    width = max(len(conversation.input_ids) for conversation in batch)
    ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    assistant = torch.zeros((len(batch), width), dtype=torch.bool)
    for row, conversation in enumerate(batch):
        length = len(conversation.input_ids)
        ids[row, :length] = torch.tensor(conversation.input_ids)
        attention[row, :length] = 1
        assistant[row, :length] = torch.tensor(conversation.assistant_masks, dtype=torch.bool)
    return ids.to(device), attention.to(device), assistant.to(device)


@torch.inference_mode()
def held_out_loss(
    model: PreTrainedModel,
    conversations: Sequence[TokenisedConversation],
    pad_token_id: int,
    batch_size: int,
) -> HeldOutLoss:
    """Mean cross-entropy over every assistant token of ``conversations``, and its exponential."""
    # Longest first, so each batch holds similar lengths and a too-large batch fails at once.
    ordered = sorted(conversations, key=lambda conversation: len(conversation.input_ids), reverse=True)
    total_nll, total_tokens = 0.0, 0
    for start in range(0, len(ordered), batch_size):
        ids, attention, assistant = _padded_batch(ordered[start : start + batch_size], pad_token_id, model.device)
        logits = model(input_ids=ids, attention_mask=attention).logits
        predicted = assistant[:, 1:]  # position t predicts token t + 1
        total_nll += F.cross_entropy(logits[:, :-1][predicted].float(), ids[:, 1:][predicted], reduction="sum").item()
        total_tokens += int(predicted.sum())
    loss = total_nll / total_tokens
    return HeldOutLoss(eval_loss=loss, perplexity=math.exp(loss), eval_tokens=total_tokens)
