"""Secrets never reach a file: pattern redaction and known-secret replacement."""

import pytest
from speedmatrix.redact import REDACTED, redact, redact_known

CASES = [
    # (input, secret that must vanish, text that must stay)
    ("sglang serve --api-key abc123XYZ --port 8000", "abc123XYZ", "--port 8000"),
    ("sglang serve --api-key=abc123XYZ --tp 1", "abc123XYZ", "--tp 1"),
    (
        "vllm serve m --hf-token hf_abcdefghijklmnopqrstu",
        "hf_abcdefghijklmnopqrstu",
        "vllm serve m",
    ),
    ("tool --token s3cr3tvalue --verbose", "s3cr3tvalue", "--verbose"),
    ('curl -H "Authorization: Bearer tok-98765" http://h/v1', "tok-98765", "http://h/v1"),
    ("Authorization: Bearer abc.def.ghi", "abc.def.ghi", "Authorization: Bearer"),
    ("sent Bearer qwertyuiop123 upstream", "qwertyuiop123", "upstream"),
    ("http://host/v1/models?token=zzz999&x=1", "zzz999", "x=1"),
    ("http://host/v1?api_key=zzz999", "zzz999", "http://host/v1?"),
    ("https://host/path?key=AIzaSyA-123456", "AIzaSyA-123456", "https://host/path"),
    ("OPENAI_API_KEY=sk-live-1234567890 python bench.py", "sk-live-1234567890", "python bench.py"),
    ("export HF_TOKEN=hf_TokenTokenToken12345", "hf_TokenTokenToken12345", "export"),
    ("env MY_SECRET=hunter22 ./run", "hunter22", "./run"),
    ("the key is sk-proj-abcdefghijklmnop", "sk-proj-abcdefghijklmnop", "the key is"),
    ("http://user:pa55word@host:8000/v1", "pa55word", "host:8000/v1"),
    ('{"api_key": "inline-secret-1"}', "inline-secret-1", '"api_key"'),
    ('-H "x-api-key: hdrsecret42"', "hdrsecret42", "x-api-key"),
    ("--api-key 'quoted secret'", "quoted secret", "--api-key"),
    # prefixed flags (SGLang's --admin-api-key), --flag=VALUE forms, env and key=value styles
    ("sglang serve --admin-api-key adm1nSecret --port 8000", "adm1nSecret", "--port 8000"),
    ("sglang serve --admin-api-key=adm1nSecret --tp 1", "adm1nSecret", "--tp 1"),
    ("proxy --openai-api-key oaiSecret99 --x 1", "oaiSecret99", "--x 1"),
    ("proxy --openai-api-key=oaiSecret99", "oaiSecret99", "--openai-api-key="),
    ("vllm serve m --hf-token plainHFsecret", "plainHFsecret", "vllm serve m"),
    ("vllm serve m --hf-token=plainHFsecret --dtype bfloat16", "plainHFsecret", "--dtype"),
    ("x --auth-token t0k3n --y", "t0k3n", "--y"),
    ("x --db-password pw123456 --y", "pw123456", "--y"),
    ("ADMIN_API_KEY=admKey123 sglang serve", "admKey123", "sglang serve"),
    ("FOO_API_KEY='quoted key' ./serve", "quoted key", "./serve"),
    ("HF_TOKEN=plainTokenValue vllm serve", "plainTokenValue", "vllm serve"),
    ("HUGGING_FACE_HUB_TOKEN=plainTokenValue vllm serve", "plainTokenValue", "vllm serve"),
    ("error: hf_token=plainTokenValue rejected", "plainTokenValue", "rejected"),
    ('{"admin_api_key": "adm1nSecret"}', "adm1nSecret", '"admin_api_key"'),
    ('{"hf_token": "plainTokenValue"}', "plainTokenValue", '"hf_token"'),
]

UNTOUCHED = [
    "sglang serve --model-path m --tp 1 --mem-fraction-static 0.856257 --port 8000",
    "--max-tokens 4096 --tokenizer-path /models/tok --max-token 5",
    "monkey=banana tokens=12",
    "http://127.0.0.1:8000/v1/completions",
    "MAX_TOKENS=4096 TOKENIZERS_PARALLELISM=false ./serve --max-new-tokens 512",
    "max_tokens=12 --num-tokens 7 --token-budget 5",
]


@pytest.mark.parametrize("text,secret,kept", CASES)
def test_redact_removes_secret(text, secret, kept):
    out = redact(text)
    assert secret not in out
    assert REDACTED in out
    assert kept in out


@pytest.mark.parametrize("text", UNTOUCHED)
def test_redact_leaves_ordinary_text(text):
    assert redact(text) == text


def test_redact_empty_and_idempotent():
    assert redact("") == ""
    once = redact("--api-key abc --token def")
    assert redact(once) == once
    assert once.count(REDACTED) == 2


def test_redact_known_walks_everything():
    secret = "my-very-secret-key"
    obj = {"a": [f"x {secret} y", {"b": secret}], secret: 3, "n": 5, "t": (secret,)}
    out = redact_known(obj, [secret, "", None, "ab"])
    flat = repr(out)
    assert secret not in flat
    assert out["a"][0] == f"x {REDACTED} y"
    assert out["n"] == 5
    assert REDACTED in out  # dict keys too
    assert obj["a"][1]["b"] == secret  # input untouched


def test_redact_known_ignores_short_secrets():
    assert redact_known("a b c", ["a"]) == "a b c"
    assert redact_known("abc", []) == "abc"
