"""Several data sources, each with its share of the training rows: the ``dataset_sources`` run parameter.

A JSON list, each entry one source the data step reads as it reads ``dataset_uri`` (a path, a glob, an
https://, s3:// or hf:// URL), with its own ``field_map``, and optionally:

- ``weight``: the share of the training rows this source contributes, relative to the other weights. Give every
  source a weight or none: without weights every usable row of every source is used, as if the files were one.
- ``max_rows``: at most this many of the source's training rows.
- ``with_replacement``: a source smaller than its share is drawn from again (each row once more before any row a
  third time). Without it the mixture shrinks to what the smallest share allows, so that no row is repeated
  unless asked for. Without weights there is no share to draw toward, and it changes nothing.

The rows are chosen after each source is read, checked, de-duplicated and split: each source's held-out rows are
split off before the mixing, so the eval split holds every source's. The choice depends only on the split seed.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from components.data.field_map import field_map_problem
from components.data.sources import describe_uri

if TYPE_CHECKING:
    import numpy as np

EXAMPLE = '[{"uri": "s3://data/domain/", "weight": 3}, {"uri": "hf://datasets/org/general", "weight": 1}]'
# The run parameter's help (components/run_form/options.py), which the data stage's --sources shows too.
SOURCES_HELP = (
    f"Several training sources mixed by weight, instead of dataset_uri: a JSON list such as {EXAMPLE}. Each "
    "source is a URI of any kind dataset_uri takes, with optional keys weight (its share of the training rows; "
    "give every source one, or none to use every row), field_map (its own; the run's field_map when left out), "
    "max_rows (a cap on its training rows) and with_replacement (true lets a small source repeat rows to reach "
    "its share; otherwise the mixture shrinks to what the smallest share allows). Each source's held-out rows "
    "are split off before mixing, so the eval split holds every source's. stats.json, the report and the model "
    "card account for each source."
)


@dataclass(frozen=True)
class DataSource:
    """One entry of ``dataset_sources``."""

    uri: str
    weight: float | None = None
    field_map: str = ""
    max_rows: int | None = None
    with_replacement: bool = False


KEYS = tuple(field.name for field in fields(DataSource))


def parse_sources(text: str) -> tuple[DataSource, ...]:
    """The sources in ``text`` (empty: none, ``dataset_uri`` is read); ``ValueError`` says what is wrong, in words
    that follow the parameter's name."""
    if not text.strip():
        return ()
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"is not valid JSON ({error.msg} at column {error.colno}); write a list like {EXAMPLE}"
        ) from None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"must be a non-empty JSON list of sources, like {EXAMPLE}")
    sources = tuple(_source(entry, number) for number, entry in enumerate(entries, start=1))
    weighted = [source.weight is not None for source in sources]
    if any(weighted) and not all(weighted):
        unweighted = ", ".join(str(number) for number, has in enumerate(weighted, start=1) if not has)
        raise ValueError(
            f"gives weights to some sources but not to source {unweighted}: give every source a weight (its share of "
            "the training rows), or none to use every row of every source"
        )
    uris = [source.uri for source in sources]
    repeated = sorted({uri for uri in uris if uris.count(uri) > 1})
    if repeated:
        raise ValueError(f"lists {describe_uri(repeated[0])} more than once; give each source once, with its weight")
    return sources


def _source(entry: object, number: int) -> DataSource:
    where = f"source {number}"
    if isinstance(entry, str):
        entry = {"uri": entry}
    if not isinstance(entry, dict):
        raise ValueError(f'{where} is {json.dumps(entry)}; each source is a URI or an object with a "uri"')
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], KEYS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"{where} has the key {unknown[0]!r}{hint}; a source's keys are {', '.join(KEYS)}")
    uri = entry.get("uri")
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError(f'{where} has no "uri": name the file, directory, glob or URL to read')
    where = f"source {number} ({describe_uri(uri)})"
    weight = entry.get("weight")
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float))):
        raise ValueError(f"{where} has the weight {json.dumps(weight)}, which is not a number")
    if weight is not None and not (math.isfinite(weight) and weight > 0):
        raise ValueError(
            f"{where} has the weight {weight}; a weight is a positive share of the training rows (leave a source "
            "out rather than give it 0)"
        )
    field_map = entry.get("field_map", "")
    field_map_text = field_map if isinstance(field_map, str) else json.dumps(field_map)
    problem = field_map_problem(field_map_text)
    if problem:
        raise ValueError(f"{where}: its field_map {problem}")
    max_rows = entry.get("max_rows")
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1):
        raise ValueError(f"{where} has max_rows {json.dumps(max_rows)}; it is a whole number of rows, at least 1")
    replace = entry.get("with_replacement", False)
    if not isinstance(replace, bool):
        raise ValueError(f"{where} has with_replacement {json.dumps(replace)}; it is true or false")
    return DataSource(uri.strip(), None if weight is None else float(weight), field_map_text, max_rows, replace)


def allocate(sources: Sequence[DataSource], available: Sequence[int]) -> tuple[int, ...]:
    """How many training rows each source contributes, given how many each has after its checks and split.

    With weights, the counts are the largest mixture whose shares are the weights: a source without replacement
    gives at most its rows (or ``max_rows``), one with replacement any number (at most ``max_rows``). The counts
    are rounded so that they add up to the mixture's size (largest remainders). ``ValueError`` names a source that
    has no rows to give.
    """
    empty = [source.uri for source, rows in zip(sources, available) if rows == 0]
    if empty:
        raise ValueError(
            f"{empty[0]} has no usable training rows: each of its records was rejected, a repeat of an earlier "
            "record, held out for evaluation or dropped for sharing a 13-word sequence with the eval split"
        )
    if sources[0].weight is None:  # every row, under max_rows: with_replacement draws only toward a weight
        return tuple(min(rows, source.max_rows or rows) for source, rows in zip(sources, available, strict=True))
    caps = [
        source.max_rows if source.with_replacement and source.max_rows else min(rows, source.max_rows or rows)
        for source, rows in zip(sources, available, strict=True)
    ]
    total_weight = sum(source.weight or 0.0 for source in sources)
    shares = [(source.weight or 0.0) / total_weight for source in sources]
    limits = [
        cap / share
        for source, cap, share in zip(sources, caps, shares)
        if not source.with_replacement or source.max_rows is not None
    ]
    size = math.floor(min(limits)) if limits else sum(available)
    exact = [share * size for share in shares]
    counts = [math.floor(value) for value in exact]
    by_remainder = sorted(range(len(counts)), key=lambda index: counts[index] - exact[index])
    for index in by_remainder[: size - sum(counts)]:
        counts[index] += 1
    starved = [source for source, count in zip(sources, counts) if count == 0]
    if starved:
        raise ValueError(
            f"{starved[0].uri} would give no training rows: its weight {starved[0].weight:g} is too small a share "
            f"of the {size} rows the other sources allow; raise its weight, or let the others give more rows "
            "(max_rows, with_replacement)"
        )
    return tuple(counts)


def choose_rows(available: int, count: int, seed: int, source_index: int) -> np.ndarray:
    """Which of a source's ``available`` training rows make its ``count``, in ascending order: every row
    ``count // available`` times, then a sample without replacement for the rest. Drawn from ``seed`` and the
    source's place in the list, so the same run chooses the same rows."""
    import numpy as np  # here, so that checking the run parameter needs no numpy

    rounds, rest = divmod(count, available)
    generator = np.random.default_rng([seed, source_index])
    sample = np.sort(generator.choice(available, size=rest, replace=False))
    return np.sort(np.concatenate([np.tile(np.arange(available), rounds), sample]))
