"""The quality gate: is the new model better enough to export and publish?

Two comparisons, both on the held-out loss of the current split:

- against the base model (``min_eval_loss_improvement``): did fine-tuning help at all?
- against the published model, when there is one (``min_improvement_over_published``):
  is the new model better than the one users already have? A scheduled retrain
  must win this one too, so it never replaces a model with a worse one.

The held-out loss is the measure because it is computed on every assistant
token of the split, the same way for every model, and so is the most stable
signal a run has; ROUGE-L on a few generated answers is shown beside it but is
too noisy to decide on. ``force`` overrides the second comparison only (a user
who changed the data or the training on purpose may replace the published model),
never the first: a fine-tune worse than its base is never published. A failed
gate is an outcome, not an error: the evaluation step succeeds and says which
comparison failed and by how much, and the pipeline skips the steps after it.

Standard benchmarks (``benchmarks``) add one comparison per task and reference
model: the new model's main metric may fall at most ``max_benchmark_drop`` below
the base's and the published model's, so a fine-tune that wins on its own data by
forgetting general ability does not pass. The same ``force`` rule holds for them.

Under objective dpo the two comparisons measure the held-out reward accuracy instead
(``min_reward_accuracy_improvement``; components/evaluate/preferences.py): the share of
held-out pairs whose chosen answer the model prefers, against the base it was tuned from. The
base is its own reference, so it scores chance (0.5), and a published model is scored against
the same base. DPO moves log-probabilities of whole answers apart, and may raise the loss on
the chosen answers while it does, so the loss is shown but does not decide there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

FORCED_PAST_PUBLISHED = "force is set, so the new model is published although it does not beat the published model."
FORCED_WITHOUT_PUBLISHED = "force is set, so the new model is published without that comparison."
FORCE_NOT_PAST_BASE = "force does not override the comparison with the base model."
# The stages a failed gate skips, as the step's log and the pipeline's skip notice name them.
GATED_STAGES = "export, publish, store, register and serve"


# An improvement (or a benchmark drop) this close to its bound meets it: accuracies are counts over the pairs or
# questions, and 12 of 20 less chance is 0.09999999999999998 in floating point, which must meet a minimum of 0.1,
# as a drop from 20 to 14 of 40 questions (0.15000000000000002) must stay within a max_benchmark_drop of 0.15.
EQUAL_AS_WRITTEN = 1e-9


@dataclass(frozen=True)
class Measure:
    """What the gate compares the models on, and which way is better."""

    name: str  # as its reasons say it
    higher_is_better: bool
    digits: int = 4


EVAL_LOSS = Measure("eval loss", higher_is_better=False)
REWARD_ACCURACY = Measure("held-out reward accuracy", higher_is_better=True)


@dataclass(frozen=True)
class Comparison:
    """One of the gate's comparisons: the new model's held-out loss (or reward accuracy), or one benchmark score,
    against a reference model's."""

    against: str  # "base" or "published"
    passed: bool
    reason: str  # one sentence with the numbers
    benchmark: str = ""  # the benchmark task compared; empty for the held-out measure


@dataclass(frozen=True)
class GateDecision:
    passed: bool
    minimum: float  # the improvement required over the base
    reason: str
    comparisons: tuple[Comparison, ...] = ()
    forced: bool = False  # passed only because force overrode the comparison with the published model
    measure: Measure = EVAL_LOSS


def compare(
    against: str, reference: float, new: float, minimum: float, names: tuple[str, str], measure: Measure
) -> Comparison:
    """Passed when ``new`` improves on ``reference`` by at least ``minimum`` in ``measure``'s better direction;
    ``names`` label the two numbers in the reason."""
    improvement = new - reference if measure.higher_is_better else reference - new
    numbers = f"({names[0]} {reference:.{measure.digits}f}, {names[1]} {new:.{measure.digits}f})"
    required = f"the required minimum improvement of {minimum:.{measure.digits}f}"
    if not math.isfinite(improvement):
        return Comparison(
            against,
            False,
            f"The {measure.name} is not a finite number {numbers}, so the {names[1]} model cannot be shown to meet "
            f"{required}.",
        )
    passed = improvement >= minimum - EQUAL_AS_WRITTEN
    change = (
        f"improved by {improvement:.{measure.digits}f}"
        if improvement >= 0
        else f"got worse by {-improvement:.{measure.digits}f}"
    )
    verdict = "which meets" if passed else "which falls short of"
    return Comparison(against, passed, f"The {measure.name} {change} {numbers}, {verdict} {required}.")


def decide(base_value: float, fine_tuned_value: float, minimum: float, measure: Measure = EVAL_LOSS) -> GateDecision:
    """The gate without a published model: the base-model comparison alone."""
    base = compare("base", base_value, fine_tuned_value, minimum, ("base", "fine-tuned"), measure)
    return GateDecision(base.passed, minimum, base.reason, (base,), measure=measure)


def decide_with_published(
    base_value: float,
    fine_tuned_value: float,
    minimum: float,
    published_value: float,
    min_improvement_over_published: float,
    published_name: str,
    force: bool,
    measure: Measure = EVAL_LOSS,
) -> GateDecision:
    """Both comparisons; ``published_name`` says which published model (e.g. "the model of run X")."""
    base = compare("base", base_value, fine_tuned_value, minimum, ("base", "new"), measure)
    published = compare(
        "published", published_value, fine_tuned_value, min_improvement_over_published, ("published", "new"), measure
    )
    forced = force and base.passed and not published.passed
    reason = f"Against the base model: {base.reason} Against the published model ({published_name}): {published.reason}"
    if forced:
        reason += " " + FORCED_PAST_PUBLISHED
    elif force and not base.passed:
        reason += " " + FORCE_NOT_PAST_BASE
    return GateDecision(
        base.passed and (published.passed or force), minimum, reason, (base, published), forced, measure
    )


def decide_without_published(
    base_value: float, fine_tuned_value: float, minimum: float, problem: str, measure: Measure = EVAL_LOSS
) -> GateDecision:
    """A forced run whose published model could not be compared (``problem`` says why): the base comparison alone,
    and the reason says so."""
    base = decide(base_value, fine_tuned_value, minimum, measure)
    reason = (
        f"Against the base model: {base.reason} The published model could not be compared ({problem}); "
        f"{FORCED_WITHOUT_PUBLISHED}"
        if base.passed
        else base.reason
    )
    return GateDecision(base.passed, minimum, reason, base.comparisons, forced=base.passed, measure=measure)


def benchmark_comparisons(scores: dict[str, dict[str, dict[str, Any]]], max_drop: float) -> tuple[Comparison, ...]:
    """Each task's main metric, the new model's against the base's and (when it was scored) the published one's.

    ``scores``: role ("base", "published", "fine_tuned") -> task -> entry (``benchmarks.main_metric``). A drop is
    counted in the direction the metric is better in; more than ``max_drop`` fails.
    """
    comparisons = []
    for against in ("base", "published"):
        for task, reference in scores.get(against, {}).items():
            new = scores["fine_tuned"][task]
            drop = reference["value"] - new["value"] if new["higher_is_better"] else new["value"] - reference["value"]
            passed = math.isfinite(drop) and drop <= max_drop + EQUAL_AS_WRITTEN
            change = (
                "is not a finite number"
                if not math.isfinite(drop)
                else f"fell by {drop:.4f}"
                if drop > 0
                else f"rose by {-drop:.4f}"
                if drop < 0
                else "did not change"
            )
            verdict = "within" if passed else "more than"
            comparisons.append(
                Comparison(
                    against,
                    passed,
                    f"{task} {new['metric']} {change} against the {against} model ({against} {reference['value']:.4f}, "
                    f"new {new['value']:.4f}), {verdict} max_benchmark_drop {max_drop:.4f}.",
                    benchmark=task,
                )
            )
    return tuple(comparisons)


def with_benchmarks(decision: GateDecision, benchmarks: tuple[Comparison, ...], force: bool) -> GateDecision:
    """The loss gate's ``decision`` joined with the benchmark comparisons: all must pass, the published ones or
    ``force``, which never overrides a comparison with the base model."""
    if not benchmarks:
        return decision
    comparisons = decision.comparisons + benchmarks
    base_passed = all(comparison.passed for comparison in comparisons if comparison.against == "base")
    published_passed = all(comparison.passed for comparison in comparisons if comparison.against == "published")
    passed = base_passed and (published_passed or force)
    failed = [comparison.reason for comparison in benchmarks if not comparison.passed]
    loss_reason = decision.reason
    if not passed:  # a loss decision forced past the published model is not published after all
        for sentence, ending in ((" " + FORCED_PAST_PUBLISHED, ""), ("; " + FORCED_WITHOUT_PUBLISHED, ".")):
            if loss_reason.endswith(sentence):
                loss_reason = loss_reason.removesuffix(sentence) + ending
    reason = f"{loss_reason} Benchmarks: " + " ".join(failed or [comparison.reason for comparison in benchmarks])
    benchmark_forced = force and base_passed and not all(c.passed for c in benchmarks if c.against == "published")
    if benchmark_forced and not decision.forced:
        reason += " force is set, so the new model is published although it falls behind the published model."
    elif force and not base_passed and FORCE_NOT_PAST_BASE not in reason:
        reason += " " + FORCE_NOT_PAST_BASE
    return GateDecision(
        passed,
        decision.minimum,
        reason,
        comparisons,
        passed and (decision.forced or benchmark_forced),
        decision.measure,
    )
