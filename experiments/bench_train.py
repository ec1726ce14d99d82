"""``python -m experiments.bench train``: PA-MAGRPO update throughput and MFU of a frozen base + LoRA.

Builds a decoder with random weights in the shape of a named model (weights do not change the
arithmetic; no checkpoint is needed), attaches N stacked per-agent LoRA adapters, and times the
jitted PA-MAGRPO update (``jaxopt_marl.train_step``: forward and backward of the whole packed
prompt+response batch, one optimizer step per call) after a warm-up call. Timed in the same run, as
the baseline: the plain forward pass over the same batch (``TrainStep.score``).

FLOP accounting (per token, ``ModelConfig.flops_per_token`` = 2 x multiply-adds of the forward,
attention included, vocabulary head only on the response columns):

* executed: forward F + backward through activations F + (LoRA weight gradients, negligible); the
  frozen base has no weight gradients, so the update executes about 2F per token (the "4N" rule);
* conventional MFU ("6N" rule, as in PaLM's MFU): 3F per token, as if the base were trained too.
  Both are printed; the issue's 40% target is read on the executed count.

Peak: the device's dense bf16 (or fp32) peak from public spec sheets (H100/H200 SXM: 989 TFLOP/s
bf16), or ``--peak-tflops``.

``--shared-prefix P``: the first P prompt tokens of every row are the same (the rendered system turn of
the real prompts), and the same process also times the round (``prepare`` + ``update``) with that prefix
stripped into ``DecisionBatch.prefix`` -- run once per adapter and differentiated through ``jax.vjp``
(:mod:`jaxopt_marl.train_step`) -- and prints the speed-up over the whole-row round.

``--processes P [P ...]`` (issue #17): the same global batch, its update over the global mesh of P local
processes joined by ``jax.distributed`` on 127.0.0.1 (gloo CPU collectives, ``--devices-per-process D`` virtual
CPU devices each, default 2). The parent times, each in children of its own and in this order: the baseline (one
process of D devices), then for each P > 1 one process of P x D devices (the same mesh without the process
boundary) and P processes of D devices; it prints one row per run with ``ratio`` = baseline update time / this
one, ``scaling_efficiency`` = baseline / (P x this one) (1.0: P processes bring P times the throughput) and
``vs_one_process`` = (one process of P x D devices) / (P processes): the cost of the processes and gloo alone. On
one CPU the virtual devices share its cores, so the efficiency is bounded by cores / (P x D), not by the run.

Example (the CPU figure in BENCHMARKS.md, prompt shape of the Cleanup runs: 110-token system turn, ~245
more): ``python -m experiments.bench train --shape smollm2_135m --dtype float32 --decisions 32
--prompt-len 352 --response-len 1 --shared-prefix 110 --micro-batch 8 --repeats 1``.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxopt_marl import magrpo, train_step
from lora import Decoder, LoRAConfig, ModelConfig, split_model

SHAPES = {
    # Qwen3-4B(-Instruct-2507) config.json: 36 layers, d 2560, 32 q / 8 kv heads of 128, MLP 9728.
    "qwen3_4b": dict(
        architecture="qwen3",
        vocab_size=151936,
        hidden_size=2560,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=9728,
        rope_theta=5e6,
        rms_norm_eps=1e-6,
        tie_embeddings=True,
        qk_norm=True,
    ),
    "smollm2_135m": dict(ModelConfig.smollm2_135m().__dict__),
    "tiny": dict(ModelConfig.tiny().__dict__),
}
PEAK_TFLOPS = {"H100": (989.0, 67.0), "H200": (989.0, 67.0), "A100": (312.0, 19.5)}


def _peak(dtype: str, override: float | None) -> float | None:
    if override:
        return override * 1e12
    kind = jax.devices()[0].device_kind
    for name, (bf16, fp32) in PEAK_TFLOPS.items():
        if name in kind:
            return (bf16 if dtype == "bfloat16" else fp32) * 1e12
    return None


def main(argv: list[str] | None = None) -> None:
    from experiments.cli import ArgParser, positive

    p = ArgParser(prog="python -m experiments.bench train", description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3_4b")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--decisions", type=int, default=32, help="decisions (rows) per update")
    p.add_argument("--prompt-len", type=int, default=480)
    p.add_argument("--response-len", type=int, default=32)
    p.add_argument("--agents", type=int, default=7)
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        help="P: the first P prompt tokens are shared; also time the prefix-cached round",
    )
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--out", default=None)
    p.add_argument(
        "--processes",
        type=int,
        nargs="+",
        default=[1],
        help="local jax.distributed process counts to time (same global batch; e.g. 1 2 4)",
    )
    p.add_argument(
        "--devices-per-process", type=int, default=2, help="virtual CPU devices of each process (--processes)"
    )
    p.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for n in a.processes:
        positive("--processes", n)
    positive("--devices-per-process", a.devices_per_process)
    if a.process_id is None and (len(a.processes) > 1 or a.processes[0] > 1):
        for n in a.processes:  # before any child starts
            if a.decisions % (n * a.devices_per_process):
                p.error(
                    f"--decisions {a.decisions} rows do not split over {n} processes x {a.devices_per_process} "
                    f"devices: give a multiple of {n * a.devices_per_process}"
                )
        return _launch(a, list(argv or []))
    a.processes = a.processes[0]
    ctx = None
    if a.process_id is not None:
        from jaxopt_marl import distributed

        ctx = distributed.initialize(f"127.0.0.1:{a.port}", a.processes, a.process_id, timeout=120)
    for flag in ("decisions", "prompt_len", "response_len", "agents", "rank", "repeats"):
        positive(f"--{flag.replace('_', '-')}", getattr(a, flag))
    positive("--micro-batch", a.micro_batch, minimum=0)
    if not 0 <= a.shared_prefix < a.prompt_len:  # before the model is built
        p.error(f"--shared-prefix must be in [0, prompt-len), got {a.shared_prefix}")

    cfg = ModelConfig(**SHAPES[a.shape])
    dtype = jnp.bfloat16 if a.dtype == "bfloat16" else jnp.float32
    t0 = time.perf_counter()
    model = Decoder(cfg, LoRAConfig.for_rank(a.agents, a.rank), dtype=dtype, rngs=nnx.Rngs(0))
    graphdef, adapters, base = split_model(model)
    del model
    init_s = time.perf_counter() - t0
    mesh = train_step.make_mesh() if ctx is None else ctx.mesh
    conf = magrpo.MAGRPOConfig(epochs=1, num_minibatches=1, micro_batch=a.micro_batch, learning_rate=1e-5)
    ts = train_step.make_train_step(graphdef, conf, mesh, num_adapters=a.agents)
    if ctx is None:
        base = train_step.replicate(base, mesh)
        adapters = train_step.replicate(adapters, mesh)
        opt = train_step.init_opt_state(ts, adapters)
    else:
        opt = ctx.replicate(ts.optimizer.init(adapters))
        base, adapters = ctx.replicate(base), ctx.replicate(adapters)
    # The whole batch on every device set: one process's rows, or rows split over every process's devices.
    place = (lambda b: train_step.shard_batch(b, mesh)) if ctx is None else ctx.shard_rows

    rng = np.random.default_rng(0)
    d, tp, tr = a.decisions, a.prompt_len, a.response_len
    shared = rng.integers(1, cfg.vocab_size, a.shared_prefix).tolist()
    prompts = [shared + rng.integers(1, cfg.vocab_size, tp - a.shared_prefix).tolist() for _ in range(d)]
    responses = [rng.integers(1, cfg.vocab_size, tr).tolist() for _ in range(d)]
    batch = train_step.pack_decisions(
        prompts,
        responses,
        np.arange(d) % a.agents,
        rng.standard_normal(d).astype(np.float32),
        prompt_len=tp,
        response_len=tr,
    )
    advantages = np.asarray(batch.advantages)
    batch = place(batch)

    def timed(fn, *args):
        out = jax.block_until_ready(fn(*args))  # compile + warm-up
        ts_ = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            out = jax.block_until_ready(fn(*args))
            ts_.append(time.perf_counter() - t)
        return out, float(np.median(ts_))

    t = time.perf_counter()
    batch = ts.prepare(base, adapters, batch)
    jax.block_until_ready(batch.logp_ref)  # one minibatch: prepare scores the reference only
    first_prepare_s = time.perf_counter() - t
    ids = place(np.asarray(ts.adapter_ids(np.arange(d) % a.agents)))
    _, fwd_s = timed(ts.score, base, adapters, batch, ids)
    key = jax.random.PRNGKey(0) if ctx is None else ctx.replicate(jax.random.PRNGKey(0))
    t = time.perf_counter()
    jax.block_until_ready(ts.update(base, adapters, opt, batch, key))
    first_update_s = time.perf_counter() - t
    _, upd_s = timed(ts.update, base, adapters, opt, batch, key)

    tokens = d * (tp + tr)
    body = cfg.flops_per_token(context=(tp + tr) // 2, head=False) * tokens
    head = 2 * cfg.hidden_size * cfg.vocab_size * d * tr
    fwd_flops = body + head
    peak = _peak(a.dtype, a.peak_tflops)
    res = {
        "device": jax.devices()[0].device_kind,
        "backend": jax.default_backend(),
        "shape": a.shape,
        "dtype": a.dtype,
        "decisions": d,
        "prompt_len": tp,
        "response_len": tr,
        "agents": a.agents,
        "rank": a.rank,
        "tokens": tokens,
        "init_s": init_s,
        "first_prepare_s": first_prepare_s,
        "first_update_s": first_update_s,
        "forward_s": fwd_s,
        "update_s": upd_s,
        "forward_tflops": fwd_flops / fwd_s / 1e12,
        "update_executed_tflops": 2 * fwd_flops / upd_s / 1e12,
        "update_6n_tflops": 3 * fwd_flops / upd_s / 1e12,
        "tokens_per_s_update": tokens / upd_s,
        "processes": a.processes,
        "devices": len(jax.devices()),
    }
    if a.shared_prefix:
        cut = train_step.pack_decisions(
            prompts,
            responses,
            np.arange(d) % a.agents,
            advantages,
            prompt_len=tp - a.shared_prefix,
            response_len=tr,
            prefix=shared,
        )
        cut = place(cut)

        def round_of(b):
            b = ts.prepare(base, adapters, b)
            return ts.update(base, adapters, opt, b, key)

        _, whole_round_s = timed(round_of, batch)
        _, prefix_round_s = timed(round_of, cut)
        res |= {
            "shared_prefix": a.shared_prefix,
            "round_whole_rows_s": whole_round_s,
            "round_prefix_cached_s": prefix_round_s,
            "prefix_round_speedup": whole_round_s / prefix_round_s,
        }
    if peak:
        res |= {
            "peak_tflops": peak / 1e12,
            "forward_mfu": fwd_flops / fwd_s / peak,
            "update_mfu_executed": 2 * fwd_flops / upd_s / peak,
            "update_mfu_6n": 3 * fwd_flops / upd_s / peak,
        }
    if ctx is not None:
        ctx.barrier("bench-train-done")
        if not ctx.is_writer():
            return
    for k, v in res.items():
        print(f"{k:24s} {v:.4g}" if isinstance(v, float) else f"{k:24s} {v}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)


def _launch(a, argv: list[str]) -> None:
    """``--processes P ...``: the baseline (one process of D devices), then per P > 1 one process of P x D devices
    and P processes of D devices on 127.0.0.1 (each a child); prints one row per run and the figures of the module
    docstring."""
    import os
    import socket
    import subprocess
    import sys
    import tempfile

    rest, skip = [], False  # the caller's flags without --processes / --out / --devices-per-process
    for x in argv:
        if skip and x.startswith("-"):
            skip = False
        if skip:
            continue
        if x in ("--processes", "--out", "--devices-per-process"):
            skip = True
        elif not x.startswith(("--processes=", "--out=", "--devices-per-process=")):
            rest.append(x)
    d = a.devices_per_process

    def run(n: int, devices: int, tmp: str) -> dict:
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
        port = 0
        if n > 1:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        tag = f"{n}x{devices}"
        procs = []
        for i in range(n):
            cmd = [sys.executable, "-m", "experiments.bench", "train", *rest, "--processes", str(n)]
            cmd += ["--out", f"{tmp}/{tag}-{i}.json"]
            if n > 1:
                cmd += ["--process-id", str(i), "--port", str(port)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=3600)[0] for p in procs]
        if any(p.returncode for p in procs):
            for p in procs:
                if p.poll() is None:
                    p.kill()
            raise SystemExit(f"the {n}-process run failed:\n" + "\n".join(o[-2000:] for o in outs))
        with open(f"{tmp}/{tag}-0.json") as f:
            res = json.load(f)
        print(f"timed {n} process(es) x {devices} device(s): update {res['update_s']:.4g} s", flush=True)
        return res

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = run(1, d, tmp)
        rows.append(dict(processes=1, devices=d, update_s=base["update_s"]))
        for n in [n for n in dict.fromkeys(a.processes) if n > 1]:
            one = run(1, n * d, tmp)
            many = run(n, d, tmp)
            rows.append(dict(processes=1, devices=n * d, update_s=one["update_s"]))
            rows.append(dict(processes=n, devices=n * d, update_s=many["update_s"], vs_one_process=one["update_s"]))
    t0 = base["update_s"]
    for r in rows:
        r["tokens_per_s"] = base["tokens"] / r["update_s"]
        r["ratio"] = t0 / r["update_s"]
        r["scaling_efficiency"] = t0 / (r["processes"] * r["update_s"])
        if "vs_one_process" in r:
            r["vs_one_process"] = r["vs_one_process"] / r["update_s"]
    print(
        f"{base['shape']} {base['dtype']}, {base['decisions']} decisions x ({base['prompt_len']} + "
        f"{base['response_len']}) tokens, {base['agents']} agents, rank {base['rank']}, {base['device']}"
    )
    print(
        f"{'processes':>9} {'devices':>7} {'update_s':>9} {'tokens/s':>9} {'ratio':>6} {'efficiency':>10} {'vs 1 proc':>9}"
    )
    for r in rows:
        vs = f"{r['vs_one_process']:.3f}" if "vs_one_process" in r else "-"
        print(
            f"{r['processes']:>9} {r['devices']:>7} {r['update_s']:>9.4f} {r['tokens_per_s']:>9.0f} "
            f"{r['ratio']:>6.3f} {r['scaling_efficiency']:>10.3f} {vs:>9}"
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"baseline": base, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
