"""Writes a tiny tokenizer into each checkpoint of tests/data/backbones/ so the run entry points load them.

The tiny Gemma 4 / Qwen3.5 checkpoints (``scripts/make_backbone_fixtures.py``) have a 256-row vocabulary, too
small for a real tokenizer, so ``--model tests/data/backbones/<arch>`` needs one of its own that fits:

    .venv/bin/python scripts/make_backbone_tokenizer.py       # rewrites tokenizer.json + tokenizer_config.json

Each tokenizer is a byte-level BPE with SmolLM2's pre-tokenizer (``Digits(individual_digits=True)`` then the
GPT-2 ``ByteLevel`` regex: the split rules :mod:`jaxopt_marl.prompt_ids` builds its fragments on) whose alphabet is
the bytes of printable ASCII, tab and newline (every byte the games' prompts use), with the letter tokens
" A" .. " Z" as single tokens (the menu answers) and merges learnt by ``tokenizers``' ``BpeTrainer`` on the
games' system messages and the prompt sources, up to :data:`VOCAB` ids in all. The chat template and the special
tokens follow each family's format (the model reads whatever ``tokenizer_config.json`` says, as for a real
checkpoint): ChatML for Qwen3.5 (``<|im_start|>`` / ``<|im_end|>``, a system turn of its own, so the shared
system-turn prefix is long), a Gemma-style turn template for Gemma 4 (no system role: the system text opens the
first user turn, the assistant speaks as "model"; the ids of ``<pad>``, ``<eos>``, ``<bos>`` are the fixtures'
``pad_token_id`` 0, ``eos_token_id`` 1, ``bos_token_id`` 2). The output is deterministic (the trainer on a fixed
corpus).
"""

from __future__ import annotations

import json
import os
import string
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(ROOT, "tests", "data", "backbones")
#: Ids of the tokenizer: the checkpoints' vocab_size.
VOCAB = 256

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The Gemma-style template of tests/test_lora_backbones.py (written for these tests, in Gemma's format).
GEMMA_STYLE_TEMPLATE = (
    "{{ bos_token }}{% set sys = '' %}{% if messages[0]['role'] == 'system' %}"
    "{% set sys = messages[0]['content'] + '\\n\\n' %}{% set messages = messages[1:] %}{% endif %}"
    "{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ (sys if loop.first else '') + m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
FAMILIES = {
    "qwen3_5": dict(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        config=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML_TEMPLATE),
    ),
    "gemma4": dict(
        specials=["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
        config=dict(bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", chat_template=GEMMA_STYLE_TEMPLATE),
    ),
}
DIRS = {"gemma4": "gemma4", "gemma4_e2b": "gemma4", "qwen3_5": "qwen3_5"}


def corpus() -> list[str]:
    """The training text: every game's system message under every interface, and the prompt sources."""
    sys.path.insert(0, ROOT)
    from jaxopt_marl import games, interfaces
    from jaxopt_marl.config import INTERFACES

    texts = [interfaces.system_message(g, i) for g in games.GAMES for i in INTERFACES]
    for rel in ("jaxopt_marl/prompts.py", "jaxopt_marl/menus.py", "jaxopt_marl/interfaces.py"):
        with open(os.path.join(ROOT, rel)) as f:
            texts.append(f.read())
    return texts


def build(specials: list[str]):
    """The ``tokenizers.Tokenizer`` of one family (module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_char = {b: c for b, c in zip(_byte_order(), _gpt2_chars())}
    chars = sorted({byte_char[ord(c)] for c in string.printable if c not in "\r\x0b\x0c"})
    assert set(chars) <= set(alphabet)
    letters = [byte_char[ord(" ")] + c for c in string.ascii_uppercase]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    # Room for the letter merges the trainer may not learn.
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(letters),
        special_tokens=specials,
        initial_alphabet=chars,
        limit_alphabet=len(chars),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    model = json.loads(tok.to_str())["model"]
    vocab, merges = (
        dict(model["vocab"]),
        [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]],
    )
    for pair, joined in zip([(letters[0][0], c) for c in string.ascii_uppercase], letters):
        if joined not in vocab:
            vocab[joined] = len(vocab)
            merges.append(pair)
    assert len(vocab) <= VOCAB, len(vocab)
    out = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    out.pre_tokenizer, out.decoder = tok.pre_tokenizer, tok.decoder
    from tokenizers import AddedToken

    out.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return out


def _byte_order() -> list[int]:
    """GPT-2 ``bytes_to_unicode``'s byte order: printable bytes first, the rest after."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    return keep + [b for b in range(256) if b not in keep]


def _gpt2_chars() -> list[str]:
    """The characters GPT-2's byte-level alphabet gives the bytes of :func:`_byte_order`."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    return [chr(b) for b in keep] + [chr(256 + i) for i in range(256 - len(keep))]


def main() -> None:
    for arch, family in DIRS.items():
        spec = FAMILIES[family]
        directory = os.path.join(DATA, arch)
        tok = build(spec["specials"])
        tok.save(os.path.join(directory, "tokenizer.json"))
        config = dict(spec["config"], tokenizer_class="PreTrainedTokenizerFast", clean_up_tokenization_spaces=False)
        with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
            json.dump(config, f, indent=1)
        print(f"{directory}: {tok.get_vocab_size()} tokens")


if __name__ == "__main__":
    main()
