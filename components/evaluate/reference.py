"""A reference-based score: how close each model's answer comes to the held-out answer.

Each scored row is a held-out conversation cut before its last assistant turn
(the question, with any system and earlier turns) and that turn's text (the
reference). ROUGE-L F-measure (longest common subsequence of stemmed words,
from Google's ``rouge-score`` package) rewards answers that say the same things
in the same order without requiring the exact wording, and is 0..1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rouge_score import rouge_scorer

from trainer.masking import Message


@dataclass(frozen=True)
class ReferenceRow:
    prompt: list[Message]
    reference: str


def reference_rows(conversations: Sequence[Sequence[Message]], limit: int) -> list[ReferenceRow]:
    """The first ``limit`` conversations that have a turn before their last assistant turn, split there."""
    rows = []
    for messages in conversations:
        last = max((index for index, message in enumerate(messages) if message["role"] == "assistant"), default=0)
        if last > 0:
            rows.append(
                ReferenceRow(prompt=[dict(message) for message in messages[:last]], reference=messages[last]["content"])
            )
        if len(rows) == limit:
            break
    return rows


def rouge_l(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Mean ROUGE-L F-measure of each prediction against its reference."""
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    scores = [
        scorer.score(reference, prediction)["rougeL"].fmeasure
        for prediction, reference in zip(predictions, references, strict=True)
    ]
    return sum(scores) / len(scores)
