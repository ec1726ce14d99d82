"""Writes the frozen base of a ``tiny-random`` run as an HF checkpoint directory, so that other training seeds
can train on that same base (``--model DIR``).

Why: ``tiny-random``'s base weights are drawn from the run seed (``nnx.Rngs(seed)``, ``jaxopt_marl.seeding``), so
``--seed 1`` of the fixed-letters diagnostic is another frozen policy, not a replicate. A directory written here
fixes the base while ``--seed`` still sets the other channels: LoRA A init (``lora.load_model``'s ``seed``),
rollout sampling and env seeds, minibatch order.

    python docs/runs/cleanup-tiny-fixed-letters-cpu/replicates/export_base.py \
        --config docs/runs/cleanup-tiny-fixed-letters-cpu/config.json --out /tmp/tiny_seed0_base

The directory holds ``model.safetensors`` + ``config.json`` (``lora.peft_export.export_hf_base``) and SmolLM2's
tokenizer with its chat template (``save_pretrained`` of the tokenizer ``tiny-random`` runs with). Before it
returns, the script checks that the directory loads back to the same model: the base weights bit for bit, the
logits of a rendered prompt exactly, and the chat template's token ids. Any difference raises.
"""

from __future__ import annotations

import argparse
import json

import jax.numpy as jnp
import numpy as np
from flax import nnx

import lora
from jaxopt_marl import rollout, seeding
from jaxopt_marl.config import RunConfig
from lora import sampling
from lora.params import export_hf_weights
from lora.peft_export import export_hf_base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="the tiny-random run's config.json")
    ap.add_argument("--out", required=True, help="directory to write")
    args = ap.parse_args()
    with open(args.config) as f:
        recorded = json.load(f)
    if recorded["model"] != rollout.TINY_RANDOM:
        raise ValueError(f"{args.config}: model is {recorded['model']!r}, not {rollout.TINY_RANDOM!r}")
    cfg = RunConfig.from_preset(
        recorded["preset"],
        recorded["game"],
        seed=recorded["seed"],
        lora_rank=recorded["lora_rank"],
        letters=recorded["letters"],
    )
    # The run's own build: the same LoRA config, so the same draws from nnx.Rngs(seed) for the base.
    model, tok = rollout.load_policy_model(rollout.TINY_RANDOM, cfg.lora, seed=seeding.lora_init_seed(cfg.seed))
    export_hf_base(model, args.out)
    tok.save_pretrained(args.out)

    loaded, tok2 = lora.load_model(args.out, lora=cfg.lora, seed=seeding.lora_init_seed(cfg.seed) + 1)
    w0, w1 = export_hf_weights(model), export_hf_weights(loaded)
    if sorted(w0) != sorted(w1):
        raise ValueError(f"tensor names differ: {sorted(set(w0) ^ set(w1))}")
    for name in w0:
        if not np.array_equal(w0[name], w1[name]):
            raise ValueError(f"{name}: weights differ after the round trip")
    chat = [
        {"role": "system", "content": "You are agent 3."},
        {"role": "user", "content": "Menu:\nA. clean dirt @ (4, 5)"},
    ]
    text0 = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    text1 = tok2.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    ids0 = tok.encode(text0, add_special_tokens=False)
    ids1 = tok2.encode(text1, add_special_tokens=False)
    if text0 != text1 or ids0 != ids1 or len(tok) != len(tok2):
        raise ValueError(f"tokenizer differs after the round trip: {text0!r} vs {text1!r}")
    # Adapters off (B = 0 at init in both, so equal anyway): the base's logits.
    x = jnp.asarray(ids0)[None]
    gd0, st0 = nnx.split(model)
    gd1, st1 = nnx.split(loaded)
    l0, l1 = sampling.forward(gd0, st0, x), sampling.forward(gd1, st1, x)
    if not np.array_equal(np.asarray(l0), np.asarray(l1)):
        raise ValueError(f"logits differ: max |diff| {float(jnp.max(jnp.abs(l0 - l1)))}")
    print(f"wrote {args.out}: {len(w0)} tensors, vocab {len(tok)}, logits equal on a {len(ids0)}-token chat")


if __name__ == "__main__":
    main()
