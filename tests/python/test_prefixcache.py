"""The prefix-cache axis's pure parts: the requested prefix, the delivered rate from each
server's source, the `cache_hit_mismatch` rule, and the matrix file's axis."""

from __future__ import annotations

import pytest
from speedmatrix.matrix import Matrix
from speedmatrix.prefixcache import (
    delivered,
    delivered_from_counters,
    delivered_from_timings,
    delivered_from_usage,
    parse_cached_fractions,
    prefix_seed,
    shared_prefix_tokens,
)
from speedmatrix.verdict.cache import cache_hit_mismatch
from speedmatrix.verdict.names import Flag


@pytest.mark.parametrize(
    ("requested", "delivered", "flagged"),
    [
        (0.5, 0.5, False),
        (0.5, 0.45, False),  # exactly 5 points: not more than 5
        (0.5, 0.449, True),
        (0.9, 0.96, True),
        (0.0, 0.04, False),
        (0.0, 0.2, True),  # a cache hit nobody asked for
        (None, 0.7, False),  # no axis: no flag
        (0.9, None, False),  # the server reports nothing: no flag
    ],
)
def test_cache_hit_mismatch_table(
    requested: float | None, delivered: float | None, flagged: bool
) -> None:
    assert cache_hit_mismatch(requested, delivered) is flagged


def test_the_flag_has_its_words() -> None:
    assert Flag.CACHE_HIT_MISMATCH.value == "cache_hit_mismatch"
    assert "5 points" in Flag.CACHE_HIT_MISMATCH.text


@pytest.mark.parametrize(
    ("text", "values"),
    [("0,0.5,0.9", [0.0, 0.5, 0.9]), (" 0.25 ", [0.25])],
)
def test_parse_cached_fractions(text: str, values: list[float]) -> None:
    assert parse_cached_fractions(text) == values


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("0,1", "outside [0, 1)"),
        ("-0.1", "outside"),
        ("half", "not a number"),
        ("0.5,0.5", "twice"),
    ],
)
def test_parse_cached_fractions_refuses_in_one_line(text: str, words: str) -> None:
    with pytest.raises(ValueError, match="cached_fraction") as info:
        parse_cached_fractions(text)
    assert words in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("prompt", "fraction", "shared"),
    [(1024, 0.5, 512), (1000, 0.9, 900), (1000, 0.0, 0), (10, 0.99, 9), (1, 0.5, 0), (0, 0.5, 0)],
)
def test_shared_prefix_is_the_fraction_of_the_exact_prompt(
    prompt: int, fraction: float, shared: int
) -> None:
    assert shared_prefix_tokens(prompt, fraction) == shared


def test_prefix_seeds_differ_between_cells_and_runs_but_repeat() -> None:
    a = prefix_seed(7, "C=1024 N=4 f=0.5")
    assert a == prefix_seed(7, "C=1024 N=4 f=0.5")
    assert a != prefix_seed(7, "C=1024 N=8 f=0.5")
    assert a != prefix_seed(8, "C=1024 N=4 f=0.5")


def test_delivered_from_usage_counts_a_missing_field_as_zero_when_others_report() -> None:
    assert delivered_from_usage([1000, 1000], [900, None]) == pytest.approx(0.45)
    assert delivered_from_usage([1000, 1000], [None, None]) is None
    assert delivered_from_usage([], []) is None


def test_delivered_from_llamacpp_timings() -> None:
    assert delivered_from_timings([100, 100], [900, 900]) == pytest.approx(0.9)
    assert delivered_from_timings([], []) is None


@pytest.mark.parametrize(
    ("before", "after", "rate"),
    [
        (
            {"vllm:prefix_cache_hits_total": 100, "vllm:prefix_cache_queries_total": 1000},
            {"vllm:prefix_cache_hits_total": 1000, "vllm:prefix_cache_queries_total": 2000},
            0.9,
        ),
        (
            {"sglang:cached_tokens_total": 0, "sglang:prompt_tokens_total": 4096},
            {"sglang:cached_tokens_total": 2048, "sglang:prompt_tokens_total": 8192},
            0.5,
        ),
        ({}, {}, None),  # no known family
        (
            {"vllm:prefix_cache_hits_total": 5, "vllm:prefix_cache_queries_total": 10},
            {"vllm:prefix_cache_hits_total": 5, "vllm:prefix_cache_queries_total": 10},
            None,  # nothing asked between the reads
        ),
    ],
)
def test_delivered_from_counters(
    before: dict[str, float], after: dict[str, float], rate: float | None
) -> None:
    got = delivered_from_counters(before, after)
    assert got == (pytest.approx(rate) if rate is not None else None)


def test_a_matrix_file_reads_the_cached_fraction_axis() -> None:
    m = Matrix.from_toml("[matrix]\ncached_fraction = [0, 0.5, 0.9]\n")
    assert m.cached_fraction == [0.0, 0.5, 0.9]
    assert Matrix.from_toml(m.to_toml()).cached_fraction == [0.0, 0.5, 0.9]
    with pytest.raises(ValueError, match="cached_fraction: 1.0 is outside") as info:
        Matrix.from_toml("[matrix]\ncached_fraction = [0.5, 1.0]\n").validate()
    assert "\n" not in str(info.value)


VLLM_BEFORE = {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 0.0}
VLLM_AFTER = {"vllm:prefix_cache_hits_total": 300.0, "vllm:prefix_cache_queries_total": 1000.0}


@pytest.mark.parametrize(
    ("cached", "timings", "counters", "expected"),
    [
        ([500, 500], ([1], [1]), (VLLM_BEFORE, VLLM_AFTER), (0.5, "usage")),
        ([None, None], ([100, 100], [900, 900]), (VLLM_BEFORE, VLLM_AFTER), (0.9, "timings")),
        ([None, None], None, (VLLM_BEFORE, VLLM_AFTER), (0.3, "counters")),
        ([None, None], ([], []), ({}, {}), (None, None)),
        ([], None, None, (None, None)),
    ],
)
def test_delivered_takes_the_first_source_that_says_something(
    cached: list[int | None],
    timings: tuple[list[int], list[int]] | None,
    counters: tuple[dict[str, float], dict[str, float]] | None,
    expected: tuple[float | None, str | None],
) -> None:
    rate, source = delivered([1000, 1000], cached, timings=timings, counters=counters)
    assert source == expected[1]
    assert rate == (pytest.approx(expected[0]) if expected[0] is not None else None)
