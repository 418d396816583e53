"""The n-gram overlap check (components/data/contamination.py) finds exactly what lm-eval's own decontamination
code (``lm_eval.decontamination.janitor``) would: the same normalisation, the same 13-word sequences."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from components.data.contamination import BOILERPLATE_TEXTS, NGRAM, NgramIndex, ngram_hashes

QUESTION = (
    "Which knot forms a fixed loop at the end of a rope that neither slips nor binds under a heavy load, "
    "and is easy to untie afterwards?"
)


@pytest.fixture(scope="module")
def janitor():
    from lm_eval.decontamination.janitor import Janitor, word_ngrams

    cleaner = Janitor(ngram_n=NGRAM)
    return lambda text: list(word_ngrams(cleaner.normalize_string(text), NGRAM))


def test_a_planted_question_is_found_whatever_its_case_and_punctuation():
    index = NgramIndex.of([pa.array([QUESTION])])
    planted = "Here is one: " + QUESTION.upper().replace(",", ";") + " Thanks!"
    twelve_words = " ".join(QUESTION.split()[:12])
    counts = index.overlaps(pa.array([planted, twelve_words, "How do I boil an egg?", None]))
    assert counts[0] == len(QUESTION.split()) - NGRAM + 1 and counts[1:].tolist() == [0, 0, 0]


def test_sequences_never_run_across_two_texts():
    words = QUESTION.split()
    index = NgramIndex.of([pa.array([QUESTION])])
    halves = pa.array([" ".join(words[:10]), " ".join(words[10:])])
    assert index.overlaps(halves).tolist() == [0, len(words) - 10 - NGRAM + 1]


def test_the_counts_are_lm_evals_own_on_random_texts(janitor):
    """Two words, written four ways (case, punctuation), make chance overlaps common."""
    rng = np.random.default_rng(0)
    vocabulary = ["Rope", "knot,", "ROPE!", "Knot"]

    def text() -> str:
        return " ".join(rng.choice(vocabulary, size=rng.integers(5, 40)))

    held_out = [text() for _ in range(30)]
    training = [text() for _ in range(200)]
    index = NgramIndex.of([pa.array(held_out[:15]), pa.array(held_out[15:])])
    dirty = {ngram for document in held_out for ngram in janitor(document)}
    assert len(index) == len(dirty)
    expected = [sum(ngram in dirty for ngram in janitor(document)) for document in training]
    assert index.overlaps(pa.array(training)).tolist() == expected
    assert 0 < sum(count > 0 for count in expected) < len(training)


def test_a_slice_of_a_larger_array_is_read_from_its_own_offset():
    texts = pa.array(["short", QUESTION, "also short", QUESTION + " again"])
    whole_hashes, whole_rows = ngram_hashes(texts)
    part_hashes, part_rows = ngram_hashes(texts.slice(1, 2))
    assert part_hashes.tolist() == whole_hashes[whole_rows == 1].tolist() and set(part_rows.tolist()) == {0}


def test_an_empty_index_finds_nothing():
    assert NgramIndex.of([]).overlaps(pa.array([QUESTION])).tolist() == [0]


def test_a_sequence_that_three_texts_share_is_boilerplate_and_two_is_not():
    """The rule that keeps a template shared by every row from overlapping everywhere: a 13-word sequence in
    BOILERPLATE_TEXTS (3) or more of the texts indexed is left out, in fewer it stays; a text repeating one counts
    once."""
    assert BOILERPLATE_TEXTS == 3
    shared = " ".join(QUESTION.split()[:NGRAM])
    twice = NgramIndex.of([pa.array([shared, f"{shared} {shared}", "unrelated words only"])])
    thrice = NgramIndex.of([pa.array([shared, shared]), pa.array([f"Also: {shared}"])])
    assert twice.overlaps(pa.array([shared])).tolist() == [1]
    assert thrice.overlaps(pa.array([shared])).tolist() == [0]

    documents = NgramIndex.of_documents(pa.array(["no", shared, "neither", f"{shared} too"]))
    counts, hit = documents.matches(*ngram_hashes(pa.array([shared])), 1)
    assert counts.tolist() == [1] and hit.tolist() == [1]  # in documents 1 and 3: kept, as the first's
    boilerplate = NgramIndex.of_documents(pa.array([shared, "no", shared, QUESTION]))  # QUESTION starts with it
    assert boilerplate.overlaps(pa.array([shared])).tolist() == [0] and boilerplate.document_count == 1
