from pathlib import Path

import pytest
from speedmatrix.matrix import Matrix, parse_contexts


def test_seed_preset_is_the_seed_matrix():
    m = Matrix.preset("seed")
    assert m.contexts == [8192, 16384, 32768, 65536, "max"]
    assert m.concurrency == [1, 2, 4, 8, 16, 32, 64, 128]
    assert m.prefill_contexts == [8192, 16384, 32768, 65536, "max-decode", "max"]
    assert m.duration_s == 30.0
    assert m.max_output == 4096
    assert m.api == "completions"
    assert m.shared_prefix == 0
    assert m.problems() == []
    assert m.validate() is m


def test_quick_preset_is_small_and_valid():
    m = Matrix.preset("quick")
    assert m.problems() == []
    assert m.validate() is m
    assert len(m.contexts) * len(m.concurrency) <= 6
    assert m.duration_s <= 5


def test_unknown_preset_names_the_choices():
    with pytest.raises(ValueError, match="unknown matrix preset 'nope'.*quick, seed"):
        Matrix.preset("nope")


def test_human_forms_are_coerced():
    m = Matrix(contexts="8k,16K,max", concurrency="1,2,4", duration_s="2m", max_output="4k")
    assert m.contexts == [8192, 16384, "max"]
    assert m.concurrency == [1, 2, 4]
    assert m.duration_s == 120.0
    assert m.max_output == 4096
    assert m.labels() == ["8K", "16K", "max"]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"concurrency": [1, 0]}, "concurrency: 0 is not a positive integer"),
        ({"concurrency": [1, "x"]}, "concurrency: 'x' is not a positive integer"),
        ({"concurrency": []}, "concurrency: at least one level is needed"),
        ({"concurrency": [2, 2]}, "concurrency: levels repeat"),
        ({"contexts": []}, "contexts: at least one context is needed"),
        ({"contexts": ["8x"]}, "contexts: '8x' is neither a token count"),
        ({"contexts": ["max-decode"]}, "contexts: 'max-decode' is neither"),
        ({"contexts": [0]}, "contexts: 0 is not a positive token count"),
        ({"contexts": [8192, "8k"]}, "contexts: 8192 is listed twice"),
        ({"prefill_contexts": ["huge"]}, "prefill_contexts: 'huge' is neither"),
        ({"duration_s": 0}, "duration_s: 0 is not a positive number"),
        ({"max_output": 0}, "max_output: 0 is not a positive integer"),
        ({"api": "responses"}, "api: 'responses' is not one of completions, chat"),
        ({"extra": {"stream": False}}, "extra: 'stream' is set by speedmatrix"),
        ({"shared_prefix": -8192}, "shared_prefix: a unique tail of 8192 tokens does not fit"),
        ({"shared_prefix": 8192}, "shared_prefix: 8192 tokens leaves no unique part"),
        ({"repetitions": 0}, "repetitions: 0 is not a positive integer"),
        ({"warmup": "yes"}, "warmup: 'yes' is not true or false"),
        ({"idle_timeout_s": -1}, "idle_timeout_s: -1"),
        ({"error_threshold": 1.5}, "error_threshold: 1.5 is not a fraction"),
        ({"prefill_mode": "after"}, "prefill_mode: 'after' is not one of warmup, separate"),
        ({"request_idle_timeout_s": 0}, "request_idle_timeout_s: 0 is not a positive"),
        ({"prefill_cooldown_s": -1}, "prefill_cooldown_s: -1 is not a number of seconds"),
    ],
)
def test_validation_names_the_field(changes, message):
    m = Matrix(**{**Matrix.preset("seed").to_dict(), **changes})
    errors = m.problems()
    assert any(message in e for e in errors), errors
    with pytest.raises(ValueError, match="invalid matrix: .*" + message.split(":")[0]):
        m.validate()


def test_validate_reports_every_problem():
    m = Matrix(contexts=[0], concurrency=[0], max_output=0)
    fields_named = {e.split(":")[0] for e in m.problems()}
    assert fields_named == {"contexts", "concurrency", "max_output"}


@pytest.mark.parametrize("preset", ["seed", "quick"])
def test_toml_round_trip(preset):
    m = Matrix.preset(preset)
    m.extra = {"temperature": 0.0, "chat_template_kwargs": {"enable_thinking": False}}
    m.shared_prefix = 512
    text = m.to_toml()
    assert "[matrix.extra" in text
    back = Matrix.from_toml(text)
    assert back == m
    assert back.to_toml() == text


def test_toml_file_round_trip(tmp_path: Path):
    m = Matrix.preset("seed")
    path = tmp_path / "m.toml"
    m.save_toml(path)
    assert Matrix.from_toml(path) == m
    assert Matrix.from_toml(str(path)) == m


def test_toml_accepts_human_units_and_top_level_keys():
    m = Matrix.from_toml(
        'contexts = ["8k", "16k", "max"]\nconcurrency = [1, 8]\nduration = "45s"\n'
        'max_output = "1k"\nprefill_contexts = ["8k", "max-decode", "max"]\n'
        "[extra]\ntemperature = 0.5\n"
    )
    assert m.contexts == [8192, 16384, "max"]
    assert m.duration_s == 45.0
    assert m.max_output == 1024
    assert m.prefill_contexts == [8192, "max-decode", "max"]
    assert m.extra == {"temperature": 0.5}


@pytest.mark.parametrize(
    "text, message",
    [
        ("contexts = [8192]\nwindow = 3\n", "window: unknown matrix field"),
        ("contexts = [", "does not parse"),
        ('duration = "3s"\nduration_s = 3\n', "duration: given together with duration_s"),
        ('max_output = "4x"\n', "unknown unit 'x' in '4x'"),
    ],
)
def test_toml_errors(text, message):
    with pytest.raises(ValueError, match=message):
        Matrix.from_toml(text)


def test_parse_contexts_for_cli():
    assert parse_contexts("8k,16k,max") == [8192, 16384, "max"]
    assert parse_contexts("8k,max-decode,max", prefill=True) == [8192, "max-decode", "max"]
    with pytest.raises(ValueError, match="max-decode"):
        parse_contexts("8k,max-decode")


def test_extra_body_alias():
    m = Matrix()
    m.extra_body = {"temperature": 0}
    assert m.extra == {"temperature": 0}
    assert m.extra_body is m.extra


def test_to_toml_refuses_nulls_naming_the_field():
    m = Matrix(extra={"stop": None, "a": {"b": [1, None]}})
    with pytest.raises(ValueError, match=r"extra\.stop: TOML has no null"):
        m.to_toml()


def test_from_dict_accepts_the_cli_names():
    m = Matrix.from_dict({"extra_body": {"temperature": 0}, "request_idle_timeout": "2m"})
    assert m.extra == {"temperature": 0}
    assert m.request_idle_timeout_s == 120.0
    assert Matrix.from_dict(m.to_dict()) == m


def test_an_interrupted_seed_run_keeps_its_max_row():
    """run.json of a seed-preset run stopped after its first cell: the matrix read back
    has the 123K decode row and the 123K / 128K prefill columns, from the resolved plan
    the sweep saved at the start ("max" in the definition alone cannot be resolved)."""
    from speedmatrix.plan import plan
    from speedmatrix.results import Run
    from speedmatrix.runmeta import plan_meta

    m = Matrix.preset("seed")
    planned = plan(m, None, kv_tokens=1_000_000, context_length=131072)
    first = {
        "id": "prefill-c8192-r0",
        "phase": "prefill",
        "context": 8192,
        "concurrency": 1,
        "status": "valid",
    }
    doc = {
        "meta": {
            "run": {"matrix": m.to_dict(), "plan": plan_meta(planned, m), "interrupted": True}
        },
        "cells": [first],
    }
    d = Run(doc).matrix_definition
    assert d["contexts"] == [8192, 16384, 32768, 65536, 125952]
    assert d["concurrency"] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert d["prefill_contexts"] == [8192, 16384, 32768, 65536, 125952, 131008]
    # without the plan (a run.json from before it was saved) keywords are dropped
    del doc["meta"]["run"]["plan"]
    assert Run(doc).matrix_definition["contexts"] == [8192, 16384, 32768, 65536]
