"""--prompts files: JSONL (completion or chat) and ShareGPT JSON, each request's own length."""

from __future__ import annotations

import json

import pytest
from speedmatrix.workload import WorkloadError, load_prompts


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_jsonl_completion_and_chat_lines_keep_their_own_lengths(tmp_path):
    p = write(
        tmp_path,
        "w.jsonl",
        '{"prompt": "Tell me a story", "max_tokens": 64}\n'
        "\n// a comment\n"
        '{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 8}\n'
        '{"prompt": "no length"}\n',
    )
    ps = load_prompts(p)
    assert [x.index for x in ps] == [0, 1, 2]
    assert ps[0].payload == "Tell me a story" and ps[0].max_tokens == 64 and not ps[0].is_chat
    assert ps[1].is_chat and ps[1].max_tokens == 8
    assert ps[2].max_tokens is None
    assert len(load_prompts(p, limit=2)) == 2


def test_sharegpt_takes_the_first_human_turn_and_skips_empty_conversations(tmp_path):
    data = [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"}],
        },
        {"id": "b", "conversations": [{"from": "gpt", "value": "orphan"}]},
        {
            "id": "c",
            "conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "Q2"}],
        },
    ]
    ps = load_prompts(write(tmp_path, "sg.json", json.dumps(data)))
    assert [(x.index, x.payload, x.reference) for x in ps] == [(0, "Q1", "A1"), (1, "Q2", None)]


@pytest.mark.parametrize(
    "name, text, says",
    [
        ("a.jsonl", '{"prompt": "x"}\n{"prompt": \n', "a.jsonl:2: not valid JSON"),
        ("b.jsonl", '{"text": "x"}\n', "needs a 'prompt' or 'messages'"),
        ("c.jsonl", '{"prompt": "x", "max_tokens": 0}\n', "max_tokens must be a positive integer"),
        ("d.jsonl", '{"messages": []}\n', "messages must be a non-empty list"),
        ("e.jsonl", "\n\n", "holds no requests"),
        ("f.json", "[{]", "not valid JSON"),
        ("g.json", '[{"conversations": 3}]', "'conversations' must be a list"),
    ],
)
def test_bad_files_say_where_and_why(tmp_path, name, text, says):
    with pytest.raises(WorkloadError, match=says):
        load_prompts(write(tmp_path, name, text))


def test_missing_file(tmp_path):
    with pytest.raises(WorkloadError, match="no such file"):
        load_prompts(tmp_path / "nope.jsonl")
