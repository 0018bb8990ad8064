"""Prompts of an exact token length, and the request bodies that carry them.

Every request of a cell gets a prompt of exactly ``context`` tokens as the server counts them
(``usage.prompt_tokens``). Prompts are unique per request: a salt (a few words or token ids
derived from the seed and the request's index) sits at the very start, so no two requests
share a prefix. With ``shared_prefix = K`` the first K tokens are the same for every request
of the factory and the salt follows them.

How the length is made exact, in order of preference:

1. ``token_ids`` — the engine takes a list of token ids as ``prompt`` (vLLM, SGLang,
   TensorRT-LLM, llama.cpp; completions API only). Ids of ordinary words are taken from the
   tokenize endpoint (or an assumed range of ids when there is none). One tiny request checks
   the engine accepts them and learns whether it adds tokens of its own (a BOS).
2. ``tokenizer`` — a user-given local tokenizer counts the text (chat: plus the chat
   template's tokens, learnt once): ``callable(text) -> int | list``, or an object with
   ``encode(text)`` (a Hugging Face tokenizer; :func:`load_tokenizer` loads one by name). It
   must count as the server does, special tokens (a BOS) included.
3. ``tokenize`` — text built from common words, counted by the server's tokenize endpoint
   (with ``messages`` for the chat API where the endpoint applies the chat template) and
   adjusted until the count is exact: the tokens a filler word adds are measured, not
   assumed to be one, and pieces of one token fill what whole words cannot.
4. ``usage`` — no way to count: two tiny non-streaming requests learn the server's overhead
   and tokens per word from ``usage.prompt_tokens``; prompts are built from that and marked
   unverified, and the runner checks ``usage.prompt_tokens`` of every request.

The runner checks the reported prompt tokens of every request against ``Prompt.tokens``.

The words and the salt live in ``speedmatrix.promptwords``, the local tokenizer in
``speedmatrix.localtokenizer``; both are re-exported here.

Over 500 lines: the four ways of making a length exact share the factory's calibration, the
search and the request body; apart they would each need the others.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from speedmatrix.adapters.base import Target, TokenizeSpec
from speedmatrix.errors import SpeedmatrixError
from speedmatrix.http import ConnectError, HttpClient, HttpError
from speedmatrix.localtokenizer import load_tokenizer
from speedmatrix.localtokenizer import local_count as _local_count
from speedmatrix.promptwords import SALT_WORDS, WORDS
from speedmatrix.promptwords import pick as _pick
from speedmatrix.promptwords import rng as _rng
from speedmatrix.promptwords import salt_ids as _salt_ids
from speedmatrix.promptwords import salt_words as _salt_words
from speedmatrix.promptwords import words as _words

__all__ = [
    "METHODS",
    "SALT_WORDS",
    "WORDS",
    "Prompt",
    "PromptError",
    "PromptFactory",
    "build_prompts",
    "clear_calibrations",
    "load_tokenizer",
    "request_body",
]

METHODS = ("token_ids", "tokenizer", "tokenize", "usage")

_MAX_FIT_ROUNDS = 12
#: the longest a calibration request (one token of a prompt of at most 128 words) may take:
#: a server that holds it longer is stalled, and is said to be, not waited for 120 s
CALIBRATION_TIMEOUT_S = 30.0


class PromptError(SpeedmatrixError):
    """A prompt of the asked length could not be made: the server's (or the tokenizer's)
    doing, not a bug, so it is reported as one line (a sweep records it in the cell)."""


@dataclass(frozen=True)
class Prompt:
    """One request's prompt.

    ``payload`` is a list of token ids, a text, or chat messages; ``tokens`` the prompt
    tokens the server should report; ``verified`` says the count was confirmed for this exact
    payload (False for the ``usage`` method: the runner's per-request check decides).
    """

    payload: list[int] | str | list[dict[str, str]]
    tokens: int
    method: str
    verified: bool
    index: int = 0
    shared_prefix: int = 0

    @property
    def kind(self) -> str:
        if isinstance(self.payload, str):
            return "text"
        if self.payload and isinstance(self.payload[0], dict):
            return "messages"
        return "token_ids"


# ---- counting -----------------------------------------------------------------------------
@dataclass
class _Calibration:
    """What one target+api needs learnt once: the method, token-id pool, overheads."""

    method: str
    overhead: int = 0  # tokens the server adds (BOS, chat template) around the payload
    ids: list[int] = field(default_factory=list)  # token-id pool of ordinary words
    per_word: float = 1.0  # usage method: tokens per filler word
    note: str = ""


_CALIBRATIONS: dict[tuple, _Calibration] = {}


def clear_calibrations() -> None:
    """Forget what was learnt about servers (after a server restarts with other settings)."""
    _CALIBRATIONS.clear()


class PromptFactory:
    """Prompts of ``context`` tokens for one target and API.

    ``prompts(n)`` returns n unique prompts (indices 0..n-1; the same seed and index give the
    same prompt). ``client`` (or ``api_key``) is used for the tokenize endpoint and
    calibration requests; ``tokenizer`` is an optional local tokenizer.
    """

    def __init__(
        self,
        target: Target,
        context: int,
        *,
        api: str = "completions",
        shared_prefix: int = 0,
        seed: int | str = 0,
        tokenizer: Callable[[str], int | list] | None = None,
        client: HttpClient | None = None,
        api_key: str | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        if api not in ("completions", "chat"):
            raise ValueError(f"api: {api!r} is not one of completions, chat")
        if not isinstance(context, int) or context <= 0:
            raise ValueError(f"context: {context!r} is not a positive token count")
        if shared_prefix < 0 or (shared_prefix and shared_prefix >= context):
            raise ValueError(
                f"shared_prefix: {shared_prefix} must be below the context ({context})"
            )
        self.target = target
        self.context = context
        self.api = api
        self.shared_prefix = shared_prefix
        self.seed = seed
        self.tokenizer = tokenizer
        # the target's client configuration (key, Basic auth, TLS) as discovery used it
        self.client = client or HttpClient(
            target.url, api_key, timeout_s, config=target.client_config
        )
        self._cal: _Calibration | None = None
        self._filler_words: int | None = None  # words of filler that gave the exact count
        # the filler is the same for every index (only the start differs): made once
        self._filler_cache: dict[str, list] = {}

    # -- public --
    @property
    def method(self) -> str:
        return self._calibration().method

    def prompts(self, n: int, start: int = 0) -> list[Prompt]:
        return [self.prompt(i) for i in range(start, start + n)]

    def prompt(self, index: int) -> Prompt:
        cal = self._calibration()
        if cal.method == "token_ids":
            return self._token_id_prompt(index, cal)
        return self._text_prompt(index, cal)

    # -- calibration --
    def _calibration(self) -> _Calibration:
        if self._cal is None:
            key = (
                self.target.url,
                self.target.model,
                self.api,
                self.target.token_id_prompts,
                self.target.tokenize,
                id(self.tokenizer),
            )
            if key not in _CALIBRATIONS:
                _CALIBRATIONS[key] = self._calibrate()
            self._cal = _CALIBRATIONS[key]
        return self._cal

    def _calibrate(self) -> _Calibration:
        if self.api == "completions" and self.target.token_id_prompts:
            cal = self._calibrate_token_ids()
            if cal is not None:
                return cal
        if self.tokenizer is not None:
            overhead = 0
            if self.api == "chat":
                overhead = self._chat_overhead()
            return _Calibration("tokenizer", overhead=overhead)
        tok = self.target.tokenize
        if tok is not None and (self.api == "completions" or tok.messages):
            cal = _Calibration("tokenize")
            one: Any = WORDS[0]
            if self.api == "chat":
                one = [{"role": "user", "content": one}]
            try:
                cal.overhead = max(0, self._counter(cal)(one) - 1)
            except (HttpError, ValueError) as exc:
                raise PromptError(f"the tokenize endpoint {tok.path} failed: {exc}") from None
            return cal
        return self._calibrate_usage()

    def _calibrate_token_ids(self) -> _Calibration | None:
        pool, source = self._id_pool()
        probe = _pick(pool, 16, _rng(self.seed, "probe"))
        try:
            reported = self._usage_prompt_tokens(probe)
        except (HttpError, PromptError):
            return None
        overhead = reported - len(probe)
        if overhead < 0 or overhead > 8:
            return None  # the server does not take these ids literally: use text
        return _Calibration("token_ids", overhead=overhead, ids=pool, note=source)

    def _id_pool(self) -> tuple[list[int], str]:
        tok = self.target.tokenize
        if tok is not None:
            try:
                words = _count_ids(self.client, tok, self.target.model, " ".join(WORDS))[1]
                one = _count_ids(self.client, tok, self.target.model, WORDS[0])[1]
                two = _count_ids(self.client, tok, self.target.model, WORDS[1])[1]
            except (HttpError, ValueError):
                words = one = two = None
            if words and one and two:
                head = _common_prefix(one, two)
                tail = _common_prefix(one[::-1], two[::-1])
                body = words[head : len(words) - tail] if tail else words[head:]
                pool = list(dict.fromkeys(body))
                if len(pool) >= 32:
                    return pool, "ids of common words from the tokenize endpoint"
        # No tokenizer to ask: ids in this range are ordinary tokens in every vocabulary of
        # 32k tokens or more; the calibration request confirms the server takes them.
        return list(range(1000, 30000)), "assumed ordinary ids 1000..29999"

    def _chat_overhead(self) -> int:
        """Tokens the chat template adds around a user message, from usage."""
        text = " ".join(_words(_rng(self.seed, "chat"), 32))
        local = _local_count(self.tokenizer, text)
        return self._usage_prompt_tokens(text) - local

    def _calibrate_usage(self) -> _Calibration:
        rng = _rng(self.seed, "usage")
        small = " ".join(_words(rng, 32))
        large = small + " " + " ".join(_words(rng, 96))
        n_small = self._usage_prompt_tokens(small)
        n_large = self._usage_prompt_tokens(large)
        per_word = (n_large - n_small) / 96
        if per_word <= 0:
            raise PromptError(
                f"usage.prompt_tokens did not grow with the prompt ({n_small} then {n_large})"
            )
        overhead = round(n_small - 32 * per_word)
        return _Calibration(
            "usage",
            overhead=overhead,
            per_word=per_word,
            note="calibrated from usage.prompt_tokens; prompt lengths unverified",
        )

    def _usage_prompt_tokens(self, payload: list[int] | str) -> int:
        """usage.prompt_tokens of one tiny non-streaming request."""
        body = json.loads(request_body(self.target, self.api, payload, 1, stream=False, extra=None))
        path = "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        try:
            answer = self.client.post_json(path, body, timeout_s=CALIBRATION_TIMEOUT_S)
        except ConnectError as exc:
            if not exc.reason.startswith(("no answer within", "the answer did not end within")):
                raise  # refused, unresolvable: the server cannot be reached
            # it took the request and held it: stalled or busy, not unreachable
            raise PromptError(
                f"calibration: POST {path} (1 token of a short prompt) was accepted but "
                f"{exc.reason.replace('no answer', 'got no answer')}; the server is stalled "
                "or busy (is another job running on it?)"
            ) from None
        usage = answer.get("usage") if isinstance(answer, dict) else None
        tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if not isinstance(tokens, int):
            raise PromptError(f"{path} answered without usage.prompt_tokens")
        return tokens

    # -- token-id prompts --
    def _token_id_prompt(self, index: int, cal: _Calibration) -> Prompt:
        body_len = self.context - cal.overhead
        prefix_len = max(0, self.shared_prefix - cal.overhead) if self.shared_prefix else 0
        if body_len < SALT_WORDS + prefix_len:
            raise PromptError(
                f"context {self.context} is too short for a unique prompt "
                f"({cal.overhead} server tokens + {SALT_WORDS} salt)"
            )
        prefix = self._filler("prefix-ids", prefix_len, cal)
        salt = _salt_ids(cal.ids, self.seed, index)
        filler = self._filler("filler-ids", body_len - prefix_len - len(salt), cal)
        ids = prefix + salt + filler
        return Prompt(ids, self.context, "token_ids", True, index, self.shared_prefix)

    # -- text prompts --
    def _text_prompt(self, index: int, cal: _Calibration) -> Prompt:
        prefix_words = self._filler("prefix-words", self._prefix_word_count(cal), cal)
        salt = _salt_words(self.seed, index)

        def make(k: int, pad: str = "") -> str | list[dict[str, str]]:
            filler = self._filler("filler-words", k, cal)
            text = " ".join(prefix_words + salt + filler) + pad
            if self.api == "chat":
                return [{"role": "user", "content": text}]
            return text

        fixed = len(prefix_words) + len(salt)
        if cal.method == "usage":
            k = round((self.context - cal.overhead) / cal.per_word) - fixed
            if k < 0:
                raise PromptError(f"context {self.context} is too short for a unique prompt")
            return Prompt(make(k), self.context, "usage", False, index, self.shared_prefix)

        count = self._counter(cal)
        k0 = self._filler_words
        if k0 is None:
            k0 = self.context - cal.overhead - fixed
        k, pad = self._fit(make, count, max(k0, 0))
        self._filler_words = k
        return Prompt(make(k, pad), self.context, cal.method, True, index, self.shared_prefix)

    def _filler(self, kind: str, k: int, cal: _Calibration) -> list:
        """The first k items of this factory's ``kind`` sequence (seeded, fixed per factory)."""
        have = self._filler_cache.get(kind, [])
        if len(have) < k:
            rng = _rng(self.seed, kind)
            if kind.endswith("-ids"):
                have = _pick(cal.ids, max(k, 2 * len(have)), rng)
            else:
                have = _words(rng, max(k, 2 * len(have)))
            self._filler_cache[kind] = have
        return have[:k]

    def _prefix_word_count(self, cal: _Calibration) -> int:
        if not self.shared_prefix:
            return 0
        # approximate for text: words are about one token each
        return max(0, round((self.shared_prefix - cal.overhead) / cal.per_word))

    def _counter(self, cal: _Calibration) -> Callable[[Any], int]:
        if cal.method == "tokenizer":
            tokenizer = self.tokenizer

            def count_local(payload: Any) -> int:
                text = payload[0]["content"] if isinstance(payload, list) else payload
                return _local_count(tokenizer, text) + cal.overhead

            return count_local
        tok = self.target.tokenize
        assert tok is not None

        def count_remote(payload: Any) -> int:
            if isinstance(payload, list):
                return tok.count(self.client, self.target.model, messages=payload)[0]
            return tok.count(self.client, self.target.model, payload)[0]

        return count_remote

    def _fit(
        self, make: Callable[..., Any], count: Callable[[Any], int], k: int
    ) -> tuple[int, str]:
        """Filler words k and a pad such that count(make(k, pad)) == context.

        Converges from any start: the tokens per filler word are measured (a secant over
        the counts, inside a bracket), not assumed to be one, so a template that adds
        many tokens or a vocabulary that splits words into bytes is met in a few counts.
        When one word more overshoots, short pad pieces that count one token each fill
        the last tokens."""
        seen: dict[int, int] = {}
        lo: int | None = None  # most words known to count below the context
        hi: int | None = None  # fewest words known to count above it
        slope = 1.0
        for _ in range(_MAX_FIT_ROUNDS):
            n = count(make(k))
            seen[k] = n
            if n == self.context:
                return k, ""
            if n < self.context:
                lo = k if lo is None else max(lo, k)
            else:
                hi = k if hi is None else min(hi, k)
            if lo is not None and hi is not None and hi - lo <= 1:
                break
            near = [j for j in seen if j != k]
            if near:
                j = min(near, key=lambda j: abs(j - k))
                if seen[j] != n:
                    slope = max((n - seen[j]) / (k - j), 1e-3)
            k_next = k + round((self.context - n) / slope)
            low = 0 if lo is None else lo + 1
            k_next = max(k_next, low)
            if hi is not None:
                k_next = min(k_next, hi - 1)
            if k_next in seen or k_next == k:
                if lo is None or hi is None:
                    k_next = k + (1 if n < self.context else -1)
                else:
                    k_next = (lo + hi) // 2
                if k_next in seen or k_next < 0:
                    break
            k = k_next
        if lo is not None:
            pad = self._pad(make, count, lo, seen[lo])
            if pad is not None:
                return lo, pad
        raise PromptError(
            f"could not make a prompt of exactly {self.context} tokens "
            f"(counts seen: {sorted(set(seen.values()))[:6]})"
        )

    def _pad(
        self, make: Callable[..., Any], count: Callable[[Any], int], k: int, n: int
    ) -> str | None:
        """A pad of short pieces that brings count(make(k)) == n up to the context, or None:
        each candidate piece is tried where it counts one token."""
        need = self.context - n
        for piece in _PAD_PIECES:
            m = need
            for _ in range(3):
                got = count(make(k, piece * m))
                if got == self.context:
                    return piece * m
                if m <= 0 or got == n:
                    break
                per_piece = (got - n) / m
                m_next = round(need / per_piece)
                if m_next == m or m_next <= 0:
                    break
                m = m_next
        return None


#: pad pieces that most vocabularies count as one token each, in order of preference
_PAD_PIECES = (" a", " .", ".", " 1", "\n")


def build_prompts(
    target: Target,
    context: int,
    n: int,
    *,
    api: str = "completions",
    shared_prefix: int = 0,
    seed: int | str = 0,
    tokenizer: Callable[[str], int | list] | None = None,
    client: HttpClient | None = None,
) -> list[Prompt]:
    """n unique prompts of exactly ``context`` tokens (see :class:`PromptFactory`)."""
    factory = PromptFactory(
        target,
        context,
        api=api,
        shared_prefix=shared_prefix,
        seed=seed,
        tokenizer=tokenizer,
        client=client,
    )
    return factory.prompts(n)


# ---- request bodies -----------------------------------------------------------------------
def request_body(
    target: Target,
    api: str,
    prompt: Prompt | list[int] | str | list[dict[str, str]],
    max_tokens: int,
    stream: bool = True,
    extra: dict[str, Any] | None = None,
) -> bytes:
    """The JSON body of one generation request.

    Sets the model, the prompt (``prompt`` for completions, ``messages`` for chat), the
    engine's fields that force the output to ``max_tokens`` (ignore_eos / min_tokens where it
    has them), ``stream`` and, when streaming, the engine's ``stream_options`` (usage in every
    chunk where supported). ``extra`` is merged last and wins.
    """
    payload = prompt.payload if isinstance(prompt, Prompt) else prompt
    body: dict[str, Any] = {}
    if target.model:
        body["model"] = target.model
    if api == "completions":
        if isinstance(payload, list) and payload and isinstance(payload[0], dict):
            raise ValueError("chat messages cannot be sent to the completions API")
        body["prompt"] = payload
    elif api == "chat":
        if isinstance(payload, str):
            payload = [{"role": "user", "content": payload}]
        elif not (isinstance(payload, list) and payload and isinstance(payload[0], dict)):
            raise ValueError("token-id prompts cannot be sent to the chat API")
        body["messages"] = payload
    else:
        raise ValueError(f"api: {api!r} is not one of completions, chat")
    body.update(target.output.fields(api, max_tokens))
    body["stream"] = bool(stream)
    if stream and target.stream_options is not None:
        body["stream_options"] = dict(target.stream_options)
    if extra:
        body.update(extra)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# ---- helpers ------------------------------------------------------------------------------
def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _count_ids(
    client: HttpClient, tok: TokenizeSpec, model: str | None, text: str
) -> tuple[int, list[int] | None]:
    return tok.parse(client.post_json(tok.path, tok.request(model, text)))
