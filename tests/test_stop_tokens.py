"""``lora.tokenizer.stop_token_ids``: the end-of-turn token comes from the chat template, for ChatML, Llama 3 and
templates that cannot end an assistant turn. Hand-built word-level tokenizers, so every id is known."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from lora.tokenizer import stop_token_ids

# Templates written for these tests, in the turn formats of the families they name.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
NO_ASSISTANT = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ raise_exception('no assistant turns') }}{% endif %}"
    "{{ m['content'] }}{% endfor %}"
)
NO_END = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def _tokenizer(specials, template, eos, unk="<unk>"):
    """A word-level tokenizer: ids 0.. are ``[unk] + specials``, then plain words."""
    words = [unk, *specials, "user", "assistant", "x", "\n", "\n\n", ":"]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unk, eos_token=eos, pad_token=unk)
    fast.add_special_tokens({"additional_special_tokens": list(specials)})
    fast.chat_template = template
    return fast


def test_chatml_end_of_turn_is_im_end():
    tok = _tokenizer(["<|im_start|>", "<|im_end|>", "<|endoftext|>"], CHATML, eos="<|endoftext|>")
    assert stop_token_ids(tok) == (2, 3)  # <|im_end|>, <|endoftext|>


def test_llama3_end_of_turn_is_eot_id_not_the_unknown_token():
    """``convert_tokens_to_ids("<|im_end|>")`` gives 0 (``<unk>``) in this vocabulary; the template's
    ``<|eot_id|>`` (4) is the one that ends a reply."""
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|end_of_text|>"]
    tok = _tokenizer(specials, LLAMA3, eos="<|end_of_text|>")
    tok.bos_token = "<|begin_of_text|>"
    assert tok.convert_tokens_to_ids("<|im_end|>") == 0
    assert stop_token_ids(tok) == (4, 5)


@pytest.mark.parametrize("template", [NO_ASSISTANT, NO_END], ids=["raises", "no-special-after-reply"])
def test_template_without_an_end_of_turn_leaves_eos(template):
    tok = _tokenizer(["<eos>"], template, eos="<eos>")
    assert stop_token_ids(tok) == (1,)


def test_no_eos_and_no_end_of_turn_is_refused():
    tok = _tokenizer(["<sep>"], NO_END, eos=None)
    with pytest.raises(ValueError, match="no EOS token"):
        stop_token_ids(tok)
