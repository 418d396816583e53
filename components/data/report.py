"""What went into the training data, source by source: the data step's report and the model card's table.

One table, rendered from ``stats.json`` alone, so the data step's report (``data/report.md``, the step's
Markdown artifact in the pipelines UI) and the model card say the same: for each source the version its server
named and its content's digest, and for a mixture (``dataset_sources``) what the checks, the duplicates and the
weights made of it.
"""

from __future__ import annotations

from common.records import DataStats, Overlap, SourceLineage, SourceStats, SourceTokens

LINEAGE_HEADERS = ("source", "version read", "content")
MIXTURE_HEADERS = (
    "weight",
    "training rows of available (share)",
    "eval rows",
    "records",
    "rejected",
    "duplicates (own / earlier sources')",
)
TOKEN_HEADERS = ("training tokens", "with loss (share)")


def data_report(stats: DataStats) -> str:
    """``data/report.md``: the counts, then each source."""
    kind = "preference pairs" if stats.kind == "preference pairs" else "conversations"
    lines = [
        "# Training data",
        "",
        f"{stats.records:,} records read: {stats.train_rows:,} training and {stats.eval_rows:,} eval {kind} "
        f"written, {stats.rejected:,} rejected (listed with their reasons in rejects.jsonl), {stats.duplicates:,} "
        f"duplicates dropped. Fingerprint `{stats.fingerprint}`.",
    ]
    table = source_table(stats)
    if table:
        lines += ["", "## Sources", "", table]
    if stats.contamination:
        lines += ["", "## Overlap with held-out text", "", CHECK, ""] + overlap_lines(stats.contamination)
    return "\n".join(lines) + "\n"


CHECK = (
    "A training row overlaps when it shares a 13-word sequence with the held-out text (lm-eval's decontamination: "
    "ASCII letters lowercased, ASCII punctuation removed, words split on whitespace). A conversation's text is all "
    "its messages; a preference pair's, its prompt and chosen answer; a benchmark document's, its question and "
    "correct answer (a document of fewer than 13 words cannot be found, and is not counted)."
)


def overlap_lines(overlaps: tuple[Overlap, ...]) -> list[str]:
    """One item per source and what it was checked against, with the overlapping rows quoted."""
    lines = []
    for overlap in overlaps:
        against = overlap.against if overlap.share is None else f"benchmark task {overlap.against}"
        if overlap.documents == 0:
            lines.append(
                f"- `{overlap.source}`: not checked against the {against}, none of whose documents has 13 words."
            )
            continue
        if not overlap.rows:
            lines.append(f"- `{overlap.source}`: none of its training rows overlaps the {against}.")
            continue
        if overlap.share is None:
            fate = "dropped (decontaminate)" if overlap.dropped else "kept (decontaminate is false)"
        else:
            fate = f"{overlap.documents_hit:,} of its {overlap.documents:,} documents ({overlap.share:.1%})"
        lines.append(
            f"- `{overlap.source}`: {overlap.rows:,} of its training rows overlap the {against}, {fate}; for example:"
        )
        lines += [f"  - {example}" for example in overlap.examples]
    return lines


def source_table(stats: DataStats, tokens: tuple[SourceTokens, ...] = ()) -> str:
    """The sources as a Markdown table; empty for stats from before lineage was recorded. ``tokens``: what the
    tokenise step counted of each source's training rows (the model card has them; the data step's report, written
    before tokenising, does not)."""
    if not stats.lineage:
        return ""
    mixture = len(stats.sources) == len(stats.lineage)
    with_tokens = shows_tokens(stats, tokens)
    headers = LINEAGE_HEADERS + (MIXTURE_HEADERS if mixture else ()) + (TOKEN_HEADERS if with_tokens else ())
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    loss_tokens = sum(source.loss_tokens for source in tokens)
    for number, lineage in enumerate(stats.lineage):
        cells = _lineage_cells(lineage) + (_mixture_cells(stats.sources[number]) if mixture else [])
        if with_tokens:
            cells += _token_cells(tokens[number], loss_tokens)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shows_tokens(stats: DataStats, tokens: tuple[SourceTokens, ...]) -> bool:
    """Whether the table has token columns: ``tokens`` are those of the sources ``stats`` mixed, in their order."""
    mixture = bool(stats.lineage) and len(stats.sources) == len(stats.lineage)
    return mixture and [source.uri for source in tokens] == [source.uri for source in stats.sources]


def _lineage_cells(lineage: SourceLineage) -> list[str]:
    files = f" ({lineage.files} files)" if lineage.files > 1 else ""
    return [f"`{lineage.uri}`{files}", lineage.remote.described() or "—", f"`{lineage.content[:19]}…`"]


def _mixture_cells(source: SourceStats) -> list[str]:
    reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(source.rejected_by_reason.items()))
    return [
        "—" if source.weight is None else f"{source.weight:g}",
        f"{source.train_rows:,} of {source.train_available:,} ({source.realised_weight:.1%})",
        f"{source.eval_rows:,}",
        f"{source.records:,}",
        f"{source.rejected:,}" + (f" ({reasons})" if reasons else ""),
        f"{source.duplicates_within:,} / {source.duplicates_across:,}",
    ]


def _token_cells(source: SourceTokens, loss_tokens: int) -> list[str]:
    return [f"{source.tokens:,}", f"{source.loss_tokens:,} ({source.loss_tokens / max(loss_tokens, 1):.1%})"]
