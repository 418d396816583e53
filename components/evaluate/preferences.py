"""Held-out preference pairs scored the way DPO trains on them: each answer's log-probability given its prompt,
and the implicit reward of a model against the reference it was tuned from.

A model M's implicit reward of an answer y to a prompt x is beta * (log p_M(y|x) - log p_ref(y|x)), with the base
model as the reference, as in training (TRL's DPOTrainer). Its reward accuracy is the share of pairs whose chosen
answer gets the higher reward, a tie counting half, its margin the mean difference. TRL's metric counts a tie as
wrong; the two differ only on exact ties, and there the half is what makes the base, its own reference (every
reward 0), score chance, 0.5: the line a tuned model must clear. Answers are cut as TRL cuts them: prompt and
answer kept from the start, up to max_length tokens.

The loss on the chosen answers' tokens (the SFT loss of the answers the data prefers) is reported beside it, as
the held-out loss is under sft: DPO may raise it while it moves the two answers apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from common.errors import UserError
from common.run_layout import EVAL_ROWS
from trainer.token_cache import open_rows


@dataclass(frozen=True)
class PairLogProbs:
    """Per held-out pair, the summed log-probability of each answer's tokens given the prompt, and how many of the
    chosen answer's tokens were scored."""

    chosen: np.ndarray
    rejected: np.ndarray
    chosen_tokens: np.ndarray

    @property
    def chosen_loss(self) -> float:
        """The mean cross-entropy over every chosen answer's tokens."""
        return float(-self.chosen.sum() / self.chosen_tokens.sum())


@dataclass(frozen=True)
class PreferenceScores:
    """One model's preferences on the held-out pairs, against the reference."""

    reward_accuracy: float  # share of pairs whose chosen answer has the higher implicit reward, a tie counting half
    mean_margin: float  # mean of chosen's minus rejected's implicit reward
    chosen_log_prob: float  # mean log-probability of the chosen answers
    rejected_log_prob: float
    pairs: int


def usable_pairs(tokens_dir: Path, max_length: int) -> dict[str, list[list[int]]]:
    """The held-out pairs' token rows the tokenise step wrote (capped by its eval_max_rows) whose prompt leaves an
    answer token within ``max_length``: the tokenise step dropped the others at its own max_length, and a shorter
    one here drops more (such a pair would score a tie for every model and pull each towards chance)."""
    rows = open_rows(tokens_dir, EVAL_ROWS)
    keep = [number for number, prompt in enumerate(rows["prompt_ids"]) if len(prompt) < max_length]
    if not keep:
        raise UserError(
            f"{tokens_dir / EVAL_ROWS} has no preference pair whose prompt is shorter than max_length {max_length} "
            "tokens: the data stage held none out, or every held-out prompt fills max_length, so there is nothing "
            "to compare the models' preferences on. Re-run the data step with an eval_fraction above 0 (for "
            "example 0.1), or raise max_length (--max-length; 0 uses the training run's), then the tokenise step."
        )
    kept = rows.select(keep)
    return {name: kept[name] for name in ("prompt_ids", "chosen_ids", "rejected_ids")}


def _answer_log_prob(
    model: PreTrainedModel, prompt: Sequence[int], answer: Sequence[int], max_length: int
) -> tuple[float, int]:
    """The summed log-probability of ``answer``'s tokens after ``prompt``, and how many were scored."""
    ids = [*prompt, *answer][:max_length]
    if len(ids) <= len(prompt):
        return 0.0, 0  # the prompt fills max_length: no answer token is scored (usable_pairs drops such pairs)
    tokens = torch.tensor([ids], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=tokens).logits[0, :-1].float()
    per_token = F.log_softmax(logits, dim=-1).gather(1, tokens[0, 1:, None])[:, 0]
    return float(per_token[len(prompt) - 1 :].sum()), len(ids) - len(prompt)


def pair_log_probs(model: PreTrainedModel, rows: Any, max_length: int) -> PairLogProbs:
    """``model``'s log-probabilities of each pair's answers (``rows``: the tokenise step's pair rows)."""
    model.eval()
    chosen, rejected, chosen_tokens = [], [], []
    for prompt, chosen_ids, rejected_ids in zip(rows["prompt_ids"], rows["chosen_ids"], rows["rejected_ids"]):
        log_prob, tokens = _answer_log_prob(model, prompt, chosen_ids, max_length)
        chosen.append(log_prob)
        chosen_tokens.append(tokens)
        rejected.append(_answer_log_prob(model, prompt, rejected_ids, max_length)[0])
    return PairLogProbs(np.asarray(chosen), np.asarray(rejected), np.asarray(chosen_tokens))


def preference_scores(model: PairLogProbs, reference: PairLogProbs, beta: float) -> PreferenceScores:
    """``model``'s reward accuracy and margin against ``reference`` (the base), and its mean log-probabilities."""
    chosen_rewards = beta * (model.chosen - reference.chosen)
    rejected_rewards = beta * (model.rejected - reference.rejected)
    wins = np.mean(chosen_rewards > rejected_rewards) + 0.5 * np.mean(chosen_rewards == rejected_rewards)
    return PreferenceScores(
        reward_accuracy=float(wins),
        mean_margin=float(np.mean(chosen_rewards - rejected_rewards)),
        chosen_log_prob=float(np.mean(model.chosen)),
        rejected_log_prob=float(np.mean(model.rejected)),
        pairs=len(model.chosen),
    )
