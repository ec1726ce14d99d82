"""Rollout benchmark: the compiled rollout against the host loop and a bare LLM forward, in one run.

``python -m experiments.bench rollout [--game G] [--model default|tiny-random|PATH] [--mode choice_only|sample]
[--interface menu|native] [--rollouts K] [--steps T] [--traces DIR] [--out FILE]`` times, on one machine in one
process:

* **compiled**: :class:`jaxopt_marl.compiled_rollout.CompiledRoller` -- K joint episodes of T steps with the LLM
  in the loop as one jitted program (compile excluded: the first call is a warm-up; the median of
  ``--repeats`` calls, ``block_until_ready``);
* **host**: the host loop (:class:`jaxopt_marl.rollout.Roller`: menus and prompts in Python, the tokenizer, one
  batched LLM call per wave), same game, seeds and key, timed on a second call after a warm-up call
  (``--host-steps`` shortens its episodes for slow models: decisions/s is a rate);
* **bare forward**: the LLM alone over exactly the compiled rollout's prompts, wave by wave, padded as the host
  loop pads them (rows to ``rollout._rows_bucket``, columns to a multiple of ``rollout.LENGTH_BUCKET``, the
  system turn from a per-adapter prefix cache): the cost of the model with no loop around it (compile
  excluded). In ``sample`` mode it is the prompt pass only (no decoding).

``--interface native`` (paper §4: the primitive actions as a fixed-letter menu, one decision per present agent per
env step, :class:`jaxopt_marl.interfaces.NativeLibrary`) times both rollouts on that interface instead; it has no
guards, so no burn-in runs. Under ``menu`` the guards come from a short uniform burn-in (``--burnin-episodes``
solo + joint episodes), as a run's would. The JSON (``--out``) has ``game, interface, mode, model, rollouts,
steps, decisions, waves, compiled_decisions_per_s, host_decisions_per_s, bare_forward_decisions_per_s,
ms_per_wave`` and the raw seconds (compile apart: ``compile_s``, ``host_first_call_s``); in ``sample`` mode also
``parse``: the compiled rollout's parse outcomes by reason and the failure rate with its exact 95% interval
(issue #12 item 5: with ``--model default`` and adapters at zero, the frozen base's rate at the given budget).
``model_rows`` counts the decisions the LLM ran for (in ``choice_only`` a one-letter menu needs none).
``--update`` also times one round's PA-MAGRPO update on the compiled rollout's batch (:func:`time_update`), rows in
rollout order against the trainer's order (forced choices last, whose micro-batches cost no forward): JSON
``update``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).resolve().parent
        ).stdout.strip()
    except OSError:
        return ""


def bare_forward_batches(roller, res, policy) -> list[tuple]:
    """The compiled rollout's prompts regrouped by decision wave and padded as the host loop pads them.

    Returns:
        ``[(ids int32[B, Tp], mask bool[B, Tp], rows int32[B], n_real)]``, one batch per wave: rows padded to
        ``rollout._rows_bucket(n)``, columns to a multiple of ``rollout.LENGTH_BUCKET`` (host padding).
    """
    from jaxopt_marl import rollout

    by_wave: dict[tuple[int, int], list[dict]] = {}
    for t in res.traces:
        by_wave.setdefault((t["rollout"] // roller.batch, t["wave"]), []).append(t)
    prefix = len(roller.prefix_ids)
    out = []
    for _, ts in sorted(by_wave.items()):
        suffix = [t["prompt_ids"][prefix:] for t in ts]
        tp = rollout._bucket(max(map(len, suffix)), rollout.LENGTH_BUCKET)
        b = rollout._rows_bucket(len(ts))
        ids, mask = rollout.left_pad(suffix, roller.pad_id, b, tp)
        rows = np.zeros((b,), np.int32)
        rows[: len(ts)] = policy.adapter_ids(np.array([t["aid"] for t in ts]), reference=False)
        out.append((ids, mask, rows, len(ts)))
    return out


def time_update(roller, res, repeats: int) -> dict:
    """Seconds of one round's PA-MAGRPO update (``prepare`` + ``update``: the run presets' micro-batch size, one
    minibatch, the smoke preset's other settings) on the compiled rollout's batch, median of ``repeats`` after a
    compiling call, in rollout order and with the forced choices last (:func:`jaxopt_marl.train_step.trainable_first`,
    what the trainer does); the same decisions and advantages (+1 / -1 alternating by rollout), so the same
    update up to summation order."""
    import jax

    from jaxopt_marl import compiled_rollout as cr
    from jaxopt_marl import magrpo
    from jaxopt_marl import train_step as ts
    from jaxopt_marl.config import MICRO_BATCH
    from lora import split_model

    graphdef, adapters, base = split_model(roller.model)
    mcfg = magrpo.MAGRPOConfig.smoke(temperature=roller.cfg.temperature, micro_batch=MICRO_BATCH)
    step = ts.make_train_step(graphdef, mcfg, ts.make_mesh(1), num_adapters=roller.model.lora_cfg.num_adapters)
    adv = np.where(np.arange(len(res.returns)) % 2 == 0, 1.0, -1.0).astype(np.float32)
    batch = cr.decision_batch(roller, res, adv, row_multiple=MICRO_BATCH, prefix=roller.prefix_ids)
    out = {"rows": int(batch.num_decisions), "trainable": int(np.asarray(ts.trainable(batch)).sum())}
    for name, b in (("rollout_order_s", batch), ("forced_last_s", ts.trainable_first(batch))):
        times = []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            prepared = step.prepare(base, adapters, b)
            jax.block_until_ready(
                step.update(base, adapters, step.optimizer.init(adapters), prepared, jax.random.key(0))
            )
            if i:  # the first call compiles
                times.append(time.perf_counter() - t0)
        out[name] = float(np.median(times))
    out["speedup"] = out["rollout_order_s"] / out["forced_last_s"]
    print(
        f"update ({out['rows']} rows, {out['trainable']} with two or more letters): rollout order "
        f"{out['rollout_order_s']:.2f} s, forced choices last {out['forced_last_s']:.2f} s ({out['speedup']:.2f}x)"
    )
    return out


def parse_summary(stats) -> dict:
    """The compiled rollout's parse outcomes (``sample`` mode): ``{"counts": {reason: n}, "failure":
    {"k", "n", "rate", "ci"}}``, the failure rate with its exact 95% interval (:func:`jaxopt_marl.stats.rate_ci`).
    Issue #12 item 5: the frozen base's parse-failure rate at the paper's budget, measured before training."""
    from jaxopt_marl.stats import rate_ci

    return {"counts": stats.as_dict(), "failure": rate_ci(stats.failures, stats.total)}


def main(argv: list[str] | None = None) -> None:
    from experiments.cli import ArgParser

    ap = ArgParser(prog="python -m experiments.bench rollout", description=__doc__.split("\n")[0])
    ap.add_argument("--game", default="cleanup", help="cleanup | harvest | overcooked_aa | overcooked_fc")
    ap.add_argument("--model", default="default", help="default (SmolLM2-135M GGUF) | tiny-random | PATH")
    ap.add_argument("--mode", default="choice_only", help="choice_only | sample")
    ap.add_argument("--interface", default="menu", help="menu | native (compound_json plays the host loop only)")
    ap.add_argument("--rollouts", type=int, default=4, help="K joint episodes per call")
    ap.add_argument("--steps", type=int, default=150, help="episode length T (env steps)")
    ap.add_argument("--host-steps", type=int, default=None, help="episode length of the host loop (default T)")
    ap.add_argument("--no-host", action="store_true", help="skip the host loop")
    ap.add_argument("--repeats", type=int, default=3, help="timed compiled calls (median)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=12, help="sample mode: response budget")
    ap.add_argument("--burnin-episodes", type=int, default=100, help="solo + joint burn-in episodes for guards")
    ap.add_argument("--rows", default=None, help="chunk row sizes, e.g. 8,4,2,1 (default: per backend)")
    ap.add_argument("--length-step", type=int, default=None, help="chunk column step (default: per backend)")
    ap.add_argument("--pad-rows", action="store_true", help="pad chunks to the next row size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--traces", default=None, help="write the compiled rollout's decision traces here")
    ap.add_argument("--out", default=None, help="write the results JSON here")
    ap.add_argument(
        "--update",
        action="store_true",
        help="also time the PA-MAGRPO update on the compiled rollout's batch, rows in rollout order and with the "
        "forced (one-letter) choices last (train_step.trainable_first)",
    )
    args = ap.parse_args(argv)

    from jaxopt_marl.config import GAMES, NUM_AGENTS
    from jaxopt_marl.errors import InputError
    from jaxopt_marl.preflight import check_model

    if args.game not in GAMES:
        raise InputError(f"unknown game {args.game!r}; valid games: {', '.join(GAMES)}")
    if args.mode not in ("choice_only", "sample"):
        raise InputError(f"unknown mode {args.mode!r}; valid: choice_only, sample")
    bench_interfaces = ("menu", "native")  # the compiled rollout's (jaxopt_marl.prompt_ids.DEVICE_INTERFACES)
    if args.interface not in bench_interfaces:
        raise InputError(f"unknown --interface {args.interface!r}; valid: {', '.join(bench_interfaces)}")
    for name in ("rollouts", "steps", "repeats"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} must be >= 1, got {getattr(args, name)}")
    check_model(None if args.model == "default" else args.model)  # missing or truncated: before the burn-in
    if args.rows is not None:
        try:
            ok = all(int(x) >= 1 for x in args.rows.split(","))
        except ValueError:
            ok = False
        if not ok:
            raise InputError(f"--rows {args.rows!r}: expected comma-separated positive integers, e.g. 8,4,2,1")

    import jax
    import jax.numpy as jnp

    import envs_jax
    from jaxopt_marl import burnin, options, rollout
    from jaxopt_marl import compiled_rollout as cr
    from jaxopt_marl import guards as G
    from lora import LoRAConfig, split_model

    n = NUM_AGENTS[args.game]
    env = envs_jax.make(args.game, max_steps=args.steps)
    lib = options.get_library(args.game, env)
    guards = []
    if args.interface == "menu":
        t0 = time.perf_counter()
        bi = burnin.run_burnin(
            lib, env, args.burnin_episodes, args.burnin_episodes, seed=args.seed, chunk=100, num_steps=args.steps
        )
        guards = burnin.synthesize(lib, bi.codes)
        print(f"burn-in: {bi.decisions} decisions, {len(guards)} guards ({time.perf_counter() - t0:.1f} s)")
    compiled_guards = G.compile_guards(guards, lib.vocab)
    spec = None if args.model == "default" else args.model
    lcfg = LoRAConfig.for_rank(n, 32 if n == 7 else 16)
    model, tok = rollout.load_policy_model(spec, lcfg, seed=args.seed)
    pcfg = rollout.PolicyConfig(
        mode=args.mode, temperature=args.temperature, max_new_tokens=args.max_new_tokens, interface=args.interface
    )
    chunks = cr.ChunkConfig.for_backend(rows=args.rollouts * n, mode=args.mode)
    if args.rows or args.length_step or args.pad_rows:
        chunks = cr.ChunkConfig(
            row_sizes=tuple(int(x) for x in args.rows.split(",")) if args.rows else chunks.row_sizes,
            pad_rows=args.pad_rows or chunks.pad_rows,
            length_step=args.length_step or chunks.length_step,
        )
    roller = cr.CompiledRoller(
        args.game, env, lib, compiled_guards, model, tok, pcfg, menu_seed=args.seed, batch=args.rollouts, chunks=chunks
    )
    seeds = list(range(1000, 1000 + args.rollouts))
    key = jax.random.PRNGKey(args.seed)
    _, adapters, base = split_model(model)
    device = jax.devices()[0]
    print(
        f"bench rollout: {args.game} interface={args.interface} mode={args.mode} model={args.model} "
        f"K={args.rollouts} T={args.steps} "
        f"device={device.platform}:{device.device_kind} chunks={chunks} prompt limit {roller.prompt.max_len}"
    )

    # 1. Compiled rollout: warm-up (compile) then the median of the timed calls.
    t0 = time.perf_counter()
    jax.block_until_ready(roller.run(adapters, base, seeds, key))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(roller.run(adapters, base, seeds, key))
        times.append(time.perf_counter() - t0)
    compiled_s = float(np.median(times))
    res = roller._result([jax.device_get(out)], [args.rollouts], [out], seeds, 0, False, compiled_s)
    decisions, waves = res.num_decisions, res.waves
    print(
        f"compiled: {decisions} decisions in {waves} waves, {compiled_s:.3f} s (median of {args.repeats}; "
        f"first call {compile_s:.1f} s with compile) -> {decisions / compiled_s:.1f} decisions/s, "
        f"{1e3 * compiled_s / max(waves, 1):.2f} ms/wave; the LLM ran for {res.model_rows}; returns "
        f"{res.returns.tolist()}"
    )
    parse = parse_summary(res.parse) if args.mode == "sample" else None
    if parse is not None and res.parse.total:
        fail = parse["failure"]
        print(
            f"parse: {res.parse.as_dict()}; failure rate {fail['rate']:.3f} (95% CI {fail['ci'][0]:.3f}-{fail['ci'][1]:.3f})"
        )
    if args.traces:
        from jaxopt_marl.trainer import _write_jsonl

        Path(args.traces).mkdir(parents=True, exist_ok=True)
        _write_jsonl(Path(args.traces) / f"bench_{args.game}_{args.interface}_{args.mode}.jsonl", res.traces)

    upd = time_update(roller, res, args.repeats) if args.update else None

    # 2. Bare forward over the same prompts, padded as the host loop pads them.
    policy = rollout.LLMPolicy(model, tok, args.game, pcfg)
    batches = bare_forward_batches(roller, res, policy)
    letter_ids = jnp.asarray(policy.letter_ids)

    def bare():
        last = None
        for ids, mask, rows, _ in batches:
            cache = policy._prefix_cache(rows, ids.shape[1])
            last = rollout._letter_logits(
                policy.graphdef, policy.state, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(rows), cache, letter_ids
            )
            jax.block_until_ready(last)
        return last

    bare()  # compile every shape
    bt = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        bare()
        bt.append(time.perf_counter() - t0)
    bare_s = float(np.median(bt))
    print(f"bare forward: {len(batches)} batches, {bare_s:.3f} s -> {decisions / bare_s:.1f} decisions/s")

    # 3. The host loop.
    host_s = host_dec = host_cold_s = None
    if not args.no_host:
        hsteps = args.host_steps or args.steps
        henv = envs_jax.make(args.game, max_steps=hsteps)
        hlib = options.get_library(args.game, henv)
        host = rollout.Roller(args.game, henv, hlib, G.compile_guards(guards, hlib.vocab), policy, menu_seed=args.seed)
        t0 = time.perf_counter()
        cold = host.collect(seeds, key)  # warm-up: compiles a program per (rows, columns) bucket it meets
        host_cold_s = time.perf_counter() - t0
        print(
            f"host loop, first call (compiles included): {cold.num_decisions} decisions in {host_cold_s:.1f} s "
            f"({1e3 * host_cold_s / max(cold.waves, 1):.0f} ms/wave)"
        )
        t0 = time.perf_counter()
        hres = host.collect(seeds, key)
        host_s = time.perf_counter() - t0
        host_dec = hres.num_decisions
        print(
            f"host loop: {host_dec} decisions in {host_s:.2f} s (T={hsteps}) -> {host_dec / host_s:.2f} "
            f"decisions/s; of which LLM {hres.llm_seconds:.2f} s"
        )

    result = {
        "game": args.game,
        "interface": args.interface,
        "mode": args.mode,
        "model": args.model,
        "rollouts": args.rollouts,
        "steps": args.steps,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens if args.mode == "sample" else None,
        "decisions": decisions,
        "waves": waves,
        "compiled_s": compiled_s,
        "compile_s": compile_s,
        "compiled_decisions_per_s": decisions / compiled_s,
        "ms_per_wave": 1e3 * compiled_s / max(waves, 1),
        "bare_forward_s": bare_s,
        "bare_forward_decisions_per_s": decisions / bare_s,
        "compiled_vs_bare": bare_s / compiled_s,
        "host_steps": args.host_steps or args.steps if host_s is not None else None,
        "host_s": host_s,
        "host_first_call_s": host_cold_s,
        "host_decisions": host_dec,
        "host_decisions_per_s": (host_dec / host_s) if host_s else None,
        "compiled_vs_host": ((decisions / compiled_s) / (host_dec / host_s)) if host_s else None,
        "model_rows": res.model_rows,
        "update": upd,
        "parse_mismatch": res.parse_mismatch,
        "parse": parse,
        "prompt_limit": roller.prompt.max_len,
        "chunks": {"row_sizes": list(chunks.row_sizes), "pad_rows": chunks.pad_rows, "length_step": chunks.length_step},
        "device": f"{device.platform}:{device.device_kind}",
        "jax": jax.__version__,
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
    }
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "compiled_decisions_per_s",
                    "host_decisions_per_s",
                    "bare_forward_decisions_per_s",
                    "compiled_vs_host",
                    "compiled_vs_bare",
                    "ms_per_wave",
                )
            },
            indent=1,
        )
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
