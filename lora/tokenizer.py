"""Tokenizers built offline: from GGUF metadata (vocab + merges) or a ``tokenizer.json``; chat rendering.

transformers' own GGUF tokenizer path imports torch, so the GGUF tokenizer is assembled here with the
``tokenizers`` library from ``tokenizer.ggml.{tokens,merges,token_type}`` and wrapped in a
``PreTrainedTokenizerFast``. Pre-tokenizer regexes follow llama.cpp ``src/llama-vocab.cpp`` (per
``tokenizer.ggml.pre``) and the matching Hugging Face ``tokenizer.json`` files.
"""

from __future__ import annotations

import logging

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

log = logging.getLogger(__name__)

try:  # what a chat template's ``raise_exception`` raises (transformers' apply_chat_template); absent without jinja2
    from jinja2.exceptions import TemplateError as _TemplateError
except ImportError:  # render_chat's ChatML fallback raises ValueError only
    _TemplateError = ValueError

# GPT-2 / Llama-3 / Qwen2 split regexes (llama.cpp llama-vocab.cpp; HF tokenizer.json "Split").
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GGUF token_type values (gguf.TokenType): 3 = CONTROL, 4 = USER_DEFINED.
_CONTROL, _USER_DEFINED = 3, 4


def _pre_tokenizer(pre: str):
    """Byte-level pre-tokenizer for a ``tokenizer.ggml.pre`` name."""
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        # SmolLM2 tokenizer.json: Digits(individual_digits) then ByteLevel(use_regex=True).
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in ("llama-bpe", "llama3"):
        regex = _LLAMA3_REGEX
    elif pre in ("qwen2", "deepseek-r1-qwen"):
        regex = _QWEN2_REGEX
    else:
        if pre not in ("gpt-2", "gpt2", "default"):
            log.warning("unknown tokenizer.ggml.pre %r; using the GPT-2 byte-level regex", pre)
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def tokenizer_from_gguf_fields(fields: dict, source: str) -> PreTrainedTokenizerFast:
    """Builds a byte-level BPE tokenizer from GGUF tokenizer metadata.

    Args:
      fields: GGUF key -> decoded value (``tokenizer.ggml.*``, ``tokenizer.chat_template``).
      source: the GGUF path, for error messages.

    Returns:
      A ``PreTrainedTokenizerFast`` with bos/eos/pad/unk tokens and the chat template set.

    Raises:
      ValueError: if the tokenizer model is not "gpt2" (byte-level BPE) or metadata is missing.
    """
    kind = fields.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{source}: tokenizer.ggml.model={kind!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens = fields.get("tokenizer.ggml.tokens")
    merges = fields.get("tokenizer.ggml.merges") or []
    if not tokens:
        raise ValueError(f"{source}: GGUF metadata lacks tokenizer.ggml.tokens")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merge_pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs, fuse_unk=False, ignore_merges=False))
    tok.pre_tokenizer = _pre_tokenizer(fields.get("tokenizer.ggml.pre", "default"))
    tok.decoder = decoders.ByteLevel()
    types = fields.get("tokenizer.ggml.token_type") or []
    special = [tokens[i] for i, t in enumerate(types) if t == _CONTROL]
    user = [tokens[i] for i, t in enumerate(types) if t == _USER_DEFINED]
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    if user:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])

    def name(key):
        idx = fields.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[idx] if idx is not None and 0 <= idx < len(tokens) else None

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=name("bos"),
        eos_token=name("eos"),
        unk_token=name("unknown"),
        pad_token=name("padding") or name("eos"),
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = fields.get("tokenizer.chat_template")
    fast.init_kwargs["add_bos_token"] = bool(fields.get("tokenizer.ggml.add_bos_token", False))
    return fast


def render_chat(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """Renders messages with the tokenizer's chat template.

    Uses ``apply_chat_template`` (needs jinja2). Without jinja2, ChatML templates (``<|im_start|>``,
    SmolLM2 and Qwen) are rendered directly, including SmolLM2's default system message.

    Raises:
      ValueError: if there is no template, or jinja2 is missing and the template is not ChatML.
    """
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("tokenizer has no chat template")
    try:
        import jinja2  # noqa: F401
    except ImportError:
        if "<|im_start|>" not in template:
            raise ValueError("jinja2 is not installed and the chat template is not ChatML") from None
        parts = []
        if messages and messages[0]["role"] != "system" and "You are a helpful AI assistant" in template:
            default = template.split("<|im_start|>system\n", 1)[1].split("<|im_end|>", 1)[0]
            parts.append(f"<|im_start|>system\n{default}<|im_end|>\n")
        for m in messages:
            parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def end_of_turn_id(tokenizer) -> int | None:
    """The chat template's end-of-turn token id, read from the checkpoint's own template (never looked up by
    spelling): one assistant turn holding a sentinel is rendered (``render_chat``), and the first *special*
    token after the sentinel is it (``<|im_end|>`` in SmolLM2 / Qwen ChatML, ``<|eot_id|>`` in Llama 3,
    ``<end_of_turn>`` in Gemma). None: the template cannot render an assistant turn, or puts no special token
    after it (logged as a warning).

    Raises:
      Errors of the template other than ``ValueError`` or jinja2's ``TemplateError`` propagate.
    """
    special = {int(i) for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    special |= {int(i) for i in tokenizer.all_special_ids}
    sentinel = "\x00REPLY\x00"
    try:
        text = render_chat(
            tokenizer,
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": sentinel}],
            add_generation_prompt=False,
        )
    except (ValueError, _TemplateError) as e:  # no template, or the template's own raise_exception
        log.warning("chat template cannot render an assistant turn (%s); the reply stops at EOS only", e)
        return None
    if sentinel not in text:
        return None
    tail = tokenizer(text.split(sentinel, 1)[1], add_special_tokens=False)["input_ids"]
    return next((int(t) for t in tail if int(t) in special), None)


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """The token ids that end an assistant reply: the chat template's end-of-turn token (:func:`end_of_turn_id`),
    and the EOS token.

    A token name is never looked up by spelling, so a vocabulary that lacks it cannot map it to its unknown
    or padding id (``convert_tokens_to_ids`` does that), which would stop generation on padding.

    Args:
      tokenizer: a ``PreTrainedTokenizerFast`` with a chat template.

    Returns:
      Sorted, distinct int ids (one or two), each in ``[0, len(tokenizer))``.

    Raises:
      ValueError: if the tokenizer has neither an EOS token nor an end-of-turn token in its template. Other
        errors of the template (anything but ``ValueError`` or jinja2's ``TemplateError``) propagate.
    """
    ids = set()
    eot = end_of_turn_id(tokenizer)
    if eot is not None:
        ids.add(eot)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError("tokenizer has no EOS token and its chat template no end-of-turn token: replies cannot stop")
    return tuple(sorted(ids))


def load_tokenizer_json(directory: str) -> PreTrainedTokenizerFast:
    """Loads ``tokenizer.json`` (+ ``tokenizer_config.json``) from a local directory, offline.

    Raises:
      FileNotFoundError: if ``tokenizer.json`` is absent.
    """
    import os

    path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: tokenizer.json not found")
    return PreTrainedTokenizerFast.from_pretrained(directory, local_files_only=True)
