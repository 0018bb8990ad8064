"""The trace readers (our JSONL, Mooncake, Azure CSV) and the replay schedule: fast tier."""

from __future__ import annotations

import pytest
from speedmatrix.trace import (
    MAX_ERROR_LINES,
    TraceError,
    load_trace,
    parse_trace,
    schedule_ns,
    shared_blocks,
)

MOONCAKE = (
    '{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}\n'
    '{"timestamp": 10535, "input_length": 672, "output_length": 26, "hash_ids": [46, 47]}\n'
    '{"timestamp": 27482, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}\n'
)
AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:51.0000000,879,12\n"
)


def test_mooncake_rows_keep_lengths_ms_times_and_prefix():
    trace = parse_trace(MOONCAKE)
    assert trace.format == "mooncake" and trace.bad_rows == 0
    assert [r.arrival_ns for r in trace.requests] == [0, 10_535_000_000, 27_482_000_000]
    assert [r.input_tokens for r in trace.requests] == [655, 672, 655]
    assert [r.output_tokens for r in trace.requests] == [52, 26, 52]
    assert {r.prefix_hash for r in trace.requests} == {"46"}


def test_azure_csv_times_are_offsets_from_the_first_with_seven_digit_fractions():
    trace = parse_trace(AZURE)
    assert trace.format == "azure"
    assert [r.arrival_ns for r in trace.requests] == [0, 4_314_579_000, 4_319_410_000]
    assert [(r.input_tokens, r.output_tokens) for r in trace.requests] == [
        (374, 44),
        (396, 109),
        (879, 12),
    ]


def test_own_jsonl_sorts_by_arrival_and_keeps_session_and_prefix():
    text = (
        '{"arrival_ms": 250, "input_tokens": 10, "output_tokens": 3, "session": "a"}\n'
        "\n// a comment\n"
        '{"arrival_ms": 100, "input_tokens": 20, "output_tokens": 4, "prefix_hash": "p1"}\n'
    )
    trace = parse_trace(text)
    assert trace.format == "jsonl"
    assert [(r.line, r.arrival_ns) for r in trace.requests] == [(4, 0), (1, 150_000_000)]
    assert trace.requests[0].prefix_hash == "p1" and trace.requests[1].session == "a"


@pytest.mark.parametrize(
    "row, says",
    [
        ('{"arrival_ms": -1, "input_tokens": 1, "output_tokens": 1}', "arrival_ms"),
        ('{"arrival_ms": 1, "input_tokens": 0, "output_tokens": 1}', "input_tokens"),
        ('{"arrival_ms": 1, "input_tokens": 2.5, "output_tokens": 1}', "input_tokens"),
        ('{"arrival_ms": 1, "input_tokens": 2}', "output_tokens"),
        ("[1, 2]", "JSON object"),
        ("{not json", "trace:2:"),
        ('{"timestamp": 5, "input_length": 1, "output_length": 1}', "mooncake row"),
    ],
)
def test_a_bad_row_is_one_line_and_the_good_rows_stay(row, says):
    good = '{"arrival_ms": 0, "input_tokens": 8, "output_tokens": 2}'
    trace = parse_trace(f"{good}\n{row}\n{good}\n")
    assert len(trace.requests) == 2 and trace.bad_rows == 1
    assert trace.errors[0].startswith("trace:2:") and says in trace.errors[0]
    assert "\n" not in trace.errors[0]


def test_bad_azure_rows_are_named_by_line():
    text = AZURE + "yesterday,1,1\n2023-11-16 18:16:00.1,x,1\n"
    trace = parse_trace(text, "az.csv")
    assert len(trace.requests) == 3 and trace.bad_rows == 2
    assert trace.errors[0].startswith("az.csv:5:") and "TIMESTAMP" in trace.errors[0]
    assert trace.errors[1].startswith("az.csv:6:") and "ContextTokens" in trace.errors[1]


def test_error_lines_are_bounded_but_every_bad_row_is_counted():
    good = '{"arrival_ms": 0, "input_tokens": 8, "output_tokens": 2}\n'
    trace = parse_trace(good + "{bad\n" * (MAX_ERROR_LINES + 7))
    assert len(trace.errors) == MAX_ERROR_LINES and trace.bad_rows == MAX_ERROR_LINES + 7


@pytest.mark.parametrize("text", ["", "\n\n", "{bad\n", "TIMESTAMP,Other\n1,2\n"])
def test_a_trace_with_nothing_to_replay_is_one_error(text):
    with pytest.raises(TraceError) as exc:
        parse_trace(text, "t")
    assert "\n" not in str(exc.value)


def test_load_trace_names_an_unreadable_file(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "absent.jsonl")
    path = tmp_path / "m.jsonl"
    path.write_text(MOONCAKE)
    assert len(load_trace(path).requests) == 3


def test_schedule_divides_the_arrivals_by_the_speedup():
    trace = parse_trace(MOONCAKE)
    assert schedule_ns(trace) == [0, 10_535_000_000, 27_482_000_000]
    assert schedule_ns(trace, speedup=4) == [0, 2_633_750_000, 6_870_500_000]
    for bad in (0, -1, float("nan")):
        with pytest.raises(TraceError, match="speedup"):
            schedule_ns(trace, bad)


def test_shared_blocks_cover_the_prompt_in_512_token_blocks() -> None:
    moon = parse_trace(
        '{"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 3, 4]}\n'
    )
    assert shared_blocks(moon.requests[0]) == [("1", 512), ("2", 512), ("3", 76)]
    own = parse_trace(
        '{"arrival_ms": 0, "input_tokens": 300, "output_tokens": 4, "prefix_hash": "sys",'
        ' "prefix_tokens": 200}\n'
        '{"arrival_ms": 1, "input_tokens": 300, "output_tokens": 4, "prefix_hash": "sys"}\n'
        '{"arrival_ms": 2, "input_tokens": 300, "output_tokens": 4}\n'
    )
    # without prefix_tokens a block; at most all but the prompt's last token
    assert [shared_blocks(r) for r in own.requests] == [[("sys", 200)], [("sys", 299)], []]
