"""Which training rows share a 13-word sequence with text they must not have seen (held-out rows, benchmark
questions): the n-gram overlap of lm-eval's decontamination, with memory bounded by the text checked against.

The normalisation is lm-eval's ``Janitor``'s: ASCII letters lowercased, ASCII punctuation deleted, words split on
whitespace; an overlap is one shared sequence of ``NGRAM`` words. Janitor keeps each n-gram as a string in a
set; here each is a 64-bit hash (of the words' own 64-bit hashes, so every step is a vectorised array
operation), and the text checked against is a sorted array of them: 8 bytes an n-gram, however many training
rows are checked. Two different n-grams share a hash with probability 2**-64, so checking a billion training
n-grams against ten million is wrong about one of them with probability below 1e-3. Against lm-eval's own code,
time and memory at two sizes: docs/benchmarks.md, "Contamination check".
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NGRAM = 13  # lm-eval's decontamination (lm_eval/decontamination/janitor.py, Janitor.ngram_n)
# A sequence that this many of the texts checked against share is boilerplate (a template's instruction, a stock
# phrase), not a row or a document to find: leaving it out keeps a data set whose rows all carry it from
# overlapping everywhere. lm-eval's Janitor has no such rule; its n-grams come from benchmark questions alone.
BOILERPLATE_TEXTS = 3
ASCII_PUNCTUATION = r"[!-/:-@\[-`{-~]"  # string.punctuation, which Janitor deletes
# Odd multipliers of the polynomial hash over a window's word hashes, one per position in the window.
_POWERS = np.array([pow(0x9E3779B97F4A7C15, NGRAM - 1 - j, 2**64) for j in range(NGRAM)], dtype=np.uint64)


def normalised_words(texts: pa.Array) -> pa.ListArray:
    """Each text's words as Janitor reads them (lowercase ASCII, no ASCII punctuation, split on whitespace)."""
    cleaned = pc.replace_substring_regex(pc.ascii_lower(texts), ASCII_PUNCTUATION, "")
    return pc.utf8_split_whitespace(cleaned)


def _word_hashes(words: pa.Array) -> np.ndarray:
    """A 64-bit hash of each word: each distinct word hashed once (blake2b, stable across processes)."""
    encoded = pc.dictionary_encode(words)
    distinct = encoded.dictionary.to_pylist()
    table = np.array(
        [int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little") for word in distinct],
        dtype=np.uint64,
    )
    return table[encoded.indices.to_numpy(zero_copy_only=False)] if len(distinct) else np.zeros(0, np.uint64)


def _per_text(hashes: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each text's n-gram hashes once (a text repeating a sequence counts it once), sorted by hash."""
    order = np.lexsort((rows, hashes))
    hashes, rows = hashes[order], rows[order]
    first = np.ones(len(hashes), dtype=bool)
    first[1:] = (hashes[1:] != hashes[:-1]) | (rows[1:] != rows[:-1])
    return hashes[first], rows[first]


def text_ngrams(texts: pa.Array) -> np.ndarray:
    """The n-grams of ``texts``, each text's once: what an index counts to tell boilerplate."""
    return _per_text(*ngram_hashes(texts))[0]


def _rare(ordered: np.ndarray) -> np.ndarray:
    """Of a sorted array of each text's n-grams, which elements are the first of a distinct n-gram that fewer than
    ``BOILERPLATE_TEXTS`` texts share: a run that starts at ``i`` is short when ``i + BOILERPLATE_TEXTS - 1`` holds
    another value. Boolean masks only, a byte an n-gram, where ``np.unique`` made 8-byte copies."""
    count = len(ordered)
    first = np.ones(count, dtype=bool)
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    reach = BOILERPLATE_TEXTS - 1
    short = np.ones(count, dtype=bool)
    np.not_equal(ordered[reach:], ordered[:-reach], out=short[:-reach])
    return first & short


def ngram_hashes(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The hash of every ``NGRAM``-word sequence of each text, and the index of the text it is in."""
    words = normalised_words(texts)
    flat = _word_hashes(words.flatten())
    offsets = words.offsets.to_numpy()
    offsets = offsets - offsets[0]
    windows = len(flat) - NGRAM + 1
    if windows <= 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    hashes = np.zeros(windows, dtype=np.uint64)
    for position, power in enumerate(_POWERS):
        hashes += flat[position : position + windows] * power  # wraps modulo 2**64, as meant
    row_of_start = np.repeat(np.arange(len(texts)), np.diff(offsets))[:windows]
    inside = np.arange(windows) + NGRAM <= offsets[row_of_start + 1]  # the window ends in the row it starts in
    return hashes[inside], row_of_start[inside]


class NgramIndex:
    """The n-grams of the text that training must not contain, sorted for lookup.

    Looked up in a sorted array of millions, most of a batch's n-grams would each cost a cache miss or more; a
    table of which top ``PREFIX_BITS`` bits occur (16 MiB) answers most of them from the cache first, and only
    those that pass it are searched for, in sorted order: each search then starts where the last one ended, on
    memory just read. (Unsorted, the searches grew faster than the data: an eval split of 100,000 rows fills
    nearly half the table, and then 4x the records took 55x the searching.)"""

    PREFIX_BITS = 24

    def __init__(self, hashes: np.ndarray, documents: np.ndarray | None = None) -> None:
        """``hashes``: sorted and distinct (``of`` and ``of_documents`` make them so). ``documents``: the document
        each is from, to tell which documents a text overlaps."""
        self.hashes = hashes
        self.documents = documents
        # how many documents have an n-gram at all (of NGRAM words or more): the ones an overlap can be found with
        self.document_count = len(np.unique(documents)) if documents is not None else 0
        self._prefixes = np.zeros(1 << self.PREFIX_BITS, dtype=bool)
        self._prefixes[self.hashes >> np.uint64(64 - self.PREFIX_BITS)] = True

    @classmethod
    def of(cls, batches: Iterable[pa.Array]) -> NgramIndex:
        """The index of every text in ``batches`` (arrays of strings, read one at a time), boilerplate left out."""
        return cls.of_parts(text_ngrams(batch) for batch in batches)

    @classmethod
    def of_parts(cls, parts: Iterable[np.ndarray]) -> NgramIndex:
        """The index of texts given as ``text_ngrams`` of each batch of them, boilerplate left out."""
        parts = list(parts)
        hashes = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
        del parts
        hashes.sort()  # in place: the index's memory is this array and, briefly, what it keeps of it
        return cls(hashes[_rare(hashes)])

    @classmethod
    def of_documents(cls, documents: pa.Array) -> NgramIndex:
        """The index of ``documents`` (strings), each n-gram knowing its document's position (an n-gram that two
        documents share, the first's); boilerplate left out."""
        hashes, rows = _per_text(*ngram_hashes(documents))  # sorted by hash, then by document
        rare = _rare(hashes)
        return cls(hashes[rare], rows[rare])

    def __len__(self) -> int:
        return len(self.hashes)

    def overlaps(self, texts: pa.Array) -> np.ndarray:
        """How many of each text's n-grams are in the index."""
        return self.matches(*ngram_hashes(texts), len(texts))[0]

    def matches(self, hashes: np.ndarray, rows: np.ndarray, texts: int) -> tuple[np.ndarray, np.ndarray]:
        """Of ``texts`` texts' n-grams (``ngram_hashes``: each hash and its text), how many of each text's are in
        the index, and the documents they are from (distinct, sorted; empty for an index made without them)."""
        candidates = np.flatnonzero(self._prefixes[hashes >> np.uint64(64 - self.PREFIX_BITS)])
        candidates = candidates[np.argsort(hashes[candidates])]
        hashes, rows = hashes[candidates], rows[candidates]
        places = np.searchsorted(self.hashes, hashes).clip(max=max(len(self.hashes) - 1, 0))
        found = self.hashes[places] == hashes if len(self.hashes) else np.zeros(0, dtype=bool)
        documents = np.unique(self.documents[places[found]]) if self.documents is not None else np.zeros(0, np.int64)
        return np.bincount(rows[found], minlength=texts), documents
