"""Check a recurring run's cron expression the way the KFP scheduler will read it, before submitting.

KFP's ScheduledWorkflow controller parses schedules with robfig/cron: six fields,
**seconds first** (``second minute hour day-of-month month day-of-week``), or a
descriptor such as ``@daily`` or ``@every 6h``. Its parser also accepts five
fields, reading them as seconds..months with no day-of-week, so the usual Unix
``0 3 * * 1`` would silently run every hour of January. A five-field expression is
therefore refused here with the six-field version to use instead.
"""

from __future__ import annotations

import re

from common.errors import UserError

FIELDS = (  # name, lowest, highest, names accepted instead of numbers
    ("second", 0, 59, ()),
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")),
    ("day of week", 0, 6, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")),
)
DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
GO_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")
EXAMPLE = "'0 0 3 * * *' (every day at 03:00) or '0 30 2 * * 1' (Mondays at 02:30)"


def validate_cron(expression: str) -> str:
    """The expression, stripped, if KFP's scheduler accepts it; else a ``UserError`` saying how to write it."""
    text = " ".join(expression.split())
    if text.startswith("@"):
        if text in DESCRIPTORS or (text.startswith("@every ") and GO_DURATION.match(text[len("@every ") :])):
            return text
        raise UserError(
            f"--schedule {expression!r} is not a known descriptor; use one of {', '.join(DESCRIPTORS)}, "
            f"'@every 6h', or six fields such as {EXAMPLE}."
        )
    fields = text.split(" ") if text else []
    if len(fields) == 5:
        raise UserError(
            f"--schedule {expression!r} has five fields, but KFP reads six with seconds first, "
            f"so it would mean something else. Put the seconds in front: '0 {text}'. Examples: {EXAMPLE}."
        )
    if len(fields) != 6:
        raise UserError(
            f"--schedule {expression!r} has {len(fields)} fields; KFP takes six, seconds first "
            f"(second minute hour day-of-month month day-of-week), e.g. {EXAMPLE}."
        )
    for value, (name, low, high, names) in zip(fields, FIELDS):
        problem = _field_problem(value.lower(), low, high, names)
        if problem:
            raise UserError(f"--schedule {expression!r}: the {name} field {value!r} {problem}. Example: {EXAMPLE}.")
    return text


def _field_problem(field: str, low: int, high: int, names: tuple[str, ...]) -> str | None:
    for part in field.split(","):
        span, _, step = part.partition("/")
        if step and not (step.isdigit() and int(step) > 0):
            return f"has the step {step!r}; a step is a positive whole number"
        if span in ("*", "?"):
            continue
        start, _, end = span.partition("-")
        bounds = [_value(start, low, names), _value(end, low, names) if end else None]
        if bounds[0] is None or (end and bounds[1] is None):
            return (
                f"is not a number from {low} to {high}"
                + (f" or a name like {names[0].upper()}" if names else "")
                + " (or *, ?, a-b, a/step, lists with ',')"
            )
        if not low <= bounds[0] <= high or (bounds[1] is not None and not low <= bounds[1] <= high):
            return f"is outside {low}-{high}"
        if bounds[1] is not None and bounds[1] < bounds[0]:
            return "is a range that ends before it starts"
    return None


def _value(text: str, low: int, names: tuple[str, ...]) -> int | None:
    """A number, or a month/weekday name counted from the field's lowest value (JAN is 1, SUN is 0)."""
    if text.isdigit():
        return int(text)
    if text in names:
        return names.index(text) + low
    return None
