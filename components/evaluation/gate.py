"""The quality gate: is the fine-tuned model better enough than its base to export and publish?

The held-out loss is the gate's measure because it is computed on every
assistant token of the split, the same way for both models, and so is the most
stable signal a run has; the ROUGE-L score on a few generated answers is shown
beside it but is too noisy to decide on. A failed gate is an outcome, not an
error: the evaluation step succeeds and reports why, and the pipeline skips the
steps after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GateDecision:
    passed: bool
    min_eval_loss_improvement: float
    reason: str


def decide(base_eval_loss: float, fine_tuned_eval_loss: float, min_eval_loss_improvement: float) -> GateDecision:
    """Passed when ``base_eval_loss - fine_tuned_eval_loss >= min_eval_loss_improvement``; the reason gives
    the numbers.
    """
    improvement = base_eval_loss - fine_tuned_eval_loss
    losses = f"(base {base_eval_loss:.4f}, fine-tuned {fine_tuned_eval_loss:.4f})"
    required = f"the required minimum improvement of {min_eval_loss_improvement:.4f}"
    if not math.isfinite(improvement):
        return GateDecision(
            False,
            min_eval_loss_improvement,
            f"The eval loss is not a finite number {losses}, so the fine-tuned model cannot be shown to meet "
            f"{required}.",
        )
    passed = improvement >= min_eval_loss_improvement
    change = f"improved by {improvement:.4f}" if improvement >= 0 else f"got worse by {-improvement:.4f}"
    verdict = "which meets" if passed else "which falls short of"
    return GateDecision(passed, min_eval_loss_improvement, f"The eval loss {change} {losses}, {verdict} {required}.")
