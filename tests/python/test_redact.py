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


# Each engine family's real launch flags (and the shapes issue 14 found missed): the secret
# values vanish, the flags and every other argument stay.
LAUNCH_FLAGS = [
    # (command, secrets that must vanish, text that must stay)
    (
        "lmdeploy serve api_server internlm/internlm2-7b --api-keys K1secret K2secret --server-port 23333",
        ["K1secret", "K2secret"],
        ["internlm/internlm2-7b", "--server-port 23333"],
    ),
    (
        "lmdeploy serve api_server m --api-keys=K1secret K2secret",
        ["K1secret", "K2secret"],
        ["api_server m"],
    ),
    (
        "python -m sglang.launch_server --model-path m --api-key sgKey1 --admin-api-key adKey2",
        ["sgKey1", "adKey2"],
        ["--model-path m"],
    ),
    (
        "vllm serve m --api-key vlKey1 --hf-token hfTok2 --port 8000",
        ["vlKey1", "hfTok2"],
        ["vllm serve m", "--port 8000"],
    ),
    (
        "text-generation-launcher --model-id m --hf-api-token hfTok3 --port 80",
        ["hfTok3"],
        ["--model-id m", "--port 80"],
    ),
    ("llama-server -m model.gguf --api-key lcKey4 --port 8080", ["lcKey4"], ["-m model.gguf"]),
    ("trtllm-serve m --secret-key trtSec5 --host 0.0.0.0", ["trtSec5"], ["--host 0.0.0.0"]),
    (
        "minio-proxy --access-key AKsecret6 --secret-key SKsecret7",
        ["AKsecret6", "SKsecret7"],
        ["minio-proxy"],
    ),
    ("sky launch --env HF_TOKEN hfTok8 serve.yaml", ["hfTok8"], ["--env HF_TOKEN"]),
    ("docker run -e HUGGING_FACE_HUB_TOKEN hfTok9 -p 8000:8000 img", ["hfTok9"], ["-p 8000:8000"]),
    ("curl -u alice:pa55w0rd http://h/v1/models", ["pa55w0rd"], ["alice", "http://h/v1/models"]),
    ("curl --user alice:pa55w0rd http://h/", ["pa55w0rd"], ["alice"]),
    ("gateway --auth basicAuthV --port 1", ["basicAuthV"], ["--port 1"]),
    ("gateway --credentials credV1 --x 1", ["credV1"], ["--x 1"]),
    ("ssh-agent --passphrase passV1 --x 1", ["passV1"], ["--x 1"]),
    ("gateway --jwt eyJhbGciOi.eyJzdWIi.sig --x 1", ["eyJhbGciOi.eyJzdWIi.sig"], ["--x 1"]),
    ("gateway --jwt-secret jwtSec1 --x 1", ["jwtSec1"], ["--x 1"]),
    ("ollama serve", [], ["ollama serve"]),
    ("server --disable-auth --port 8000", [], ["--disable-auth --port 8000"]),
]


@pytest.mark.parametrize("cmd,secrets,kept", LAUNCH_FLAGS)
def test_launch_flags_of_every_engine_family(cmd, secrets, kept):
    out = redact(cmd)
    for s in secrets:
        assert s not in out, out
    for k in kept:
        assert k in out, out
    assert out.count(REDACTED) >= len(secrets)


@pytest.mark.parametrize(
    ("text", "secrets", "kept"),
    [
        # vLLM's --api-key takes several keys: every value up to the next flag is redacted
        (
            "vllm serve m --api-key K1secret K2secret --port 8000",
            ["K1secret", "K2secret"],
            ["--port 8000"],
        ),
        ("vllm serve m --api-key=K1secret K2secret", ["K1secret", "K2secret"], ["vllm serve m"]),
        # ... but never the next command of a shell line
        ("vllm serve m --api-key K1secret && curl localhost", ["K1secret"], ["&& curl localhost"]),
        # NAME:VALUE and NAME: VALUE (docker/compose/k8s env lists, YAML)
        ("docker run -e HF_TOKEN:hfPlainSecret1 img", ["hfPlainSecret1"], ["docker run", "img"]),
        (
            "env:\n  HF_TOKEN: hfPlainSecret2\n  MAX_TOKENS: 4096",
            ["hfPlainSecret2"],
            ["MAX_TOKENS: 4096"],
        ),
    ],
)
def test_every_value_of_a_secret_flag_and_name_colon_value(text, secrets, kept):
    out = redact(text)
    for s in secrets:
        assert s not in out, out
    for k in kept:
        assert k in out, out
