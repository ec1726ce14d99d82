"""``python -m experiments.export``: a run's adapters as PEFT adapters (lora.peft_export), the base they name, the
format warm-up stacked into each adapter, and bad input."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lora
from experiments import crossplay
from experiments import export as X
from jaxopt_marl import format_warmup, rollout
from jaxopt_marl.errors import InputError
from lora import LoRAConfig, peft_export, split_model
from tests.helpers import assert_fp32_close


def test_stacked_adapter_is_the_sum_of_the_two_updates():
    """Hand-sized: [B1, B2] [A1; A2] = B1 A1 + B2 A2 (ranks 1 and 2, in = 2, out = 3, small integers: exact)."""
    a1, b1 = np.array([[1.0, -2.0]]), np.array([[3.0], [0.0], [-1.0]])  # [r1, in], [out, r1]
    a2 = np.array([[0.0, 1.0], [2.0, 1.0]])
    b2 = np.array([[1.0, 1.0], [0.0, -1.0], [2.0, 0.0]])
    s = peft_export.stack_adapters(
        {"m.lora_A.weight": a1, "m.lora_B.weight": b1}, {"m.lora_A.weight": a2, "m.lora_B.weight": b2}
    )
    assert s["m.lora_A.weight"].shape == (3, 2) and s["m.lora_B.weight"].shape == (3, 3)
    # B1 A1 = [[3, -6], [0, 0], [-1, 2]]; B2 A2 = [[2, 2], [-2, -1], [0, 2]]
    np.testing.assert_array_equal(s["m.lora_B.weight"] @ s["m.lora_A.weight"], [[5.0, -4.0], [-2.0, -1.0], [-1.0, 4.0]])
    with pytest.raises(ValueError, match="different modules"):
        peft_export.stack_adapters({"m.lora_A.weight": a1}, {"n.lora_A.weight": a1})
    with pytest.raises(ValueError, match=r"m.lora_A.weight: shapes \(1, 2\) and \(1, 3\) cannot be stacked"):
        peft_export.stack_adapters({"m.lora_A.weight": a1}, {"m.lora_A.weight": np.ones((1, 3))})


def test_stacked_export_on_the_base_plays_the_warmed_up_base_with_its_adapter(tmp_path):
    """The tiny model with adapter 0 as a warm-up and adapter 1 as the trained one: the rank-8 export of
    ``stack_adapters(0, 1)``, read onto the written base (an HF directory, reloaded), gives the logits of adapter
    1 on the base with adapter 0 merged in (float32: the projections' two summation orders)."""
    cfg = LoRAConfig(num_adapters=2, rank=4, alpha=8.0)
    model, tok = rollout.load_policy_model(rollout.TINY_RANDOM, cfg, seed=0)
    key = jax.random.key(5)
    for m in format_warmup.lora_projections(model):
        key, sub = jax.random.split(key)
        m.lora_b.value = 0.05 * jax.random.normal(sub, m.lora_b[...].shape, jnp.float32)
    tensors = peft_export.stack_adapters(peft_export.adapter_tensors(model, 0), peft_export.adapter_tensors(model, 1))
    base = peft_export.export_hf_base(model, str(tmp_path / "base"))
    tok.save_pretrained(base)
    out = peft_export.export_peft(model, 1, str(tmp_path / "agent_1"), base_model_name_or_path=base, tensors=tensors)
    conf = json.loads((tmp_path / "agent_1" / "adapter_config.json").read_text())
    assert conf["r"] == 8 and conf["lora_alpha"] == 16.0  # the same scaling alpha / r = 2 at twice the rank

    ids = jnp.asarray(tok.encode("state: cleaning\nchoice: B", add_special_tokens=False))[None].repeat(2, 0)
    trained_only = np.asarray(model(ids, agent_ids=jnp.ones(2, jnp.int32)))
    format_warmup.merge_adapter(model, 0)
    desired = np.asarray(model(ids, agent_ids=jnp.ones(2, jnp.int32)))
    loaded, _ = lora.load_model(base, lora=LoRAConfig(num_adapters=1, rank=8, alpha=16.0))
    peft_export.load_peft(loaded, 0, out)
    actual = np.asarray(loaded(ids, agent_ids=jnp.zeros(2, jnp.int32)))
    assert np.abs(desired - trained_only).max() > 1e-3  # the warm-up changes the logits: the comparison can fail
    mc = model.cfg
    n = mc.num_layers * (4 * mc.hidden_size + 2 * mc.intermediate_size + mc.head_dim + 9) + 2 * mc.hidden_size
    assert_fp32_close(actual, desired, n, k=2 * 8.0)


def test_export_of_a_smoke_run_writes_its_evaluated_adapters_and_base(smoke_run, tmp_path, capsys):
    """The Overcooked AA smoke run (tiny-random, no warm-up): one PEFT directory per agent whose tensors are the
    adapters of the checkpoint its evaluation played, bit for bit, on a written base that reloads to the run's
    base weights; a second export into the same directory is refused."""
    run_dir, _ = smoke_run
    out = tmp_path / "peft"
    X.main([str(run_dir), "--out", str(out)])
    assert "exported 2 adapter(s) of round" in capsys.readouterr().out
    rec = json.loads((out / X.EXPORT_JSON).read_text())
    run = crossplay.load_run(run_dir)
    assert rec["adapters"]["round"] == run.eval.checkpoint_round and rec["stacked_with_warmup"] is False
    assert rec["base"] == {"name": str((out / "base").resolve()), "written": "base", "same_weights_as_training": True}
    assert [a["rank"] for a in rec["agents"]] == [run.cfg.lora.rank] * 2

    model, _ = rollout.load_policy_model(rollout.TINY_RANDOM, run.cfg.lora, seed=0)
    trained = crossplay.load_adapters(run, split_model(model)[1])
    nnx.update(model, trained)
    loaded, _ = lora.load_model(str(out / "base"), lora=run.cfg.lora)
    from lora.params import export_hf_weights

    w0, w1 = export_hf_weights(model), export_hf_weights(loaded)
    assert sorted(w0) == sorted(w1) and all(np.array_equal(w0[k], w1[k]) for k in w0)
    for i in range(2):
        conf = json.loads((X.agent_dir(out, i) / "adapter_config.json").read_text())
        assert conf["base_model_name_or_path"] == rec["base"]["name"]
        peft_export.load_peft(loaded, i, str(X.agent_dir(out, i)))
        exp, got = peft_export.adapter_tensors(model, i), peft_export.adapter_tensors(loaded, i)
        assert all(np.array_equal(exp[k], got[k]) for k in exp)
    assert any(np.abs(t).max() > 0 for k, t in exp.items() if "lora_B" in k) or run.eval.checkpoint_round == 0

    with pytest.raises(InputError, match=r"exists and is not empty"):
        X.main([str(run_dir), "--out", str(out)])
    with pytest.raises(InputError, match=r"does not exist"):
        X.main([str(tmp_path / "nope")])


def test_export_of_a_warmed_up_run_stacks_the_warmup(smoke_run, tmp_path):
    """The smoke run copied and made a warmed-up one (``config.json`` ``format_warmup = 1`` and a saved warm-up
    of 3x the trained adapter 0 written here): each agent's export is [warm-up; trained] at rank 2r, its
    ``lora_alpha`` 2 alpha; a run whose ``format_warmup/`` is gone is refused before any model is loaded."""
    import shutil

    from safetensors.numpy import load_file

    run_dir = tmp_path / "run"
    shutil.copytree(smoke_run[0], run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    config["format_warmup"] = 1
    (run_dir / "config.json").write_text(json.dumps(config))
    run = crossplay.load_run(run_dir)
    model, _ = rollout.load_policy_model(rollout.TINY_RANDOM, run.cfg.lora, seed=0)
    trained = crossplay.load_adapters(run, split_model(model)[1])
    format_warmup.save(jax.tree.map(lambda x: 3.0 * x, trained), run_dir, run.cfg)
    nnx.update(model, trained)

    rec = X.export_run(run_dir, tmp_path / "out")
    r = run.cfg.lora.rank
    assert (
        rec["stacked_with_warmup"] and rec["format_warmup"] == 1 and [a["rank"] for a in rec["agents"]] == [2 * r] * 2
    )
    warm = peft_export.adapter_tensors(model, 0)
    for i in range(2):
        d = X.agent_dir(tmp_path / "out", i)
        conf = json.loads((d / "adapter_config.json").read_text())
        assert conf["r"] == 2 * r and conf["lora_alpha"] == 2 * run.cfg.lora.alpha
        own = peft_export.adapter_tensors(model, i)
        for k, v in load_file(str(d / "adapter_model.safetensors")).items():
            first, second = (v[:r], v[r:]) if k.endswith("lora_A.weight") else (v[:, :r], v[:, r:])
            np.testing.assert_array_equal(first, 3.0 * warm[k])
            np.testing.assert_array_equal(second, own[k])

    shutil.rmtree(run_dir / format_warmup.CHECKPOINT_DIR)
    with pytest.raises(InputError, match=r"no saved format warm-up, but .*records format_warmup = 1"):
        X.export_run(run_dir, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()
