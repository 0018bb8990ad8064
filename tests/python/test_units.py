import pytest
from speedmatrix.units import (
    format_duration,
    format_tokens,
    parse_duration,
    parse_token_list,
    parse_tokens,
)


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("8k", 8192),
        ("8K", 8192),
        ("123k", 125952),
        ("128k", 131072),
        ("131072", 131072),
        (" 16k ", 16384),
        ("1.5k", 1536),
        ("1m", 1048576),
        ("0", 0),
        (4096, 4096),
        (4096.0, 4096),
    ],
)
def test_parse_tokens(text, tokens):
    assert parse_tokens(text) == tokens


@pytest.mark.parametrize(
    "text, message",
    [
        ("8x", "unknown unit 'x' in '8x'"),
        ("8kb", "unknown unit 'kb' in '8kb'"),
        ("", "not a token count"),
        ("abc", "not a token count"),
        ("-8k", "not a token count"),
        ("1.0001k", "not a whole number of tokens"),
        (-1, "must not be negative"),
        (1.5, "whole non-negative"),
    ],
)
def test_parse_tokens_errors(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_tokens(text)


@pytest.mark.parametrize("value", [True, None, [8]])
def test_parse_tokens_wrong_type(value):
    with pytest.raises(TypeError, match="not a token count"):
        parse_tokens(value)


def test_parse_token_list_keeps_keywords():
    assert parse_token_list("8k, 16K,MAX,", keywords=("max",)) == [8192, 16384, "max"]
    assert parse_token_list([1024, "2k"]) == [1024, 2048]
    with pytest.raises(ValueError, match="'max'"):
        parse_token_list("8k,max")


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30s", 30.0),
        ("2m", 120.0),
        ("500ms", 0.5),
        ("30", 30.0),
        (30, 30.0),
        (2.5, 2.5),
        ("1h", 3600.0),
        ("1m30s", 90.0),
        ("1.5s", 1.5),
        ("2M", 120.0),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text, message",
    [
        ("30x", "unknown unit 'x' in '30x'"),
        ("", "empty duration"),
        ("s", "not a duration"),
        (-1, "non-negative"),
        (float("inf"), "finite"),
    ],
)
def test_parse_duration_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_duration(text)


@pytest.mark.parametrize(
    "tokens, label",
    [
        (8192, "8K"),
        (16384, "16K"),
        (65536, "64K"),
        (125952, "123K"),
        (131072, "128K"),
        (131008, "128K"),
        (1024, "1K"),
        (1536, "1.5K"),
        (2560, "2.5K"),
        (129024, "126K"),
        (130500, "127.4K"),
        (1023, "1023"),
        (512, "512"),
        (0, "0"),
    ],
)
def test_format_tokens(tokens, label):
    assert format_tokens(tokens) == label


@pytest.mark.parametrize(
    "seconds, text", [(30, "30s"), (120, "2m"), (0.5, "500ms"), (1.5, "1.5s"), (0, "0s")]
)
def test_format_duration_round_trips(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


def test_parse_duration_wrong_type():
    with pytest.raises(TypeError, match="not a duration"):
        parse_duration(True)
