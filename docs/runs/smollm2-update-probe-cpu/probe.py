"""How fast does the paper preset's update move SmolLM2-135M, given a clean signal? (a diagnostic, not a test)

A bandit on real Cleanup decision prompts: each of N agents sees one fixed prompt (a decision of a compiled
rollout, its system turn included, with the menu's letters as the `choice_only` candidates); the team return of
rollout k is the fraction of agents choosing their target letter. So every decision's group-relative advantage
(paper Algorithm 1, step 6) carries the whole signal, unlike a real episode, where ~30 decisions per agent share
one return. Everything else is the run's: SmolLM2 with the paper preset's stacked LoRA (rank 32, alpha 64, the
run's targets), `MAGRPOConfig.paper(game)` (K 4, temperature 0.7, 2 PPO epochs, one minibatch, clip 0.2, KL 0.05,
gradient clip 1.0, AdamW), `train_step.make_train_step` with the shared system turn as the batch prefix.

So the rounds this bandit needs for P(target) to rise are a lower bound on what a real run needs for any option
preference to move at the same learning rate.

    python docs/runs/smollm2-update-probe-cpu/probe.py --traces TRACE.jsonl --lr 5e-5 --rounds 40 --out F.json

TRACE.jsonl: decision records with `prompt_ids` and `n_letters` (`python -m experiments.bench rollout --game
cleanup --model tiny-random --rollouts 1 --steps 2 --no-host --repeats 1 --traces DIR`; the tiny model shares
SmolLM2's tokenizer, so the ids are SmolLM2's).
"""

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxopt_marl import magrpo, menus
from jaxopt_marl import train_step as ts
from jaxopt_marl.config import lora_config
from jaxopt_marl.rollout import load_policy_model
from lora import sampling, split_model


def common_prefix(seqs):
    n = min(len(s) for s in seqs)
    for i in range(n):
        if len({s[i] for s in seqs}) > 1:
            return list(seqs[0][:i])
    return list(seqs[0][:n])


def trim(text):
    """The chat text without the user turn's state lines (position ... memory): the system turn, "You are player
    i.", the menu and the answer's opening stay. Rows then cost ~110 tokens after the shared prefix, not ~250."""
    head, rest = text.split("<|im_start|>user\n", 1)
    player, rest = rest.split(" World position", 1)
    menu = rest[rest.index("Action menu:") :]
    return f"{head}<|im_start|>user\n{player}\n\n{menu}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", required=True)
    ap.add_argument("--lr", type=float, default=None, help="default: the paper preset's")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--agents", type=int, default=2, help="adapters (each its own bandit)")
    ap.add_argument("--game", default="cleanup")
    ap.add_argument("--trim", action="store_true", help="drop the state lines from the prompts (see trim)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    recs = [json.loads(line) for line in open(a.traces)]
    recs = sorted(recs, key=lambda r: -r["n_letters"])[: a.agents]  # the richest menus
    cfg = magrpo.MAGRPOConfig.paper(a.game, **({"learning_rate": a.lr} if a.lr else {}))
    lcfg = lora_config(a.game, 32)
    lcfg = dataclasses.replace(lcfg, num_adapters=a.agents)
    model, tok = load_policy_model(None, lcfg, seed=a.seed)
    if a.trim:
        prompts = [tok.encode(trim(r["prompt_text"]), add_special_tokens=False) for r in recs]
    else:
        prompts = [list(r["prompt_ids"]) for r in recs]
    prefix = common_prefix(prompts)  # the system turn and the user turn's opening, run once per adapter
    letter_ids = [tok.encode(f" {c}", add_special_tokens=False)[0] for c in menus.LETTERS]
    cands = [letter_ids[: r["n_letters"]] for r in recs]
    graphdef, adapters, base = split_model(model)
    step = ts.make_train_step(graphdef, cfg, ts.make_mesh(1), num_adapters=a.agents)
    opt = step.optimizer.init(adapters)
    width = max(len(p) for p in prompts)
    ids = np.zeros((a.agents, width), np.int32)
    mask = np.zeros((a.agents, width), bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = p
        mask[i, width - len(p) :] = True
    agents = jnp.arange(a.agents, dtype=jnp.int32)

    def probs(adapters):
        state = nnx.state(nnx.merge(graphdef, adapters, base))
        logits = sampling.forward(graphdef, state, jnp.asarray(ids), jnp.asarray(mask), agent_ids=agents)[:, -1]
        out = []
        for i, c in enumerate(cands):
            out.append(np.asarray(jax.nn.softmax(logits[i, jnp.asarray(c)] / cfg.temperature)))
        return out

    p0 = probs(adapters)
    # target: the least likely letter among those the base gives >= 0.1, not its favourite (an option the base
    # underweights but samples now and then, so that K = 4 rollouts see it)
    target = [int(min((j for j in range(len(p)) if p[j] >= 0.1 and j != p.argmax()), key=lambda j: p[j])) for p in p0]
    rng = np.random.default_rng(a.seed)
    key = jax.random.key(a.seed)
    k, n = cfg.num_rollouts, a.agents
    log = []
    p = p0
    for rnd in range(a.rounds):
        t0 = time.perf_counter()
        choice = np.array([[rng.choice(len(p[i]), p=p[i] / p[i].sum()) for i in range(n)] for _ in range(k)])
        hit = choice == np.asarray(target)[None, :]
        returns = hit.mean(axis=1).astype(np.float32)
        adv = np.asarray(magrpo.group_relative_advantage(jnp.asarray(returns)))
        batch = ts.pack_decisions(  # the round's K x N decisions, each with its rollout's advantage
            [prompts[i] for _ in range(k) for i in range(n)],
            [[cands[i][choice[r, i]]] for r in range(k) for i in range(n)],
            list(range(n)) * k,
            np.repeat(adv, n),
            prompt_len=width - len(prefix),
            prefix=prefix,
            choices=[cands[i] for _ in range(k) for i in range(n)],
            pad_to_multiple=8,
        )
        key, sub = jax.random.split(key)
        updated = bool(np.any(adv != 0))  # the trainer's rule (RunConfig.skip_zero_advantage, every preset)
        m = {"kl": np.zeros((1, n)), "grad_norm": np.zeros((1, n))}
        if updated:
            batch = step.prepare(base, adapters, batch)
            adapters, opt, m = step.update(base, adapters, opt, batch, sub)
            p = probs(adapters)
        row = {
            "round": rnd,
            "p_target": [float(p[i][target[i]]) for i in range(n)],
            "return_mean": float(returns.mean()),
            "updated": updated,
            "kl": [float(x) for x in np.asarray(m["kl"]).mean(axis=0)],
            "grad_norm": [float(x) for x in np.asarray(m["grad_norm"]).max(axis=0)],
            "s": time.perf_counter() - t0,
        }
        log.append(row)
        print(json.dumps(row), flush=True)
    out = {
        "learning_rate": cfg.learning_rate,
        "config": dataclasses.asdict(cfg),
        "lora": {"rank": lcfg.rank, "alpha": lcfg.alpha, "targets": list(lcfg.targets)},
        "prefix_tokens": len(prefix),
        "prompt_tokens": [len(x) for x in prompts],
        "trim": a.trim,
        "prompt_text": [tok.decode(x) for x in prompts],
        "menus": [r["menu"] for r in recs],
        "target": [recs[i]["menu"][target[i]] for i in range(n)],
        "p0": [x.tolist() for x in p0],
        "rounds": log,
    }
    json.dump(out, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
