"""Optional PyTorch parity: our decoder vs transformers, and our PEFT export vs Hugging Face PEFT.

Every test needs torch + transformers (and peft for the adapter round trip) and skips cleanly without
them (``pip install -e '.[torch]'``). All comparisons are float32 on the same weights, within 1e-4 of
the reference's largest logit.
"""

import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lora import Decoder, LoRAConfig, ModelConfig, sampling
from lora.config import ALL_TARGETS, ATTENTION_TARGETS
from lora.hf_loader import config_from_hf
from lora.peft_export import export_hf_base, export_peft, hf_config, load_peft
from tests.test_lora_model import _randomise_b

RTOL = 1e-4
# Llama-3.1-style RoPE scaling small enough that the tiny model's 4 frequencies (wavelengths 6.3,
# 63, 628, 6283 tokens) fall in all three bands: kept, interpolated (628) and divided by factor.
LLAMA3_ROPE = (
    ("factor", 8.0),
    ("high_freq_factor", 4.0),
    ("low_freq_factor", 1.0),
    ("original_max_position_embeddings", 1024),
    ("rope_type", "llama3"),
)


def _torch():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return torch


def _ids(t=33, vocab=128, seed=0):
    return np.random.RandomState(seed).randint(0, vocab, (2, t)).astype(np.int32)


def _ours(model, ids, agent_ids=None):
    graphdef, state = nnx.split(model)
    return np.asarray(sampling.forward(graphdef, state, jnp.asarray(ids), agent_ids=agent_ids))


def _theirs(hf, ids):
    torch = _torch()
    with torch.no_grad():
        return hf(torch.tensor(np.asarray(ids, np.int64))).logits.float().numpy()


def _close(out, ref):
    """max |out - ref| <= RTOL * max |ref|."""
    err = float(np.abs(out - ref).max() / np.abs(ref).max())
    assert out.shape == ref.shape and err <= RTOL, f"relative error {err:.2e} > {RTOL:g}"


def _from_pretrained(directory):
    torch = _torch()
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager"
    ).eval()


CONFIGS = {
    "llama": ModelConfig.tiny("llama"),
    "qwen2": ModelConfig.tiny("qwen2"),  # q/k/v bias, tied embeddings
    "qwen3": ModelConfig.tiny("qwen3"),  # q/k RMSNorm, tied embeddings
    "llama-rope-llama3": dataclasses.replace(ModelConfig.tiny("llama"), rope_scaling=LLAMA3_ROPE),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hf_config_round_trips(name):
    cfg = CONFIGS[name]
    assert config_from_hf(json.loads(json.dumps(hf_config(cfg))), "<memory>") == cfg


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_transformers(tmp_path, name):
    _torch()
    cfg = CONFIGS[name]
    model = Decoder(cfg, rngs=nnx.Rngs(7))
    hf = _from_pretrained(export_hf_base(model, str(tmp_path)))
    assert hf.config.model_type == cfg.architecture
    assert bool(hf.config.tie_word_embeddings) == cfg.tie_embeddings
    ids = _ids(t=48)  # long enough for the scaled low frequencies to move the logits
    _close(_ours(model, ids), _theirs(hf, ids))


@pytest.mark.parametrize("arch,targets", [("llama", ATTENTION_TARGETS), ("qwen2", ALL_TARGETS), ("qwen3", ALL_TARGETS)])
def test_peft_adapter_loads_in_hugging_face_peft(tmp_path, arch, targets):
    _torch()
    peft = pytest.importorskip("peft")
    # alpha / rank = 3 so a missing or inverted scaling shows.
    model = Decoder(
        ModelConfig.tiny(arch), LoRAConfig(num_adapters=3, rank=4, alpha=12.0, targets=targets), rngs=nnx.Rngs(3)
    )
    _randomise_b(model)
    agent = 1
    base_dir = export_hf_base(model, str(tmp_path / "base"))
    adapter_dir = export_peft(model, agent, str(tmp_path / "adapter"), base_model_name_or_path=base_dir)
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        assert peft.LoraConfig(**json.load(f)).r == 4

    ids = _ids()
    base = _from_pretrained(base_dir)
    base_logits = _theirs(base, ids)
    _close(_ours(model, ids), base_logits)  # agent_ids=None is the frozen base
    peft_model = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
    adapted = _theirs(peft_model, ids)
    agent_ids = jnp.full((ids.shape[0],), agent, jnp.int32)
    ours = _ours(model, ids, agent_ids)
    _close(ours, adapted)
    assert np.abs(adapted - base_logits).max() > 100 * RTOL * np.abs(base_logits).max()
    # Every adapted module got its weights, nothing else was wrapped.
    wrapped = {n.rsplit(".", 1)[-1] for n, m in peft_model.named_modules() if hasattr(m, "lora_A")}
    assert wrapped == set(targets)

    # PEFT's own save reads back into another slot of our model.
    saved = str(tmp_path / "resaved")
    peft_model.save_pretrained(saved)
    load_peft(model, 0, saved)
    _close(_ours(model, ids, jnp.zeros_like(agent_ids)), ours)


def test_stacked_warmup_adapter_loads_in_hugging_face_peft(tmp_path):
    """The export of a format-warmed-up run (experiments.export): adapter 0 (the warm-up) stacked with adapter 2,
    rank 8, loaded by Hugging Face PEFT on the un-warmed base, gives our logits of adapter 2 on the base with
    adapter 0 merged in (jaxopt_marl.format_warmup.merge_adapter)."""
    _torch()
    peft = pytest.importorskip("peft")
    from jaxopt_marl.format_warmup import merge_adapter
    from lora.peft_export import adapter_tensors, stack_adapters

    model = Decoder(ModelConfig.tiny("llama"), LoRAConfig(num_adapters=3, rank=4, alpha=12.0), rngs=nnx.Rngs(4))
    _randomise_b(model)
    base_dir = export_hf_base(model, str(tmp_path / "base"))
    tensors = stack_adapters(adapter_tensors(model, 0), adapter_tensors(model, 2))
    adapter_dir = export_peft(model, 2, str(tmp_path / "adapter"), base_model_name_or_path=base_dir, tensors=tensors)
    ids = _ids()
    agent_ids = jnp.full((ids.shape[0],), 2, jnp.int32)
    unwarmed = _ours(model, ids, agent_ids)
    merge_adapter(model, 0)
    ours = _ours(model, ids, agent_ids)
    peft_model = peft.PeftModel.from_pretrained(_from_pretrained(base_dir), adapter_dir).eval()
    assert peft_model.peft_config["default"].r == 8
    _close(ours, _theirs(peft_model, ids))
    assert np.abs(ours - unwarmed).max() > 100 * RTOL * np.abs(ours).max()  # the warm-up is in what PEFT played


@pytest.fixture(scope="module")
def smollm2():
    _torch()
    from lora.gguf_loader import default_gguf_path

    try:
        default_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    import lora

    return lora.load_model()


def test_smollm2_gguf_logits_match_transformers(smollm2):
    torch = _torch()
    import transformers

    from lora.params import export_hf_weights

    model, tok = smollm2
    ids = np.array(
        [tok.encode("The capital of France is Paris. Clean the river, then eat apples.", add_special_tokens=False)]
    )
    hf_cfg = transformers.AutoConfig.for_model(**hf_config(model.cfg))
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32, attn_implementation="eager").eval()
    missing, unexpected = hf.load_state_dict(
        {k: torch.tensor(v) for k, v in export_hf_weights(model).items()}, strict=False
    )
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()  # tied
    _close(_ours(model, ids), _theirs(hf, ids))
