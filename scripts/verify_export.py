"""Checks an ``experiments.export`` directory against the run it came from, with Hugging Face's own code.

    python scripts/verify_export.py RUN_DIR [EXPORT_DIR]      # EXPORT_DIR defaults to RUN_DIR/peft

For every exported agent i it renders one chat prompt of the run's game, then compares the last position's
logits of (a) this project's decoder with the run's evaluated adapter i (and, for a ``--format-warmup`` run,
the saved warm-up merged into the base: what the run's evaluation played) against (b) transformers'
``AutoModelForCausalLM`` on the exported base (``export.json`` ``base.name``) wrapped by
``peft.PeftModel.from_pretrained(agent_<i>)``, in float32. It also checks that the exported tokenizer renders
and encodes the prompt as the run's tokenizer does. Prints one line per agent with the largest absolute
difference relative to the largest logit, and exits 1 if any exceeds ``RTOL`` (1e-4, the parity bound of
``tests/test_lora_hf_parity.py``) or the tokenizers differ.

Needs the ``torch`` extra (``pip install torch==2.13.0 peft``); not used by the tests (which check the same on
tiny models, ``tests/test_export.py`` and ``tests/test_lora_hf_parity.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

RTOL = 1e-4


def main(argv: list[str]) -> int:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from experiments import crossplay
    from jaxopt_marl import format_warmup, rollout, seeding
    from lora import split_model

    run_dir = Path(argv[0])
    out = Path(argv[1]) if len(argv) > 1 else run_dir / "peft"
    rec = json.loads((out / "export.json").read_text())
    run = crossplay.load_run(run_dir)
    cfg = run.cfg
    model, tok = rollout.load_policy_model(cfg.model, cfg.lora, seed=seeding.lora_init_seed(cfg.seed))
    nnx.update(model, jax.tree.map(jnp.copy, crossplay.load_adapters(run, split_model(model)[1])))
    if rec["format_warmup"]:
        format_warmup.apply_saved(model, run_dir)
    chat = [
        {"role": "system", "content": f"You are an agent in {cfg.game}."},
        {"role": "user", "content": "Menu:\nA. wait\nB. clean dirt @ (4, 5)\nAnswer with one letter."},
    ]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False)
    ok = True
    base_name = rec["base"]["name"]
    try:
        hf_tok = AutoTokenizer.from_pretrained(base_name)
        same = hf_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == text
        same = same and hf_tok.encode(text, add_special_tokens=False) == ids
        print(f"tokenizer of {base_name}: {'same text and ids' if same else 'DIFFERS'} ({len(ids)} tokens)")
        ok &= same
    except (OSError, ValueError) as e:
        print(f"tokenizer of {base_name}: not checked ({e})")
    x = jnp.asarray(ids)[None]
    for a in rec["agents"]:
        i = a["agent"]
        ours = np.asarray(model(x, agent_ids=jnp.full((1,), i, jnp.int32)))[0, -1]
        base = AutoModelForCausalLM.from_pretrained(base_name, dtype=torch.float32).eval()
        with torch.no_grad():
            plain = base(torch.tensor([ids])).logits[0, -1].float().numpy()
        hf = PeftModel.from_pretrained(base, str(out / a["dir"])).eval()
        with torch.no_grad():
            theirs = hf(torch.tensor([ids])).logits[0, -1].float().numpy()
        scale = np.abs(theirs).max()
        rel = float(np.abs(ours - theirs).max() / scale)
        moved = float(np.abs(theirs - plain).max() / scale)
        print(
            f"agent {i} (rank {a['rank']}): max |ours - peft| / max |peft| = {rel:.2e} (the adapter moves the base's "
            f"logits by {moved:.2e}); argmax {int(ours.argmax())} vs {int(theirs.argmax())}"
        )
        ok &= rel <= RTOL
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
