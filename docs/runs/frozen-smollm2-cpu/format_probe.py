"""Does a response prefix or an example make the frozen SmolLM2 write the paper's two-line answer? (a diagnostic)

Part 1 of this folder's README found that the frozen SmolLM2-135M-Instruct fails to parse 86-97% of its `sample`
answers, every failure a `no_choice`: it does not write `state: <label>` / `choice: <letter>`. Issue #12 item 6
asks what would change that outcome. This probe samples the frozen base (adapters off) on real decision prompts of
each game under five variants of the prompt and counts the host parser's outcomes (`jaxopt_marl.parsing`):

- ``paper``: the prompt as the rollout gives it (the method, paper §5.1's two-line contract in the system turn);
- ``prefix_state``: the assistant turn starts with ``state:`` (the contract's first token, a decoding aid: the
  model still writes the label and the whole ``choice:`` line itself);
- ``prefix_label``: the assistant turn starts with ``state: <label>\\n`` (the label from the game state, as the
  `choice_only` prefix has it); the model writes the ``choice:`` line itself;
- ``prefix_choice``: the assistant turn starts with ``state: <label>\\nchoice:`` (the `choice_only` scoring's
  response prefix, with the label from the game state), and the model samples the rest over its whole vocabulary:
  how often an unconstrained SmolLM2 writes a menu letter where `choice_only` forces one;
- ``example``: the system turn's contract followed by one worked example of the answer
  (``Example answer:`` / ``state: <first label>`` / ``choice: B``).

The parser reads the prefix and the response together, as it would read the whole answer. Each prompt is sampled
once per variant at the game's paper temperature (0.7, Overcooked 0.9) with the run's budget of 12 new tokens;
the draws use one PRNG key per row from a stream per (game, variant), so a variant's samples depend neither on the
batch nor on the other games' prompts.

    python docs/runs/frozen-smollm2-cpu/format_probe.py --traces DIR [DIR ...] --per-game 48 --out F.json

DIR: the decision traces of `python -m experiments.bench rollout --game G --model tiny-random --mode choice_only
--rollouts 1 --steps T --no-host --repeats 1 --traces DIR`, T the game's episode length (their `prompt_text` is the full chat string, ending
with the `choice_only` response prefix; the tiny model shares SmolLM2's tokenizer and prompts, so the texts are
the ones SmolLM2 is given; the states are those of near-uniform play, as the frozen SmolLM2's own `choice_only`
play is).
"""

import argparse
import glob
import json
import os
import re
import time

import jax
import numpy as np
from flax import nnx

from jaxopt_marl import parsing, prompts
from jaxopt_marl.config import GAMES, RunConfig
from jaxopt_marl.rollout import left_pad
from lora import load_model, sampling
from lora.tokenizer import stop_token_ids

VARIANTS = ("paper", "prefix_state", "prefix_label", "prefix_choice", "example")
GENERATION_PROMPT = "<|im_start|>assistant\n"
CHOICE_PREFIX = re.compile(r"state: (?P<label>[^\n]*)\nchoice:$")
CONTRACT_END = "choice: <single capital letter>"
EXAMPLE_LETTER = "B"


def load_decisions(trace_dir: str) -> list[dict]:
    """Every decision record with a menu of >= 2 letters from ``trace_dir/*.jsonl``."""
    out = []
    for path in sorted(glob.glob(os.path.join(trace_dir, "**", "*.jsonl"), recursive=True)):
        with open(path) as fh:
            for line in fh:
                rec = json.loads(line)
                if "prompt_text" in rec and len(rec.get("menu") or []) >= 2:
                    out.append(rec)
    if not out:
        raise ValueError(f"{trace_dir}: no decision records with prompt_text and a menu of >= 2 letters")
    return out


def split_prompt(text: str) -> tuple[str, str]:
    """``(chat text up to the generation prompt, state label)`` of a `choice_only` trace prompt."""
    m = CHOICE_PREFIX.search(text)
    if m is None or not text[: m.start()].endswith(GENERATION_PROMPT):
        raise ValueError(
            f"not a choice_only prompt (no 'state: ...\\nchoice:' after the generation prompt): {text[-80:]!r}"
        )
    return text[: m.start()], m.group("label")


def variant_prompt(variant: str, base: str, label: str, first_label: str) -> tuple[str, str]:
    """``(prompt text, response prefix)`` of one variant; the prefix is also the start of the answer parsed."""
    if variant == "paper":
        return base, ""
    if variant == "prefix_state":
        return base + "state:", "state:"
    if variant == "prefix_label":
        prefix = f"state: {label}\n"
        return base + prefix, prefix
    if variant == "prefix_choice":
        prefix = f"state: {label}\nchoice:"
        return base + prefix, prefix
    if variant == "example":
        if base.count(CONTRACT_END) != 1:
            raise ValueError(f"the system turn does not hold the contract line {CONTRACT_END!r} exactly once")
        example = f"{CONTRACT_END}\n\nExample answer:\nstate: {first_label}\nchoice: {EXAMPLE_LETTER}"
        return base.replace(CONTRACT_END, example), ""
    raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")


def game_of(trace_dir: str) -> str:
    """The game whose traces ``trace_dir`` holds (the bench names its file ``bench_<game>_<interface>_<mode>.jsonl``)."""
    names = {os.path.basename(p) for p in glob.glob(os.path.join(trace_dir, "**", "*.jsonl"), recursive=True)}
    games = {g for g in GAMES for n in names if n.startswith(f"bench_{g}_")}
    if len(games) != 1:
        raise ValueError(f"{trace_dir}: cannot tell the game from its trace files {sorted(names)}")
    return games.pop()


def letters_of(menu: list[str]) -> str:
    return "".join(line.split(")", 1)[0].strip() for line in menu)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", nargs="+", required=True)
    ap.add_argument("--per-game", type=int, default=48)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--responses", default=None, help="also write every sampled answer here (JSONL)")
    args = ap.parse_args()
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"error: unknown variant {v!r}; valid: {', '.join(VARIANTS)}")

    model, tok = load_model(None)
    graphdef, state = nnx.split(model)
    eos = stop_token_ids(tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    rng = np.random.default_rng(args.seed)
    summary, rows_out = {}, []
    for trace_dir in args.traces:
        recs = load_decisions(trace_dir)
        game = game_of(trace_dir)
        paper = RunConfig.paper(game)
        temp, budget = paper.magrpo.temperature, paper.max_new_tokens
        first_label = prompts.prompt_family(game).labels[0]
        pick = rng.choice(len(recs), size=min(args.per_game, len(recs)), replace=False)
        recs = [recs[i] for i in sorted(pick)]
        for rec in recs:  # the texts re-encode to the ids the rollout gave the model (issue #11's exactness)
            if tok.encode(rec["prompt_text"], add_special_tokens=False) != rec["prompt_ids"]:
                raise ValueError(
                    f"{game} step {rec['step']} agent {rec['aid']}: prompt_text does not encode to prompt_ids"
                )
        summary[game] = {"decisions": len(recs), "temperature": temp, "max_new_tokens": budget, "variants": {}}
        for variant in variants:
            t0 = time.time()
            counts: dict[str, int] = {}
            # one stream per (game, variant): games with alike prompts must not share their draws
            variant_key = jax.random.fold_in(
                jax.random.fold_in(jax.random.key(args.seed), GAMES.index(game)), VARIANTS.index(variant)
            )
            row_keys = jax.random.split(variant_key, len(recs))
            for b0 in range(0, len(recs), args.batch):
                chunk = recs[b0 : b0 + args.batch]
                texts, prefixes = [], []
                for rec in chunk:
                    base, label = split_prompt(rec["prompt_text"])
                    t, p = variant_prompt(variant, base, label, first_label)
                    texts.append(t)
                    prefixes.append(p)
                ids = [tok.encode(t, add_special_tokens=False) for t in texts]
                pid, msk = left_pad(ids, pad, len(ids), max(len(x) for x in ids))
                keys = row_keys[b0 : b0 + len(chunk)]
                gen = sampling.generate_rows(
                    graphdef, state, pid, msk, keys, None, temp, max_new_tokens=budget, eos_ids=eos, pad_id=pad
                )
                toks, mask = np.asarray(gen.tokens), np.asarray(gen.mask)
                for r, rec in enumerate(chunk):
                    resp = [int(t) for t, m in zip(toks[r], mask[r]) if m and int(t) not in eos]
                    text = tok.decode(resp, skip_special_tokens=True)
                    res = parsing.parse_response(prefixes[r] + text, letters_of(rec["menu"]))
                    counts[res.reason] = counts.get(res.reason, 0) + 1
                    rows_out.append(
                        {
                            "game": game,
                            "variant": variant,
                            "step": rec.get("step"),
                            "aid": rec.get("aid"),
                            "menu": rec["menu"],
                            "prefix": prefixes[r],
                            "response": text,
                            "parse": res.reason,
                            "letter": res.letter,
                        }
                    )
            ok = counts.get(parsing.OK, 0)
            summary[game]["variants"][variant] = {
                "counts": counts,
                "ok": ok,
                "ok_rate": ok / len(recs),
                "s": time.time() - t0,
            }
            print(game, variant, counts, f"{time.time() - t0:.0f} s", flush=True)
    with open(args.out, "w") as fh:
        json.dump(
            {"per_game": summary, "seed": args.seed, "model": "SmolLM2-135M-Instruct (GGUF, frozen)"}, fh, indent=1
        )
    if args.responses:
        with open(args.responses, "w") as fh:
            for r in rows_out:
                fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
