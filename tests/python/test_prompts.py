"""Exact-length prompts and request bodies, against a fake engine in this process (a token is
one whitespace-separated word, as in the built-in engine) and, when it is built, against the
built-in engine itself."""

from __future__ import annotations

import json

import pytest
from speedmatrix.adapters import (
    MetricsSpec,
    OutputControl,
    SGLangAdapter,
    Target,
    TGIAdapter,
    TokenizeSpec,
    discover,
)
from speedmatrix.prompts import (
    SALT_WORDS,
    Prompt,
    PromptError,
    PromptFactory,
    build_prompts,
    clear_calibrations,
    request_body,
)
from test_adapters import FakeServer, start_sim


@pytest.fixture(autouse=True)
def _fresh_calibrations():
    clear_calibrations()
    yield
    clear_calibrations()


class FakeEngine:
    """Counts tokens as whitespace words. ``bos``: tokens added to text prompts; ``id_bos``:
    tokens added to token-id prompts; ``template``: tokens the chat template adds;
    ``ids``: whether token-id prompts are accepted; ``tokenize``: whether /tokenize exists."""

    def __init__(self, bos=1, id_bos=0, template=5, ids=True, tokenize=True, messages=True):
        self.bos, self.id_bos, self.template = bos, id_bos, template
        self.vocab: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        routes = {
            "GET /v1/models": {"json": {"data": [{"id": "fake", "owned_by": "fake"}]}},
            "POST /v1/completions": self._completion,
            "POST /v1/chat/completions": self._chat,
        }
        if tokenize:
            routes["POST /tokenize"] = self._tokenize
        self.accept_ids, self.accept_messages = ids, messages
        self.server = FakeServer(routes)

    def _count(self, name: str, headers) -> None:
        if headers is not None:  # a real HTTP request, not reported()'s direct call
            self.calls[name] = self.calls.get(name, 0) + 1

    def _ids(self, text: str) -> list[int]:
        return [self.vocab.setdefault(w, 100 + len(self.vocab)) for w in text.split()]

    def _tokenize(self, body, headers):
        self._count("tokenize", headers)
        if "messages" in body:
            if not self.accept_messages:
                return 400, {"error": {"message": "messages not supported"}}
            ids = [1] * (self.bos + self.template) + self._ids(body["messages"][0]["content"])
        else:
            ids = [1] * self.bos + self._ids(body["prompt"])
        return 200, {"tokens": ids, "count": len(ids), "max_model_len": 1 << 20}

    def _completion(self, body, headers):
        self._count("completions", headers)
        prompt = body["prompt"]
        if isinstance(prompt, list):
            if not self.accept_ids:
                return 400, {"error": {"message": "prompt must be a string"}}
            n = self.id_bos + len(prompt)
        else:
            n = self.bos + len(prompt.split())
        return 200, {"choices": [{"text": "x"}], "usage": {"prompt_tokens": n}}

    def _chat(self, body, headers):
        self._count("chat", headers)
        n = self.bos + self.template + len(body["messages"][0]["content"].split())
        return 200, {"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": n}}

    def target(self, token_ids=None, tokenize=None) -> Target:
        return Target(
            self.server.url,
            engine="fake",
            model="fake",
            token_id_prompts=self.accept_ids if token_ids is None else token_ids,
            tokenize=(
                TokenizeSpec("/tokenize", "openai", messages=self.accept_messages)
                if tokenize is None
                else tokenize
            )
            or None,
            output=OutputControl(forced=True, ignore_eos=True, min_tokens_field="min_tokens"),
        )

    def reported(self, target: Target, api: str, prompt: Prompt) -> int:
        body = json.loads(request_body(target, api, prompt, 1, stream=False))
        handler = self._chat if api == "chat" else self._completion
        status, answer = handler(body, None)
        assert status == 200, answer
        return answer["usage"]["prompt_tokens"]

    def __enter__(self):
        self.server.__enter__()
        return self

    def __exit__(self, *exc):
        self.server.__exit__(*exc)


def first_words(prompt: Prompt, k: int) -> tuple:
    payload = prompt.payload
    if isinstance(payload, list) and payload and isinstance(payload[0], dict):
        payload = payload[0]["content"]
    items = payload.split() if isinstance(payload, str) else payload
    return tuple(items[:k])


CONTEXTS = [64, 1000, 8192, 32768]


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("id_bos", [0, 1])
def test_token_id_prompts_are_exact(context, id_bos):
    with FakeEngine(id_bos=id_bos) as eng:
        target = eng.target()
        prompts = build_prompts(target, context, 6, seed=7)
        for p in prompts:
            assert p.method == "token_ids" and p.kind == "token_ids" and p.verified
            assert p.tokens == context
            assert len(p.payload) == context - id_bos
            assert eng.reported(target, "completions", p) == context
            assert all(isinstance(t, int) for t in p.payload)
        # only the calibration probe generated anything
        assert eng.calls.get("completions") == 1


def test_token_ids_rejected_falls_back_to_text():
    with FakeEngine(ids=False) as eng:
        target = eng.target(token_ids=True)  # the adapter believed it would work
        p = build_prompts(target, 500, 1)[0]
        assert p.method == "tokenize" and p.kind == "text"
        assert eng.reported(target, "completions", p) == 500


def test_token_ids_without_tokenize_use_assumed_ids():
    with FakeEngine(tokenize=False) as eng:
        target = eng.target(tokenize=False)
        p = build_prompts(target, 300, 1)[0]
        assert p.method == "token_ids"
        assert len(p.payload) == 300
        assert all(1000 <= t < 30000 for t in p.payload)


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("bos", [0, 1, 2])
def test_text_prompts_via_tokenize_are_exact(context, bos):
    with FakeEngine(bos=bos, ids=False) as eng:
        target = eng.target()
        prompts = build_prompts(target, context, 4, seed="cell-a")
        for p in prompts:
            assert p.method == "tokenize" and p.kind == "text" and p.verified
            assert eng.reported(target, "completions", p) == context
        assert eng.calls.get("completions") is None  # nothing generated


def test_prompts_are_unique_from_the_first_token():
    with FakeEngine(ids=False) as eng:
        prompts = build_prompts(eng.target(), 256, 64, seed=1)
    firsts = [first_words(p, 1) for p in prompts]
    assert len(set(firsts)) == 64
    assert len({p.payload for p in prompts}) == 64


def test_prompts_are_reproducible_and_seeded():
    with FakeEngine(ids=False) as eng:
        target = eng.target()
        a = build_prompts(target, 200, 3, seed=1)
        b = build_prompts(target, 200, 3, seed=1)
        c = build_prompts(target, 200, 3, seed=2)
        later = PromptFactory(target, 200, seed=1).prompt(2)
    assert [p.payload for p in a] == [p.payload for p in b]
    assert a[2].payload == later.payload
    assert all(x.payload != y.payload for x, y in zip(a, c))


@pytest.mark.parametrize("ids", [True, False])
def test_shared_prefix_is_shared_then_salted(ids):
    k = 100
    with FakeEngine(bos=1, id_bos=1, ids=ids) as eng:
        target = eng.target()
        prompts = build_prompts(target, 1000, 5, shared_prefix=k, seed=3)
        for p in prompts:
            assert eng.reported(target, "completions", p) == 1000
    # the server's BOS is the first shared token, so K-1 items of payload are shared
    shared = {first_words(p, k - 1) for p in prompts}
    assert len(shared) == 1
    assert len({first_words(p, k - 1 + 1) for p in prompts}) == 5


@pytest.mark.parametrize("template", [0, 5, 17])
def test_chat_prompts_via_tokenize_messages(template):
    with FakeEngine(template=template, ids=True) as eng:
        target = eng.target()
        prompts = build_prompts(target, 2048, 3, api="chat")
        for p in prompts:
            assert p.kind == "messages" and p.method == "tokenize" and p.verified
            assert eng.reported(target, "chat", p) == 2048
        assert eng.calls.get("chat") is None


def test_chat_without_messages_tokenize_calibrates_by_usage():
    with FakeEngine(template=9, messages=False) as eng:
        target = eng.target()
        prompts = build_prompts(target, 4096, 3, api="chat")
        for p in prompts:
            assert p.method == "usage" and not p.verified
            assert eng.reported(target, "chat", p) == 4096
        assert eng.calls["chat"] == 2  # two tiny calibration requests, once per target


def test_usage_calibration_when_nothing_else_exists():
    with FakeEngine(bos=1, ids=False, tokenize=False) as eng:
        target = eng.target(tokenize=False)
        for context in (128, 9000):
            for p in build_prompts(target, context, 3):
                assert p.method == "usage" and not p.verified
                assert eng.reported(target, "completions", p) == context
        assert eng.calls["completions"] == 2
        assert "tokenize" not in eng.calls


def test_local_tokenizer_is_used_and_chat_overhead_learnt():
    def words(text: str) -> list[str]:
        return text.split()

    with FakeEngine(bos=1, template=6, ids=False, tokenize=False) as eng:
        target = eng.target(tokenize=False)
        for api, bos in (("completions", 0), ("chat", 7)):
            p = build_prompts(target, 700, 1, api=api, tokenizer=words)[0]
            assert p.method == "tokenizer" and p.verified
            # the local tokenizer adds no BOS: completions come out one short, as the local
            # tokenizer said; chat learnt the template + BOS from usage
            assert eng.reported(target, api, p) == 700 + (1 if api == "completions" else 0)
        assert eng.calls.get("chat") == 1
        assert "tokenize" not in eng.calls
        _ = bos


class _Encoding:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class _HubTokenizer:
    """Shaped like a Hugging Face tokenizer: ``encode`` gives ids (``transformers``) or an
    Encoding with ``.ids`` (``tokenizers``), with a BOS; calling it gives a dict, which must
    not be taken for a list of tokens."""

    def __init__(self, encoding: bool) -> None:
        self.encoding = encoding

    def encode(self, text: str):
        ids = [1] + [7] * len(text.split())  # BOS + one token per word
        return _Encoding(ids) if self.encoding else ids

    def __call__(self, text: str) -> dict:
        return {"input_ids": self.encode(text), "attention_mask": []}


@pytest.mark.parametrize("encoding", [False, True])
def test_a_hub_shaped_tokenizer_counts_with_encode(encoding):
    with FakeEngine(bos=1, ids=False, tokenize=False) as eng:
        target = eng.target(tokenize=False)
        p = build_prompts(target, 500, 1, tokenizer=_HubTokenizer(encoding))[0]
        assert p.method == "tokenizer"
        assert eng.reported(target, "completions", p) == 500  # it counts the BOS as the server


def test_prompt_errors_are_speedmatrix_errors():
    from speedmatrix.errors import SpeedmatrixError

    assert issubclass(PromptError, SpeedmatrixError)
    assert not issubclass(PromptError, RuntimeError)


def test_loading_a_tokenizer_without_a_tokenizer_package_says_what_to_install():
    import importlib.util

    from speedmatrix.errors import SpeedmatrixError
    from speedmatrix.prompts import load_tokenizer

    if importlib.util.find_spec("transformers") or importlib.util.find_spec("tokenizers"):
        pytest.skip("a tokenizer package is installed")
    with pytest.raises(SpeedmatrixError, match="pip install tokenizers"):
        load_tokenizer("gpt2")


def test_fit_gives_up_with_a_clear_error_on_a_strange_tokenizer():
    def two_per_word(text: str) -> int:
        return 2 * len(text.split())

    with FakeEngine(ids=False, tokenize=False) as eng:
        target = eng.target(tokenize=False)
        with pytest.raises(PromptError, match="exactly 1001 tokens"):
            build_prompts(target, 1001, 1, tokenizer=two_per_word)


def test_context_too_short_for_a_unique_prompt():
    with FakeEngine() as eng, pytest.raises(PromptError, match="too short"):
        build_prompts(eng.target(), SALT_WORDS - 1, 1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"context": 0}, "context: 0"),
        ({"context": 100, "shared_prefix": 100}, "shared_prefix: 100"),
        ({"context": 100, "api": "responses"}, "api: 'responses'"),
    ],
)
def test_factory_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PromptFactory(Target("http://127.0.0.1:9"), **kwargs)


# ---- request bodies -----------------------------------------------------------------------
def adapter_target(adapter) -> Target:
    return Target(
        "http://h:1",
        engine=adapter.name,
        model="m",
        output=adapter.output,
        stream_options=dict(adapter.stream_options) if adapter.stream_options else None,
        metrics=MetricsSpec(),
    )


def test_request_body_sglang_completions():
    body = json.loads(request_body(adapter_target(SGLangAdapter), "completions", [5, 6], 4096))
    assert body == {
        "model": "m",
        "prompt": [5, 6],
        "max_tokens": 4096,
        "ignore_eos": True,
        "min_tokens": 4096,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


def test_request_body_tgi_chat_cannot_force_length():
    prompt = Prompt([{"role": "user", "content": "a b"}], 3, "tokenize", True)
    body = json.loads(request_body(adapter_target(TGIAdapter), "chat", prompt, 64))
    assert body["messages"] == [{"role": "user", "content": "a b"}]
    assert "ignore_eos" not in body and "min_tokens" not in body
    assert body["stream_options"] == {"include_usage": True}


def test_request_body_extra_wins_and_no_stream_options_without_stream():
    target = adapter_target(SGLangAdapter)
    body = json.loads(
        request_body(
            target, "chat", "hi", 8, stream=False, extra={"temperature": 0, "min_tokens": 1}
        )
    )
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["temperature"] == 0 and body["min_tokens"] == 1
    assert body["stream"] is False and "stream_options" not in body


def test_request_body_rejects_mismatched_payloads():
    target = adapter_target(SGLangAdapter)
    with pytest.raises(ValueError, match="token-id prompts cannot be sent to the chat API"):
        request_body(target, "chat", [1, 2], 8)
    with pytest.raises(ValueError, match="chat messages cannot be sent to the completions"):
        request_body(target, "completions", [{"role": "user", "content": "x"}], 8)
    with pytest.raises(ValueError, match="api: 'x'"):
        request_body(target, "x", "hi", 8)


def test_request_body_is_compact_utf8_bytes():
    raw = request_body(adapter_target(SGLangAdapter), "completions", "héllo", 1)
    assert isinstance(raw, bytes)
    assert "héllo".encode() in raw and b", " not in raw


# ---- the built-in engine ------------------------------------------------------------------
@pytest.fixture(params=["sglang", "vllm"])
def sim(request):
    with start_sim(request.param) as url:
        yield url


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_prompts_are_exact_on_the_built_in_engine(sim, api):
    target = discover(sim)
    assert target.info.get("simulated")
    for context in (100, 2048):
        prompts = build_prompts(target, context, 3, api=api, seed=api)
        for p in prompts:
            body = json.loads(request_body(target, api, p, 1, stream=False))
            answer = target.client().post_json(
                "/v1/chat/completions" if api == "chat" else "/v1/completions", body
            )
            assert answer["usage"]["prompt_tokens"] == context, (p.method, context)


# A vocabulary where most words are several tokens (a tiny BPE, a model the tests do not
# ship) and a chat template that adds ~40 tokens: the fit converges from any start, and
# the last gap (the next word adds several tokens) is closed by one-token words.
def _multi_token_words(text: str) -> int:
    return 40 + sum(1 if w in ("a", "the") else 2 + len(w) % 3 for w in text.split())


@pytest.mark.parametrize("context", [256, 257, 1001, 1280, 3000])
def test_fit_converges_on_a_multi_token_vocabulary(context):
    with FakeEngine(ids=False, tokenize=False) as eng:
        target = eng.target(tokenize=False)
        (prompt,) = build_prompts(target, context, 1, tokenizer=_multi_token_words)
        assert _multi_token_words(prompt.payload) == context
