"""The outcome of a GGUF verification, one ``VerificationReport`` per file, and its renderings.

``verify`` fills the reports; this module turns them into the Markdown the
pipeline shows (and ``verification.md``) and the JSON it keeps
(the ``verification.json`` record), without importing torch or llama.cpp.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from common.records import GgufVerification, VerifiedGguf

if TYPE_CHECKING:
    from gguf_export.convert import ConversionResult
    from gguf_export.options import Thresholds


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


@dataclass
class VerificationReport:
    """The outcome for one GGUF file."""

    gguf: str
    outtype: str
    passed: bool = True
    checks: list[Check] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, passed: bool, detail: str) -> None:
        self.checks.append(Check(name, bool(passed), detail))
        self.passed = self.passed and bool(passed)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def failures(self) -> list[str]:
        return [f"{check.name}: {check.detail}" for check in self.checks if not check.passed]


def markdown(reports: Sequence[VerificationReport]) -> str:
    """The reports as a Markdown section (the pipeline's Markdown artifact and verification.md)."""
    lines = ["# GGUF verification", ""]
    verdict = all(report.passed for report in reports)
    lines += [
        f"**{'PASSED' if verdict else 'FAILED'}**: {len(reports)} file(s) checked against transformers in llama.cpp.",
        "",
    ]
    for report in reports:
        lines += [f"## `{Path(report.gguf).name}` ({report.outtype}): {'passed' if report.passed else 'FAILED'}", ""]
        numbers = {
            k: v
            for k, v in report.metrics.items()
            if k in ("positions", "top1_agreement", "nmse", "nmse_max", "nmse_vs_merged", "top1_vs_merged")
        }
        if numbers:
            lines += ["| metric | value |", "| --- | --- |"]
            lines += [
                f"| {key} | {value:.4g} |" if isinstance(value, float) else f"| {key} | {value} |"
                for key, value in numbers.items()
            ]
            lines.append("")
        lines += ["| check | result | detail |", "| --- | --- | --- |"]
        lines += [
            f"| {c.name} | {'pass' if c.passed else '**FAIL**'} | {c.detail.replace('|', chr(92) + '|')} |"
            for c in report.checks
        ]
        if "reply" in report.metrics:
            how = (
                "ended its turn"
                if report.metrics["reply_stopped"]
                else f"did not end its turn within {report.metrics['reply_max_tokens']} tokens"
            )
            same = "same as" if report.metrics["reply_equals_transformers"] else "differs from"
            lines += [
                "",
                f"Free-running greedy chat reply in llama.cpp ({how}; {same} transformers'):",
                "",
                "```text",
                str(report.metrics["reply"]).replace("```", "'''"),
                "```",
            ]
        lines.append("")
    return "\n".join(lines)


def verification_record(
    reports: Sequence[VerificationReport],
    conversions: Sequence[ConversionResult],
    thresholds: Thresholds,
    modelfile: str | None = None,
) -> GgufVerification:
    """The reports as the record ``verification.json`` holds, with how each file was converted."""
    return GgufVerification(
        passed=all(report.passed for report in reports),
        files=tuple(VerifiedGguf(**report.as_json()) for report in reports),
        conversions=tuple(conversion.as_json() for conversion in conversions),
        thresholds=dict(vars(thresholds)),
        modelfile=modelfile,
    )
