"""A tiny random-weight Hugging Face Llama that vLLM serves: ``LlamaConfig`` with two
layers, random weights, a byte-level BPE tokenizer built with ``tokenizers`` from a few
words, and a chat template. Everything is made here: no model hub.

Runs with the Python of vLLM's venv (scripts/vllm.sh), which has torch, transformers and
tokenizers; speedmatrix's own Python needs none of them:

    <venv>/bin/python scripts/tiny_hf.py DEST

writes the model folder DEST (about 1 MB) unless DEST/config.json is already there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: the chat template: role markers are special tokens, so a chat's prompt is longer than
#: its text by a fixed number of tokens that only the server's template knows
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>"
    "{{ message['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
#: the position table: long enough for every launch of the tests (max_model_len <= this)
MAX_POSITIONS = 4096
#: a vocabulary of common words (as the prompt maker writes) so text is about a token a word
WORDS = (  # noqa: SIM905 - a sentence reads better than 80 quoted words
    "the of and to in is was for on that with as by at from his her it an were are which "
    "this be or has had not but first one their its new after who they have two been also "
    "time year city world work school state house music team game system number river "
    "light water north south east west small large early late long short high low open "
    "under over between during before since about against among around through along"
).split()


def write_tiny_hf(dest: Path | str, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    dest = Path(dest)
    if (dest / "config.json").is_file() and (dest / "tokenizer.json").is_file():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 4
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=SPECIAL[2:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(tmp)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head size 64: one vLLM's CPU attention supports
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(tmp, safe_serialization=True)
    (tmp / "generation_config.json").write_text(
        json.dumps({"bos_token_id": fast.bos_token_id, "eos_token_id": fast.eos_token_id})
    )
    if dest.exists():  # another process finished first: keep its model
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.replace(dest)
    return dest


if __name__ == "__main__":
    print(write_tiny_hf(sys.argv[1]))
