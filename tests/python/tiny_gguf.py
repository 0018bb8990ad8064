"""A tiny random-weight GGUF model that llama.cpp's ``llama-server`` loads: llama
architecture, a byte-level BPE vocabulary (GPT-2 style: the 256 bytes, a few merges, BOS/EOS
and chat markers) and a chat template. Test-only: written with the ``gguf`` package in well
under a second, a few hundred KB.

    write_tiny_model(path, n_ctx_train=4096, words=WORDS, template="plain") -> path

``words`` become whole tokens (with and without the leading-space marker), merged letter
by letter, so text of those words is about one token per word, as in a real vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shape:
    """Layer sizes. TINY (the default) makes steps far under a millisecond; SMALL makes
    each decode step cost real compute (a few ms on two cores) that grows with the context,
    so a figure's noise from the client sharing the cores is small beside it."""

    n_embd: int = 64
    n_head: int = 4
    n_layer: int = 2
    n_ff: int = 128


TINY = Shape()
SMALL = Shape(n_embd=384, n_head=6, n_layer=6, n_ff=1024)
#: the chat template: role markers are ordinary text, so the server's own
#: /apply-template + /tokenize count is the exact prompt
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
#: a second template, unlike the first: a system line and role tags, ~40 tokens around a
#: user message with a vocabulary of bytes (words=(): no word is one token), as real
#: templates add
VERBOSE_CHAT_TEMPLATE = (
    "[SYSTEM]Be brief.\n"
    "{% for message in messages %}[{{ message['role'] | upper }}] {{ message['content'] }}"
    "[/{{ message['role'] | upper }}]\n{% endfor %}"
    "{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
)
TEMPLATES = {"plain": CHAT_TEMPLATE, "verbose": VERBOSE_CHAT_TEMPLATE}


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode map: each byte as a printable character (what llama.cpp's
    byte-level BPE expects in the vocabulary)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 256))
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    table = dict(zip(keep, chars, strict=True))
    return [chr(table[b]) for b in range(256)]


def _word_merges(words) -> tuple[list[str], list[str]]:
    """(new tokens, merges) that build each word (and "Ġ" + word) left to right."""
    tokens: dict[str, None] = {}
    merges: dict[str, None] = {}
    # The "Ġ" (space-led) chains rank first: BPE applies the best-ranked pair anywhere in
    # a word, and a plain chain's inner pair ("t h") would otherwise split "Ġthe" in two.
    pieces = ["Ġ" + w for w in words] + list(words)
    for piece in pieces:
        for i in range(2, len(piece) + 1):
            merges[f"{piece[: i - 1]} {piece[i - 1]}"] = None
            tokens[piece[:i]] = None
    return list(tokens), list(merges)


def write_tiny_model(
    path: Path | str,
    n_ctx_train: int = 4096,
    seed: int = 0,
    words=(),
    template: str = "plain",
    shape: Shape = TINY,
) -> Path:
    """``template``: a name in TEMPLATES (the chat template the server applies)."""
    import gguf  # test dependency (pyproject extras "test")

    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens = _byte_tokens()
    word_tokens, merges = _word_merges(words)
    tokens += [t for t in word_tokens if t not in set(tokens)]
    specials = ["<s>", "</s>"]
    bos, eos = len(tokens), len(tokens) + 1
    tokens += specials
    types = [gguf.TokenType.NORMAL] * (len(tokens) - 2) + [gguf.TokenType.CONTROL] * 2
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head)
    w.add_rope_dimension_count(shape.n_embd // shape.n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(TEMPLATES[template])

    def t(name: str, *shape: int, scale: float = 0.02) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def ones(name: str) -> None:
        w.add_tensor(name, np.ones(embd, dtype=np.float32))

    embd, ff = shape.n_embd, shape.n_ff
    t("token_embd.weight", n_vocab, embd, scale=1.0)
    for i in range(shape.n_layer):
        ones(f"blk.{i}.attn_norm.weight")
        for part in ("q", "k", "v", "output"):
            t(f"blk.{i}.attn_{part}.weight", embd, embd)
        ones(f"blk.{i}.ffn_norm.weight")
        t(f"blk.{i}.ffn_gate.weight", ff, embd)
        t(f"blk.{i}.ffn_up.weight", ff, embd)
        t(f"blk.{i}.ffn_down.weight", embd, ff)
    ones("output_norm.weight")
    t("output.weight", n_vocab, embd, scale=1.0)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":
    import sys

    print(write_tiny_model(sys.argv[1] if len(sys.argv) > 1 else "tiny.gguf"))
