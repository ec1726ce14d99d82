"""Orbax checkpoints of adapters + optimizer state, crash safety, and PEFT export."""

import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from lora import Decoder, LoRAConfig, ModelConfig, checkpoint, peft_export, split_model

LORA = LoRAConfig(num_adapters=3, rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))


def _trained(seed=0):
    """A tiny model whose adapters and Adam state have taken one step."""
    model = Decoder(ModelConfig.tiny("llama"), LORA, rngs=nnx.Rngs(seed))
    graphdef, adapters, base = split_model(model)
    tx = optax.adam(1e-2)
    opt_state = tx.init(adapters)
    grads = jax.tree.map(jnp.ones_like, adapters)
    updates, opt_state = tx.update(grads, opt_state, adapters)
    adapters = optax.apply_updates(adapters, updates)
    return graphdef, adapters, base, tx, opt_state


def test_round_trip_adapters_opt_state_and_step(tmp_path):
    _, adapters, _, tx, opt_state = _trained()
    manager = checkpoint.make_manager(str(tmp_path))
    checkpoint.save(manager, 7, adapters, opt_state, {"rank": LORA.rank})
    fresh = jax.tree.map(jnp.zeros_like, adapters)
    restored, opt, meta = checkpoint.restore(checkpoint.make_manager(str(tmp_path)), fresh, tx.init(fresh))
    assert meta == {"rank": 4, "step": 7}
    chex.assert_trees_all_equal(nnx.to_pure_dict(restored), nnx.to_pure_dict(adapters))
    chex.assert_trees_all_equal(opt, opt_state)


def test_restore_after_kill_uses_last_complete_step(tmp_path):
    _, adapters, _, tx, opt_state = _trained()
    manager = checkpoint.make_manager(str(tmp_path))
    checkpoint.save(manager, 1, adapters, opt_state)
    # A save killed mid-write leaves only orbax's temporary directory, never a step directory.
    os.makedirs(tmp_path / "2.orbax-checkpoint-tmp-123" / "adapters")
    (tmp_path / "2.orbax-checkpoint-tmp-123" / "adapters" / "partial").write_text("x")
    reopened = checkpoint.make_manager(str(tmp_path))
    assert reopened.latest_step() == 1
    _, _, meta = checkpoint.restore(reopened, jax.tree.map(jnp.zeros_like, adapters), tx.init(adapters))
    assert meta["step"] == 1


def test_empty_directory_raises(tmp_path):
    _, adapters, _, tx, opt_state = _trained()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        checkpoint.restore(checkpoint.make_manager(str(tmp_path)), adapters, opt_state)


def test_peft_export_layout_and_reload(tmp_path):
    graphdef, adapters, base, _, _ = _trained()
    model = nnx.merge(graphdef, adapters, base)
    out = peft_export.export_peft(model, 2, str(tmp_path / "agent2"))
    from safetensors.numpy import load_file

    tensors = load_file(os.path.join(out, "adapter_model.safetensors"))
    config = json.loads(open(os.path.join(out, "adapter_config.json")).read())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["peft_type"] == "LORA"
    assert sorted(config["target_modules"]) == ["down_proj", "q_proj", "v_proj"]
    assert len(tensors) == 2 * 3 * 2  # A and B, 3 targets, 2 layers
    a = tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
    assert a.shape == (4, 32) and b.shape == (32, 4)  # PEFT: A [r, in], B [out, r]
    np.testing.assert_array_equal(a, np.asarray(adapters["blocks"]["q_proj"]["lora_a"][...])[1, 2].T)
    # Loading the export into another slot reproduces agent 2's adapter there.
    peft_export.load_peft(model, 0, out)
    pure = nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam))["blocks"]
    for leaves in pure.values():
        np.testing.assert_array_equal(leaves["lora_a"][:, 0], leaves["lora_a"][:, 2])
        np.testing.assert_array_equal(leaves["lora_b"][:, 0], leaves["lora_b"][:, 2])
