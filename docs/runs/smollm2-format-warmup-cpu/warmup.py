"""Does a short supervised format warm-up make SmolLM2-135M's `sample` answers parse? (a diagnostic, not the method)

The frozen SmolLM2-135M-Instruct fails to parse 86-97% of its `sample` answers (paper §5.1's two-line contract,
`docs/runs/frozen-smollm2-cpu/` parts 1 and 4): a failed parse makes the agent wait, so PA-MAGRPO in `sample` mode
has little to learn from. Part 4 left two levers: a bigger backbone, or a supervised format warm-up. This probe
measures the second. It is a departure from the paper (which starts PA-MAGRPO from the frozen base), so it asks
two things, not one:

1. *Format*: after S steps of supervised fine-tuning of one LoRA adapter (the paper preset's rank 32, alpha 64,
   its target modules) on answers ``state: <label>\\nchoice: <letter><end of turn>``, what share of `sample`
   answers parse, at the game's paper temperature and 12-token budget, on held-out decision prompts?
2. *Preference*: does the warm-up leave the choice among the menu's options to the policy? The training letter is
   drawn uniformly from the menu, so the targets carry no option preference; the probe measures what the warm-up
   did to the letter distribution anyway: the `choice_only` distribution P(letter | ``state: <label>\\nchoice:``)
   over the menu's letters at the temperature, its KL from the frozen base's and its entropy against uniform, and
   the top letter's share among the parsed `sample` answers.

The label is the game state's (the one `choice_only` prefills; `jaxopt_marl.prompts`), so the warm-up also
teaches the state line. Training prompts are the decisions of the first half of each game's episode (steps
below the median decision step); the held-out prompts come from the second half. Each step's batch is one game's
(games in turn), rows drawn with replacement, loss = mean cross-entropy over the answer tokens at temperature 1,
AdamW with global-norm clipping at 1.0. The evaluation draws use one PRNG key per held-out row, the same keys at
every evaluation point, so the points are paired.

    python docs/runs/smollm2-format-warmup-cpu/warmup.py --traces DIR [DIR ...] --steps 40 --eval-at 0,10,20,40 \\
        --out warmup.json --responses warmup_responses.jsonl

DIR: decision traces of ``python -m experiments.bench rollout --game G --model tiny-random --mode choice_only
--rollouts 1 --steps T --no-host --repeats 1 --traces DIR`` (as in `docs/runs/frozen-smollm2-cpu/` part 4).
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxopt_marl import menus, parsing
from jaxopt_marl.config import GAMES, RunConfig
from jaxopt_marl.rollout import left_pad, load_policy_model
from lora import sampling, split_model
from lora.tokenizer import stop_token_ids

_spec = importlib.util.spec_from_file_location(
    "format_probe", os.path.join(os.path.dirname(__file__), "..", "frozen-smollm2-cpu", "format_probe.py")
)
format_probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(format_probe)

WIDTH_QUANTUM = 64  # prompt widths are padded to a multiple of this: a few compiles, not one per batch


def split_halves(recs: list[dict]) -> tuple[list[dict], list[dict]]:
    """``(train, held_out)``: decisions before the median decision step, and the rest."""
    cut = float(np.median([r["step"] for r in recs]))
    train = [r for r in recs if r["step"] < cut]
    held = [r for r in recs if r["step"] >= cut]
    if not train or not held:
        raise ValueError(f"cannot split {len(recs)} decisions at step {cut}: one half is empty")
    return train, held


def quantised(n: int) -> int:
    return -(-n // WIDTH_QUANTUM) * WIDTH_QUANTUM


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", nargs="+", required=True)
    ap.add_argument("--steps", type=int, default=40, help="supervised steps (one batch of one game each)")
    ap.add_argument("--eval-at", default="0,10,20,40", help="steps after which to evaluate (0 = the frozen base)")
    ap.add_argument("--batch", type=int, default=8, help="training rows per step")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--held-out", type=int, default=32, help="held-out prompts per game")
    ap.add_argument("--eval-batch", type=int, default=16)
    ap.add_argument(
        "--letter-target",
        choices=("uniform", "base", "none"),
        default="uniform",
        help="the training answer's letter: uniform over the menu; drawn from the frozen base's choice_only "
        "distribution (see --base-draw-temperature); or 'none': drawn uniformly but left out of the loss (only the "
        "format tokens around it are supervised)",
    )
    ap.add_argument(
        "--base-draw-temperature",
        default="1",
        help="with --letter-target base: the temperature of the base's distribution the letters are drawn from, a "
        "number or 'paper' (the game's rollout temperature). The loss is at temperature 1, so 1 keeps the base's "
        "letter distribution; drawing at the rollout's 0.7 / 0.9 sharpens it (measured: warmup_base_draw_paper.json)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--responses", default=None, help="also write every sampled held-out answer here (JSONL)")
    a = ap.parse_args()
    try:
        eval_at = sorted({int(x) for x in a.eval_at.split(",")})
    except ValueError:
        raise SystemExit(f"error: --eval-at {a.eval_at!r}: not a comma-separated list of integers") from None
    if a.base_draw_temperature != "paper":
        try:
            ok = float(a.base_draw_temperature) > 0
        except ValueError:
            ok = False
        if not ok:
            raise SystemExit(f"error: --base-draw-temperature {a.base_draw_temperature!r}: a number > 0 or 'paper'")
    if eval_at[0] < 0 or eval_at[-1] > a.steps:
        raise SystemExit(f"error: --eval-at {a.eval_at}: each must be in [0, --steps {a.steps}]")

    rng = np.random.default_rng(a.seed)
    games, train, held = [], {}, {}
    for d in a.traces:
        g = format_probe.game_of(d)
        tr, ho = split_halves(format_probe.load_decisions(d))
        pick = rng.choice(len(ho), size=min(a.held_out, len(ho)), replace=False)
        games.append(g)
        train[g], held[g] = tr, [ho[i] for i in sorted(pick)]

    # one adapter of the first game's paper-preset LoRA (Cleanup / Harvest: rank 32, alpha 64)
    lcfg = dataclasses.replace(RunConfig.paper(games[0]).lora, num_adapters=1)
    model, tok = load_policy_model(None, lcfg, seed=a.seed)
    graphdef, adapters, base = split_model(model)
    eos = stop_token_ids(tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    if len(eos) != 1:  # SmolLM2: <|im_end|> is both the template's end of turn and the EOS
        raise ValueError(f"expected one stop token (end of turn = EOS), got {eos}")
    end_of_turn = eos[0]
    letter_ids = np.array([tok.encode(f" {c}", add_special_tokens=False)[0] for c in menus.LETTERS], np.int32)

    def prompt_of(rec):  # (chat text through the generation prompt, the state label)
        return format_probe.split_prompt(rec["prompt_text"])

    # the training examples: prompt ids and answer ids, per game
    examples = {}
    for g in games:
        rows = []
        for rec in train[g]:
            base_text, label = prompt_of(rec)
            rows.append((tok.encode(base_text, add_special_tokens=False), label, len(rec["menu"]), rec["prompt_ids"]))
        examples[g] = rows
    answer_width = 16

    def answer_ids(label: str, letter: str) -> list[int]:
        ids = tok.encode(f"state: {label}\nchoice: {letter}", add_special_tokens=False) + [end_of_turn]
        if len(ids) > answer_width:
            raise ValueError(f"answer of {len(ids)} tokens > {answer_width}: state {label!r}")
        return ids

    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(a.lr, weight_decay=0.0))
    opt_state = opt.init(adapters)

    @jax.jit
    def sft_step(adapters, opt_state, pids, pmask, cids, cmask):
        def loss_fn(ad):
            m = nnx.merge(graphdef, ad, base)
            lp = sampling.continuation_logprobs(
                m, pids, pmask, cids, cmask, agent_ids=jnp.zeros(pids.shape[0], jnp.int32)
            )
            return -(lp * cmask).sum() / cmask.sum()

        loss, grads = jax.value_and_grad(loss_fn)(adapters)
        updates, opt_state = opt.update(grads, opt_state, adapters)
        return optax.apply_updates(adapters, updates), opt_state, loss

    @jax.jit
    def choice_probs(adapters, ids, mask, cand):
        """float32[B, 26]: the logits of each row's candidate letter tokens ``cand`` after the row (-1 = none)."""
        m = nnx.merge(graphdef, adapters, base)
        h, _ = m.hidden(ids, attention_mask=mask, agent_ids=jnp.zeros(ids.shape[0], jnp.int32))
        return m.logits(h[:, -1], jnp.maximum(cand, 0))

    def menu_candidates(recs_menu_sizes):
        cand = np.full((a.eval_batch, len(menus.LETTERS)), -1, np.int32)
        for r, n in enumerate(recs_menu_sizes):
            cand[r, :n] = letter_ids[:n]
        return jnp.asarray(cand)

    def letter_dists(adapters, prompt_id_lists, sizes, temp):
        """P(letter) over each row's first ``sizes[r]`` menu letters at ``temp``, after `choice_only` prompts."""
        out = []
        for b0 in range(0, len(prompt_id_lists), a.eval_batch):
            ids = prompt_id_lists[b0 : b0 + a.eval_batch]
            cid, cmsk = left_pad(ids, pad, a.eval_batch, quantised(max(len(x) for x in ids)))
            logits = np.asarray(choice_probs(adapters, cid, cmsk, menu_candidates(sizes[b0 : b0 + a.eval_batch])))
            for r, n in enumerate(sizes[b0 : b0 + a.eval_batch]):
                z = logits[r, :n] / temp
                q = np.exp(z - z.max())
                out.append(q / q.sum())
        return out

    # --letter-target base: each training example's letter distribution, the frozen base's (before any step)
    train_letter_p = {}
    if a.letter_target == "base":
        for g in games:
            train_letter_p[g] = letter_dists(  # adapters still at init (B = 0): the frozen base
                adapters,
                [x for _, _, _, x in examples[g]],
                [n for _, _, n, _ in examples[g]],
                RunConfig.paper(g).magrpo.temperature
                if a.base_draw_temperature == "paper"
                else float(a.base_draw_temperature),
            )

    eval_keys = {
        g: jax.random.split(jax.random.fold_in(jax.random.key(a.seed + 1), GAMES.index(g)), len(held[g])) for g in games
    }
    out_rows, points = [], []

    def evaluate(step: int, adapters, base_probs):
        state = nnx.state(nnx.merge(graphdef, adapters, base))
        point = {"step": step, "per_game": {}}
        probs_now = {}
        for g in games:
            paper = RunConfig.paper(g)
            temp, budget = paper.magrpo.temperature, paper.max_new_tokens
            recs = held[g]
            counts, labels_ok, letters_chosen, t0 = {}, 0, [], time.time()
            # the choice_only distribution: the trace prompt ends with "state: <label>\nchoice:"
            probs_g = letter_dists(adapters, [r["prompt_ids"] for r in recs], [len(r["menu"]) for r in recs], temp)
            for b0 in range(0, len(recs), a.eval_batch):
                chunk = recs[b0 : b0 + a.eval_batch]
                bases = [prompt_of(r) for r in chunk]
                ids = [tok.encode(b, add_special_tokens=False) for b, _ in bases]
                width = quantised(max(len(x) for x in ids))
                pid, msk = left_pad(ids, pad, a.eval_batch, width)
                keys = eval_keys[g][b0 : b0 + a.eval_batch]
                if len(chunk) < a.eval_batch:  # pad the key rows too; padded rows are dropped below
                    keys = jnp.concatenate([keys, jnp.repeat(keys[:1], a.eval_batch - len(chunk), axis=0)])
                gen = sampling.generate_rows(
                    graphdef,
                    state,
                    pid,
                    msk,
                    keys,
                    jnp.zeros(a.eval_batch, jnp.int32),
                    temp,
                    max_new_tokens=budget,
                    eos_ids=eos,
                    pad_id=pad,
                )
                toks, gmask = np.asarray(gen.tokens), np.asarray(gen.mask)
                for r, rec in enumerate(chunk):
                    resp = [int(t) for t, mk in zip(toks[r], gmask[r]) if mk and int(t) not in eos]
                    text = tok.decode(resp, skip_special_tokens=True)
                    res = parsing.parse_response(text, format_probe.letters_of(rec["menu"]))
                    counts[res.reason] = counts.get(res.reason, 0) + 1
                    labels_ok += int(res.state == bases[r][1])
                    if res.reason == parsing.OK:
                        letters_chosen.append(res.letter)
                    out_rows.append(
                        {
                            "after_step": step,
                            "game": g,
                            "step": rec["step"],
                            "aid": rec["aid"],
                            "menu": rec["menu"],
                            "label": bases[r][1],
                            "response": text,
                            "parse": res.reason,
                            "letter": res.letter,
                        }
                    )
            probs_now[g] = probs_g
            n_rec = len(recs)
            ent = [float(-(p * np.log(p)).sum() / np.log(len(p))) for p in probs_g]
            top = max(letters_chosen.count(c) for c in set(letters_chosen)) if letters_chosen else 0
            row = {
                "held_out": n_rec,
                "parse_counts": counts,
                "ok_rate": counts.get(parsing.OK, 0) / n_rec,
                "state_label_rate": labels_ok / n_rec,
                "top_letter_share_of_parsed": top / len(letters_chosen) if letters_chosen else None,
                "letters_parsed": {c: letters_chosen.count(c) for c in sorted(set(letters_chosen))},
                "choice_only_entropy_vs_uniform": float(np.mean(ent)),
                "choice_only_p_letter_A": float(np.mean([p[0] for p in probs_g])),
                "uniform_p_letter_A": float(np.mean([1 / len(p) for p in probs_g])),
                "s": time.time() - t0,
            }
            if base_probs is not None:
                kl = [float((q * (np.log(q) - np.log(p))).sum()) for q, p in zip(base_probs[g], probs_g)]
                tv = [float(0.5 * np.abs(q - p).sum()) for q, p in zip(base_probs[g], probs_g)]
                row["choice_only_kl_base_to_warm"] = float(np.mean(kl))
                row["choice_only_tv_base_to_warm"] = float(np.mean(tv))
            point["per_game"][g] = row
            print(step, g, json.dumps({k: v for k, v in row.items() if k != "letters_parsed"}), flush=True)
        points.append(point)
        return probs_now

    base_probs = evaluate(0, adapters, None) if 0 in eval_at else None
    losses, t_train = [], 0.0
    for s in range(1, a.steps + 1):
        g = games[(s - 1) % len(games)]
        pick = rng.integers(0, len(examples[g]), size=a.batch)
        prompts_b, answers = [], []
        for i in pick:
            ids, label, n_menu, _ = examples[g][i]
            prompts_b.append(ids)
            if a.letter_target == "base":
                j = int(rng.choice(n_menu, p=train_letter_p[g][i]))
            else:
                j = int(rng.integers(0, n_menu))
            answers.append(answer_ids(label, menus.LETTERS[j]))
            if answers[-1][-2] != letter_ids[j]:  # the letter is the token before the end of turn
                raise ValueError(f"the answer's letter {menus.LETTERS[j]} is not one token: {answers[-1]}")
        width = quantised(max(len(x) for x in prompts_b))
        pid, pm = left_pad(prompts_b, pad, a.batch, width)
        cid = np.full((a.batch, answer_width), pad, np.int32)
        cm = np.zeros((a.batch, answer_width), bool)
        for r, x in enumerate(answers):
            cid[r, : len(x)] = x
            cm[r, : len(x)] = True
            if a.letter_target == "none":
                cm[r, len(x) - 2] = False  # the letter: not supervised
        t0 = time.perf_counter()
        adapters, opt_state, loss = sft_step(adapters, opt_state, pid, pm, jnp.asarray(cid), jnp.asarray(cm))
        loss = float(loss)
        t_train += time.perf_counter() - t0
        losses.append({"step": s, "game": g, "loss": loss, "width": width})
        print(json.dumps(losses[-1]), flush=True)
        if s in eval_at:
            evaluate(s, adapters, base_probs)

    with open(a.out, "w") as fh:
        json.dump(
            {
                "model": "SmolLM2-135M-Instruct (GGUF) + one LoRA adapter",
                "lora": {"rank": lcfg.rank, "alpha": lcfg.alpha, "targets": list(lcfg.targets)},
                "lr": a.lr,
                "letter_target": a.letter_target,
                "base_draw_temperature": a.base_draw_temperature if a.letter_target == "base" else None,
                "batch": a.batch,
                "steps": a.steps,
                "seed": a.seed,
                "train_decisions": {g: len(train[g]) for g in games},
                "train_seconds": t_train,
                "losses": losses,
                "points": points,
            },
            fh,
            indent=1,
        )
    if a.responses:
        with open(a.responses, "w") as fh:
            for r in out_rows:
                fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
