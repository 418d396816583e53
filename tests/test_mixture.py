"""``dataset_sources``: the list of sources parsed with one clear sentence per mistake, and the weights turned into
row counts and chosen rows (components/data/mixture.py)."""

from __future__ import annotations

import numpy as np
import pytest

from components.data.mixture import DataSource, allocate, choose_rows, parse_sources


def test_a_list_of_uris_and_objects_is_read_with_its_options():
    sources = parse_sources(
        '["data/a.jsonl", {"uri": "s3://b/c/", "field_map": {"question": "input"}, "max_rows": 10, '
        '"with_replacement": true}]'
    )
    assert sources == (DataSource("data/a.jsonl"), DataSource("s3://b/c/", None, '{"question": "input"}', 10, True))
    weighted = parse_sources('[{"uri": "a", "weight": 3}, {"uri": " b ", "weight": 0.5}]')
    assert weighted == (DataSource("a", 3.0), DataSource("b", 0.5))
    assert parse_sources("  ") == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[{", "is not valid JSON"),
        ('{"uri": "a"}', "must be a non-empty JSON list of sources"),
        ("[]", "must be a non-empty JSON list of sources"),
        ("[3]", "source 1 is 3; each source is a URI or an object"),
        ('[{"weight": 1}]', 'source 1 has no "uri"'),
        ('[{"uri": "a", "wieght": 1}]', "source 1 has the key 'wieght' (did you mean weight?)"),
        ('[{"uri": "a", "weight": 0}]', "source 1 (a) has the weight 0; a weight is a positive share"),
        ('[{"uri": "a", "weight": -1}]', "has the weight -1; a weight"),
        ('[{"uri": "a", "weight": "3"}]', 'source 1 (a) has the weight "3", which is not a number'),
        ('[{"uri": "a", "weight": true}]', "has the weight true, which is not a number"),
        ('[{"uri": "a", "weight": 1}, {"uri": "b"}]', "gives weights to some sources but not to source 2"),
        ('["a", "a"]', "lists a more than once"),
        ('[{"uri": "a", "field_map": {"questoin": "x"}}]', "source 1 (a): its field_map maps 'questoin'"),
        ('[{"uri": "a", "max_rows": 0}]', "source 1 (a) has max_rows 0; it is a whole number of rows, at least 1"),
        ('[{"uri": "a", "max_rows": 1.5}]', "has max_rows 1.5"),
        ('[{"uri": "a", "with_replacement": "yes"}]', 'has with_replacement "yes"; it is true or false'),
    ],
)
def test_each_mistake_is_one_sentence_naming_the_source(text, message):
    with pytest.raises(ValueError) as raised:
        parse_sources(text)
    assert message in str(raised.value)


def weighted(*weights: float, replace: bool = False, max_rows: int | None = None) -> list[DataSource]:
    return [DataSource(f"s{index}", weight, "", max_rows, replace) for index, weight in enumerate(weights)]


def test_without_weights_every_row_of_every_source_is_used_up_to_max_rows():
    sources = [DataSource("a"), DataSource("b", max_rows=5)]
    assert allocate(sources, [7, 9]) == (7, 5)


def test_weights_are_shares_of_the_largest_mixture_no_source_repeats_a_row_in():
    assert allocate(weighted(3, 1), [1000, 1000]) == (1000, 333)  # the first source runs out first
    assert allocate(weighted(1, 1), [10, 1000]) == (10, 10)
    counts = allocate(weighted(0.5, 0.3, 0.2), [1000, 1000, 1000])
    assert counts == (1000, 600, 400)


def test_a_source_with_replacement_is_drawn_past_its_size():
    sources = [DataSource("big", 1.0), DataSource("small", 1.0, with_replacement=True)]
    assert allocate(sources, [1000, 10]) == (1000, 1000)
    capped = [DataSource("big", 1.0), DataSource("small", 1.0, "", 300, True)]
    assert allocate(capped, [1000, 10]) == (300, 300)


def test_the_counts_add_up_to_the_mixture_and_follow_the_weights_to_one_row():
    rng = np.random.default_rng(0)
    for _ in range(200):
        weights = rng.uniform(0.1, 5.0, size=rng.integers(2, 6))
        available = rng.integers(1, 5000, size=len(weights))
        counts = np.array(allocate(weighted(*weights), available))
        size = counts.sum()
        assert (counts <= available).all()
        assert np.abs(counts - weights / weights.sum() * size).max() < 1  # largest remainders
        assert (counts == available).any() or (counts >= available - 1).any()  # the mixture is as large as it can be


def test_a_source_with_no_usable_rows_is_named():
    with pytest.raises(ValueError, match="s1 has no usable training rows"):
        allocate(weighted(1, 1), [10, 0])


def test_the_rows_chosen_depend_on_the_seed_alone_and_repeat_only_past_the_size():
    chosen = choose_rows(100, 40, seed=7, source_index=1)
    assert len(chosen) == 40 and len(set(chosen)) == 40 and (np.diff(chosen) >= 0).all()
    assert (chosen == choose_rows(100, 40, seed=7, source_index=1)).all()
    assert not (chosen == choose_rows(100, 40, seed=8, source_index=1)).all()
    assert not (chosen == choose_rows(100, 40, seed=7, source_index=2)).all()
    repeated = choose_rows(10, 25, seed=7, source_index=0)
    assert np.bincount(repeated, minlength=10).tolist().count(3) == 5  # every row twice, then 5 of them once more
    assert set(np.bincount(repeated, minlength=10)) == {2, 3}


def test_over_many_seeds_each_row_is_chosen_as_often_as_any_other():
    """The sample is uniform: over 2000 seeds each of 50 rows is chosen about 2000 * 10/50 = 400 times."""
    times = np.zeros(50)
    for seed in range(2000):
        times += np.bincount(choose_rows(50, 10, seed, 0), minlength=50)
    assert np.abs(times - 400).max() < 5 * np.sqrt(400 * (1 - 10 / 50))


def test_a_weight_rounded_to_no_rows_is_refused_and_replacement_needs_a_weight():
    """A share too small for the mixture's size would silently drop its source; without weights there is no share
    to draw toward, so with_replacement repeats nothing."""
    tiny, large = DataSource("tiny", 1.0), DataSource("large", 1000.0)
    with pytest.raises(ValueError, match=r"^tiny would give no training rows: its weight 1 is too small a share"):
        allocate([tiny, large], [5, 400])
    unweighted = DataSource("small", max_rows=50, with_replacement=True)
    assert allocate([unweighted, DataSource("other")], [10, 20]) == (10, 20)


def test_a_uri_is_named_without_its_query_string():
    """A query may carry a credential the first step's check does not know by name: never repeated."""
    with pytest.raises(ValueError, match=r"^source 1 \(https://data.example/qa.jsonl\) has the weight 0") as raised:
        parse_sources('[{"uri": "https://data.example/qa.jsonl?code=s3cr3t", "weight": 0}]')
    assert "s3cr3t" not in str(raised.value)
