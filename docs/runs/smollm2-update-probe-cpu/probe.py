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

With ``--shuffle`` (the paper's per-decision letter shuffle, §5.1): every rollout of every round shows each agent
its menu under a fresh random lettering, and the target is an option (its phrase), not a letter, so a letter
preference earns nothing; P(target) is the mean over ``--heldout`` fixed letterings never trained on. This asks
whether the update teaches SmolLM2 to read the option phrase, which the paper's method needs and a random model
cannot do.

    python docs/runs/smollm2-update-probe-cpu/probe.py --traces TRACE.jsonl --trim --shuffle --rounds 12 --out F.json

With ``--augment M`` (and ``--shuffle``), each decision of a round is also trained under M - 1 fresh random
letterings (the same chosen option, the same advantage; the letterings come from their own stream, so the rollouts
are the unaugmented run's); with ``--cyclic``, under every cyclic shift of its drawn lettering, so the chosen option
is trained once under each letter. Either way a letter's share of the gradient averages out across the rows of one
decision while the option's adds up: the debiasing-by-permutation idea of Zheng et al. 2023 ("Large Language Models
Are Not Robust Multiple Choice Selectors", arXiv 2309.03882), applied to the update rather than to inference.

    python docs/runs/smollm2-update-probe-cpu/probe.py --traces TRACE.jsonl --trim --shuffle --augment 4 --out F.json

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


MENU_HEAD, MENU_TAIL = "Action menu:\n", "\n\nChoose one."


def menu_phrases(text):
    """The option phrases of the prompt's menu, in its order (each line ``X) phrase``)."""
    body = text.split(MENU_HEAD, 1)[1].split(MENU_TAIL, 1)[0]
    return [line.split(") ", 1)[1] for line in body.split("\n")]


def relettered(text, order):
    """The prompt with its menu lines rewritten: letter j shows phrase ``order[j]`` of :func:`menu_phrases`."""
    head, rest = text.split(MENU_HEAD, 1)
    tail = rest.split(MENU_TAIL, 1)[1]
    phrases = menu_phrases(text)
    body = "\n".join(f"{menus.LETTERS[j]}) {phrases[o]}" for j, o in enumerate(order))
    return f"{head}{MENU_HEAD}{body}{MENU_TAIL}{tail}"


def pad_left(prompts, width):
    longest = max(len(p) for p in prompts)
    if longest > width:
        raise ValueError(f"a prompt of {longest} tokens is longer than the probe's width {width}")
    ids = np.zeros((len(prompts), width), np.int32)
    mask = np.zeros((len(prompts), width), bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = p
        mask[i, width - len(p) :] = True
    return jnp.asarray(ids), jnp.asarray(mask)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", required=True)
    ap.add_argument("--lr", type=float, default=None, help="default: the paper preset's")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--rollouts", type=int, default=None, help="K; default: the paper preset's")
    ap.add_argument("--agents", type=int, default=2, help="adapters (each its own bandit)")
    ap.add_argument("--game", default="cleanup")
    ap.add_argument("--trim", action="store_true", help="drop the state lines from the prompts (see trim)")
    ap.add_argument("--shuffle", action="store_true", help="a fresh lettering per rollout; the target is an option")
    ap.add_argument("--heldout", type=int, default=8, help="with --shuffle: letterings P(target) is measured on")
    ap.add_argument(
        "--augment",
        type=int,
        default=1,
        help="with --shuffle: train each decision under this many letterings (the drawn one + fresh ones); 1 = off",
    )
    ap.add_argument(
        "--cyclic",
        action="store_true",
        help="with --shuffle: train each decision under every cyclic shift of its drawn lettering (letter-balanced)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    if a.augment < 1 or (a.augment > 1 and not a.shuffle):
        raise ValueError(f"--augment {a.augment}: needs an integer >= 1, and --shuffle when above 1")
    if a.cyclic and (a.augment > 1 or not a.shuffle):
        raise ValueError(
            f"--cyclic needs --shuffle and no --augment (got --augment {a.augment}, --shuffle {a.shuffle})"
        )
    recs = [json.loads(line) for line in open(a.traces)]
    recs = sorted(recs, key=lambda r: -r["n_letters"])[: a.agents]  # the richest menus
    over = {"learning_rate": a.lr, "num_rollouts": a.rollouts}
    cfg = magrpo.MAGRPOConfig.paper(a.game, **{k: v for k, v in over.items() if v is not None})
    lcfg = lora_config(a.game, 32)
    lcfg = dataclasses.replace(lcfg, num_adapters=a.agents)
    model, tok = load_policy_model(None, lcfg, seed=a.seed)
    texts = [trim(r["prompt_text"]) if a.trim else r["prompt_text"] for r in recs]
    if a.trim:
        prompts = [tok.encode(t, add_special_tokens=False) for t in texts]
    else:
        prompts = [list(r["prompt_ids"]) for r in recs]
    n_opts = [r["n_letters"] for r in recs]
    rng = np.random.default_rng(a.seed)
    aug_rng = np.random.default_rng([a.seed, 1])  # --augment's letterings: rng's stream stays the unaugmented run's
    encode = lambda i, order: tok.encode(relettered(texts[i], order), add_special_tokens=False)  # noqa: E731
    # --shuffle: the held-out letterings (drawn first, never trained on); prompts then holds them all
    heldout = [[rng.permutation(n_opts[i]) for _ in range(a.heldout)] for i in range(a.agents)] if a.shuffle else []
    if a.shuffle:
        prompts = [encode(i, o) for i in range(a.agents) for o in heldout[i]]
    prefix = common_prefix(prompts)  # the system turn and the user turn's opening, run once per adapter
    letter_ids = [tok.encode(f" {c}", add_special_tokens=False)[0] for c in menus.LETTERS]
    cands = [letter_ids[:m] for m in n_opts]
    graphdef, adapters, base = split_model(model)
    step = ts.make_train_step(graphdef, cfg, ts.make_mesh(1), num_adapters=a.agents)
    opt = step.optimizer.init(adapters)
    width = max(len(p) for p in prompts) + (8 if a.shuffle else 0)  # room for letterings that tokenize longer

    def letter_probs(adapters, rows, agent_of):
        """P(letter) at the temperature for prompts ``rows``, row r on adapter ``agent_of[r]``."""
        ids, mask = pad_left(rows, width)
        state = nnx.state(nnx.merge(graphdef, adapters, base))
        aid = jnp.asarray(agent_of, jnp.int32)
        logits = sampling.forward(graphdef, state, ids, mask, agent_ids=aid)[:, -1]
        return [
            np.asarray(jax.nn.softmax(logits[r, jnp.asarray(cands[i])] / cfg.temperature))
            for r, i in enumerate(agent_of)
        ]

    def probs(adapters):
        """Fixed: P(letter) per agent, and None. Shuffle: per agent, P(option) and P(letter), each averaged over the
        held-out letterings (a letter preference shows in the second, not in the first)."""
        if not a.shuffle:
            return letter_probs(adapters, prompts[: a.agents], list(range(a.agents))), None
        agent_of = [i for i in range(a.agents) for _ in range(a.heldout)]
        pl = letter_probs(adapters, prompts, agent_of)
        out = []
        for i in range(a.agents):
            po = np.zeros(n_opts[i])
            for h, order in enumerate(heldout[i]):
                po[order] += pl[i * a.heldout + h]  # letter j shows option order[j]
            out.append(po / a.heldout)
        return out, [np.mean(pl[i * a.heldout : (i + 1) * a.heldout], axis=0) for i in range(a.agents)]

    p0, p_letter = probs(adapters)
    # target: the least likely letter (with --shuffle: option) among those the base gives >= 0.1, not its
    # favourite (one the base underweights but samples now and then, so that K = 4 rollouts see it)
    target = [int(min((j for j in range(len(p)) if p[j] >= 0.1 and j != p.argmax()), key=lambda j: p[j])) for p in p0]
    key = jax.random.key(a.seed)
    k, n = cfg.num_rollouts, a.agents
    log = []
    p = p0
    for rnd in range(a.rounds):
        t0 = time.perf_counter()
        if a.shuffle:  # a fresh lettering per rollout and agent; the model's letter draw on it
            orders = [[rng.permutation(n_opts[i]) for i in range(n)] for _ in range(k)]
            rows = [encode(i, orders[r][i]) for r in range(k) for i in range(n)]
            pl = letter_probs(adapters, rows, list(range(n)) * k)
            letter = np.array(
                [[rng.choice(n_opts[i], p=pl[r * n + i] / pl[r * n + i].sum()) for i in range(n)] for r in range(k)]
            )
            chosen = np.array([[orders[r][i][letter[r, i]] for i in range(n)] for r in range(k)])
        else:
            rows = [prompts[i] for _ in range(k) for i in range(n)]
            letter = np.array([[rng.choice(len(p[i]), p=p[i] / p[i].sum()) for i in range(n)] for _ in range(k)])
            chosen = letter
        hit = chosen == np.asarray(target)[None, :]
        returns = hit.mean(axis=1).astype(np.float32)
        adv = np.asarray(magrpo.group_relative_advantage(jnp.asarray(returns)))
        train_rows, train_letters = list(rows), letter.reshape(-1).tolist()  # rollout-major, as rows
        train_agents, train_adv = list(range(n)) * k, np.repeat(adv, n).tolist()
        # (rollout, agent, lettering) of every extra training row: the same option and advantage, another lettering
        extra = [
            (r, i, aug_rng.permutation(n_opts[i])) for _ in range(a.augment - 1) for r in range(k) for i in range(n)
        ]
        if a.cyclic:  # shift s shows the drawn lettering rotated by s: the chosen option once under every letter
            extra = [(r, i, np.roll(orders[r][i], s)) for r in range(k) for i in range(n) for s in range(1, n_opts[i])]
        for r, i, order in extra:
            train_rows.append(encode(i, order))
            train_letters.append(int(np.flatnonzero(order == chosen[r, i])[0]))
            train_agents.append(i)
            train_adv.append(float(adv[r]))
        batch = ts.pack_decisions(  # the round's K x N decisions, each with its rollout's advantage
            train_rows,
            [[cands[i][j]] for j, i in zip(train_letters, train_agents)],
            train_agents,
            np.asarray(train_adv, np.float32),
            prompt_len=width - len(prefix),
            prefix=prefix,
            choices=[cands[i] for i in train_agents],
            pad_to_multiple=8,
        )
        key, sub = jax.random.split(key)
        updated = bool(np.any(adv != 0))  # the trainer's rule (RunConfig.skip_zero_advantage, every preset)
        m = {"kl": np.zeros((1, n)), "grad_norm": np.zeros((1, n))}
        if updated:
            batch = step.prepare(base, adapters, batch)
            adapters, opt, m = step.update(base, adapters, opt, batch, sub)
            p, p_letter = probs(adapters)
        row = {
            "round": rnd,
            "p_target": [float(p[i][target[i]]) for i in range(n)],
            "return_mean": float(returns.mean()),
            "updated": updated,
            "kl": [float(x) for x in np.asarray(m["kl"]).mean(axis=0)],
            "grad_norm": [float(x) for x in np.asarray(m["grad_norm"]).max(axis=0)],
            "s": time.perf_counter() - t0,
        }
        if a.shuffle:  # P(letter) on the held-out letterings: a letter preference shows here, not in p_target
            row["p_letter"] = [x.round(4).tolist() for x in p_letter]
        log.append(row)
        print(json.dumps(row), flush=True)
    phrases = [menu_phrases(t) for t in texts]
    out = {
        "learning_rate": cfg.learning_rate,
        "config": dataclasses.asdict(cfg),
        "lora": {"rank": lcfg.rank, "alpha": lcfg.alpha, "targets": list(lcfg.targets)},
        "prefix_tokens": len(prefix),
        "prompt_tokens": [len(x) for x in prompts],
        "trim": a.trim,
        "shuffle": a.shuffle,
        "augment": a.augment,
        "cyclic": a.cyclic,
        "prompt_text": [tok.decode(x) for x in prompts],
        "menus": [r["menu"] for r in recs],
        "target": [phrases[i][target[i]] if a.shuffle else recs[i]["menu"][target[i]] for i in range(n)],
        "heldout_letterings": [[o.tolist() for o in h] for h in heldout],
        "p0": [x.tolist() for x in p0],
        "rounds": log,
    }
    json.dump(out, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
