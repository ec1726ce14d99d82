"""``python -m experiments.seeds --game G --seeds N``: N independent training runs, one per seed (paper §6.1, Table 1).

"Table 1 reports mean ± std over five independent training seeds, and each seed also draws one of several option
libraries." Seed ``s`` (``--seed`` s0 .. s0 + N - 1, default 0 .. N - 1) is a normal end-to-end run
(:func:`jaxopt_marl.pipeline.run`: burn-in -> guards -> PA-MAGRPO -> evaluation -> report) into
``OUT/seed_<s>/``, with every one of its four random channels (interface: library draw and letter shuffles; LoRA
initialisation; rollout stochasticity; minibatch order) derived from ``s`` (:mod:`jaxopt_marl.seeding`) and
``--library auto`` (the default) drawing its option library with the interface channel. The other flags are the
training entry points' (:mod:`experiments.common`: ``--preset``, ``--model``, ``--rounds``, ``--eval-episodes``,
...), passed to every seed's run.

Then ``OUT/seeds.json`` and ``OUT/seeds.md`` (:func:`summarize`) over every seed of the experiment in OUT: this
call's and each earlier call's finished ``seed_<s>/`` whose ``config.json`` equals this call's but for the seed
and the library drawn (:func:`covered`; the summary names the seeds it covers, which were this call's, and the
``seed_<s>`` entries it leaves out). Per seed the library drawn, the evaluated
adapters (``best`` or ``final``, and the round), the trained adapters' mean ± sample std of the evaluation team
return with its 95% percentile bootstrap CI (from the run's ``eval.json``, :mod:`jaxopt_marl.stats`) and the
frozen base's; across seeds the Table 1 figure, mean ± sample std (ddof 1) of the per-seed trained means (and
of the base's), with a bootstrap CI over the seeds (:func:`jaxopt_marl.stats.summarize` of the per-seed means).
Units: the game's team return (apples eaten, soups delivered).

``--resume``: a seed whose run finished (``report.md`` written) with the same settings is skipped; a cut one is
resumed cell by cell (:func:`jaxopt_marl.pipeline.run` with ``resume``: from its last checkpoint, or its burn-in);
one never started is started. Without ``--resume`` (or ``--force``) an existing ``OUT/seed_<s>/`` is refused
before any compute. ``--out`` defaults to ``runs/<game>-<preset>-seeds``.

``--distributed`` (the flags and variables of :mod:`jaxopt_marl.distributed`, issue #17): the N seeds split over
the P processes, process p runs seeds ``[p N/P, (p+1) N/P)`` (independent runs: no cross-process collectives;
JAX is not joined into one distributed runtime, so each process computes on its own devices and its checkpoints
stay its own), deletes its ``OUT/processes/p<p>.json`` before it starts and writes it when its share is done (or failed), and
process 0 waits for every process's file of this launch (a barrier on the shared ``OUT``, which must be one file
system for all processes, up to :data:`jaxopt_marl.distributed.LONG_WAIT` seconds; a file left by an earlier
launch does not count: :func:`experiments.split.barrier`) before it writes the summary, then deletes the files. An N that does not divide over
P is refused before any compute, naming both (the coordinator address is accepted but not used).

Bad input (unknown game, preset or library, ``--seeds`` < 1, an existing seed directory without ``--resume``, an
``OUT/seed_<s>`` that is a file, a ``--distributed-timeout`` that is not a number of seconds >= 1,
any check of :mod:`experiments.common` / :func:`jaxopt_marl.pipeline.run`) is one line ``error: ...`` and exit
status 2 (:mod:`experiments.cli`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from experiments import split
from experiments.cli import InputError, positive, run_cli
from experiments.common import build_parser, config_from_args, default_preset
from jaxopt_marl.config import GAMES, PRESETS, RunConfig

#: Files of the summary.
SUMMARY_JSON, SUMMARY_MD = "seeds.json", "seeds.md"


def seed_dir(out: Path, seed: int) -> Path:
    """``OUT/seed_<seed>``: the run directory of one seed."""
    return Path(out) / f"seed_{seed}"


def build_seeds_parser(prog: str = "python -m experiments.seeds") -> argparse.ArgumentParser:
    """:func:`experiments.common.build_parser`'s flags (``--seed`` is the first seed) plus ``--game`` and
    ``--seeds``."""
    ap = build_parser(prog)
    from jaxopt_marl.distributed import DEFAULT_TIMEOUT

    helps = {
        "--seed": "first seed: the runs are seeds SEED .. SEED + N - 1 (default 0)",
        "--out": "experiment directory, one seed_<s>/ run per seed and the summary seeds.json / seeds.md "
        "(default runs/<game>-<preset>-seeds)",
        "--resume": "per seed folder: skip a seed_<s>/ whose run finished with these settings, continue a cut one "
        "from its last checkpoint (only --rounds and the evaluation flags may differ), start a missing one",
        "--force": "delete and restart every existing seed_<s>/ of this call's seeds (after every check)",
        "--distributed": "split the seeds over P processes (each runs N/P whole seeds on its own devices; no "
        "jax.distributed runtime is joined): process 0 waits for every process's completion file in "
        "OUT/processes/ and writes the summary; needs --num-processes and --process-id (or their variables)",
        "--coordinator": "accepted for the shared flags, optional, not used (no coordinator: the processes meet "
        "through OUT/processes/)",
        "--num-processes": "processes the seeds split over (implies --distributed); must divide --seeds",
        "--process-id": "this process, 0..P-1: it runs the P-th share of the seeds (implies --distributed)",
        "--distributed-timeout": "seconds within which the processes of one launch start (a completion file of a "
        f"process started earlier than that before process 0 is an earlier launch's; default {DEFAULT_TIMEOUT})",
    }
    for flag, text in helps.items():
        ap._option_string_actions[flag].help = text
    ap.description = "N independent end-to-end runs, one per seed, and their Table 1 summary (paper §6.1)"
    ap.add_argument("--game", required=True, help=f"game: {', '.join(GAMES)}")
    ap.add_argument("--seeds", type=int, default=5, help="number of training seeds (paper Table 1: 5; default 5)")
    return ap


def share(seeds: list[int], num_processes: int, process_id: int) -> list[int]:
    """Process ``process_id``'s contiguous share of ``seeds`` (:func:`experiments.split.share`).

    Raises:
        ValueError: ``len(seeds)`` does not divide over ``num_processes`` (both named).
    """
    return split.share(seeds, num_processes, process_id, what="--seeds")


def finished(run_dir: Path, cfg: RunConfig) -> bool:
    """Whether ``run_dir`` holds a finished run (``report.md`` and ``eval.json`` written) of exactly ``cfg``
    (every ``config.json`` key equal, the evaluation ones too: a changed evaluation flag re-evaluates)."""
    if not ((run_dir / "report.md").exists() and (run_dir / "eval.json").exists()):
        return False
    try:
        old = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    new = json.loads(json.dumps(cfg.flat_dict()))
    return all(old.get(k) == v for k, v in new.items())


def plan(out: Path, cfgs: dict[int, RunConfig], resume: bool, force: bool) -> dict[int, str]:
    """``{seed: "skip" | "resume" | "start" | "force"}`` for this process's seeds, checked before any compute
    (:func:`plan_runs` of ``OUT/seed_<s>``).

    Raises:
        InputError: without ``resume`` / ``force``, a seed's directory exists; ``OUT/seed_<s>`` is a file, with
            or without them (each named).
    """
    return plan_runs({s: (f"seed {s}", seed_dir(out, s), cfg) for s, cfg in cfgs.items()}, resume, force, "seed")


def plan_runs(runs: dict, resume: bool, force: bool, kind: str) -> dict:
    """``{key: "skip" | "resume" | "start" | "force"}`` for independent runs ``{key: (label, run_dir, cfg)}`` of
    one experiment (``kind``: what one run is, ``seed`` or ``cell``), checked before any compute.

    With ``resume``: ``skip`` a run :func:`finished` with exactly ``cfg``; ``resume`` a started one (its
    ``config.json`` checked against ``cfg`` now, :func:`jaxopt_marl.preflight.prepare_run_dir`: a differing key
    other than :data:`jaxopt_marl.config.RESUME_MAY_DIFFER` is refused, every one named with both values);
    ``start`` (``force`` over a non-empty directory cut before its ``config.json``) one never started.
    Without: ``start``, or ``force`` over an existing directory when ``force``.

    Raises:
        InputError: without ``resume`` / ``force``, a run's directory exists; a run directory is a file, with or
            without them; on ``resume``, a started run of other settings (each named by its label).
    """
    out_plan = {}
    for key, (label, d, cfg) in runs.items():
        if d.exists() and not d.is_dir():
            raise InputError(f"{label}: {d} exists and is not a directory (the {kind}'s run directory)")
        exists = d.exists() and any(d.iterdir())
        if resume:
            if finished(d, cfg):
                out_plan[key] = "skip"
            elif exists and (d / "config.json").exists():
                from jaxopt_marl import preflight

                preflight.prepare_run_dir(cfg, d, True, False)  # other flags than the run's: refused now
                out_plan[key] = "resume"
            else:  # never started, or cut before its config.json: start afresh
                out_plan[key] = "force" if exists else "start"
        elif exists and not force:
            raise InputError(
                f"{label}: run directory {d} exists; pass --resume to skip finished {kind}s and continue cut ones, "
                f"or --force to start every {kind} afresh"
            )
        else:
            out_plan[key] = "force" if exists else "start"
    return out_plan


#: ``config.json`` keys that differ between the seeds of one experiment (the rest must be equal to be summarized).
PER_SEED_KEYS = ("seed", "library")


def _launch_view(flat: dict) -> dict:
    return {k: v for k, v in json.loads(json.dumps(flat)).items() if k not in PER_SEED_KEYS}


def covered(out: Path, cfg: RunConfig, seeds: list[int]) -> tuple[list[int], list[str]]:
    """The seeds the summary covers and the seed directories it leaves out.

    Covered: ``seeds`` (this call's) and every other ``OUT/seed_<s>/`` holding a finished run (``report.md`` and
    ``eval.json``) whose ``config.json`` equals ``cfg``'s in every key but :data:`PER_SEED_KEYS` (the seed and
    the library it drew): an earlier call's seeds of the same experiment. Left out (named, not summarized): the
    other ``seed_<s>`` entries (unfinished, or of other settings)."""
    want = _launch_view(cfg.flat_dict())
    extra, left_out = [], []
    for d in sorted(Path(out).glob("seed_*")):
        tail = d.name[len("seed_") :]
        if not tail.isdigit() or int(tail) in seeds or d.name != f"seed_{int(tail)}":
            continue
        ok = d.is_dir() and (d / "report.md").exists() and (d / "eval.json").exists()
        try:
            old = json.loads((d / "config.json").read_text()) if ok else None
        except (OSError, ValueError):
            old = None
        if isinstance(old, dict) and old.get("seed") == int(tail) and {k: old.get(k) for k in want} == want:
            extra.append(int(tail))
        else:
            left_out.append(d.name)
    return sorted(set(seeds) | set(extra)), left_out


def _ci(ci) -> str:
    return "—" if ci is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def _pm(s: dict | None) -> str:
    if s is None or s.get("mean") is None:
        return "—"
    return f"{s['mean']:.2f} ± {s['std']:.2f}" if s.get("std") is not None else f"{s['mean']:.2f}"


def summarize(out: Path, seeds: list[int], this_call: list[int] | None = None, left_out: list[str] = ()) -> dict:
    """``OUT/seeds.json`` and ``OUT/seeds.md`` from the seeds' ``config.json`` and ``eval.json``; returns the
    JSON object.

    ``runs[i]``: ``seed``, ``dir``, ``library``, ``eval_checkpoint``, ``checkpoint_round``, ``trained`` and
    ``base`` (``{"n", "values", "mean", "std", "ci"}`` of the per-episode team return: eval.json's
    ``stats.trained`` / ``stats.base``; base None when not evaluated). ``across_seeds``: ``trained`` and ``base``
    as :func:`jaxopt_marl.stats.summarize` of the per-seed means (``mean`` the Table 1 mean, ``std`` the sample
    std over seeds, ``ci`` the bootstrap CI over seeds), and ``libraries`` ``{name: seeds that drew it}``.
    ``seeds``: the seeds covered (:func:`covered`: this call's, ``seeds_this_call``, and the earlier calls'
    finished seeds of the same settings, ``seeds_earlier``); ``left_out``: the ``seed_<s>`` entries of OUT not
    summarized (unfinished or other settings). seeds.md says the same.

    Raises:
        InputError: a seed's ``eval.json`` or ``config.json`` is missing or unreadable (named).
    """
    from jaxopt_marl import artifacts, stats

    runs, cfg0 = [], None
    for s in seeds:
        d = seed_dir(out, s)
        try:
            cfg = json.loads((d / "config.json").read_text())
            ev = artifacts.EvalRecord.load(d / "eval.json")
        except (OSError, ValueError, artifacts.ArtifactError) as e:
            raise InputError(f"seed {s}: {d} has no readable config.json / eval.json ({e})") from None
        cfg0 = cfg0 or cfg
        st = ev.stats or stats.eval_stats(ev.trained.team_returns, ev.base.team_returns if ev.base else None)
        strip = lambda b: None if b is None else {k: b[k] for k in ("n", "values", "mean", "std", "ci")}
        runs.append(
            {
                "seed": s,
                "dir": d.name,
                "library": cfg.get("library", "canonical"),
                "eval_checkpoint": ev.eval_checkpoint,
                "checkpoint_round": ev.checkpoint_round,
                "trained": strip(st["trained"]),
                "base": strip(st.get("base")),
            }
        )
    across = {
        "trained": stats.summarize([r["trained"]["mean"] for r in runs], "per-seed trained means"),
        "base": (
            stats.summarize([r["base"]["mean"] for r in runs], "per-seed base means")
            if all(r["base"] is not None for r in runs)
            else None
        ),
    }
    libs: dict[str, list[int]] = {}
    for r in runs:
        libs.setdefault(r["library"], []).append(r["seed"])
    from jaxopt_marl.games import info

    game = cfg0["game"]
    summary = {
        "game": game,
        "preset": cfg0.get("preset"),
        "model": cfg0.get("model"),
        # Ours, not the paper (jaxopt_marl.format_warmup): each seed's "base" is then its own warmed-up base.
        "format_warmup": cfg0.get("format_warmup", 0),
        "units": info(game).return_unit,
        "seeds": list(seeds),
        "seeds_this_call": list(seeds if this_call is None else this_call),
        "seeds_earlier": [s for s in seeds if this_call is not None and s not in this_call],
        "left_out": list(left_out),
        "source": "paper §6.1 / Table 1: mean ± sample std over independent training seeds of the evaluated "
        "team return; per seed, the 95% percentile bootstrap CI over its evaluation episodes",
        "runs": runs,
        "across_seeds": {**across, "libraries": libs},
    }
    (out / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n")
    lines = [
        f"# {game}: {len(seeds)} training seeds (paper §6.1, Table 1)",
        "",
        f"Preset `{summary['preset']}`, model `{summary['model'] or 'SmolLM2-135M-Instruct'}`; team return in "
        f"{summary['units']}; each seed's mean ± std and 95% bootstrap CI over its evaluation episodes.",
        "",
        *(
            [
                f"> **Format warm-up (not the paper).** Each seed's run merged {summary['format_warmup']} supervised "
                'steps into its base before round 0: every "base" below is that seed\'s warmed-up base.',
                "",
            ]
            if summary["format_warmup"]
            else []
        ),
        f"Seeds covered: {', '.join(map(str, seeds))}"
        + (
            f" (this call: {', '.join(map(str, summary['seeds_this_call']))}; earlier calls: "
            f"{', '.join(map(str, summary['seeds_earlier']))})"
            if summary["seeds_earlier"]
            else ""
        )
        + "."
        + (
            f" Not summarized (unfinished or other settings): {', '.join(summary['left_out'])}."
            if summary["left_out"]
            else ""
        ),
        "",
        "| seed | library | adapters | trained mean ± std | trained 95% CI | base mean ± std | base 95% CI |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        b = r["base"]
        lines.append(
            f"| {r['seed']} | {r['library']} | {r['eval_checkpoint']} (round {r['checkpoint_round']}) | "
            f"{_pm(r['trained'])} | {_ci(r['trained']['ci'])} | {_pm(b)} | {_ci(b['ci'] if b else None)} |"
        )
    t, b = across["trained"], across["base"]
    lines += [
        "",
        f"**Across seeds (Table 1):** trained {_pm(t)} (bootstrap CI over seeds {_ci(t['ci'])})"
        + (f"; frozen base {_pm(b)} ({_ci(b['ci'])})" if b else "")
        + f", mean ± sample std of the {len(runs)} per-seed means.",
        "",
        "Libraries drawn: " + ", ".join(f"{k} (seeds {', '.join(map(str, v))})" for k, v in libs.items()) + ".",
        "",
    ]
    (out / SUMMARY_MD).write_text("\n".join(lines))
    return summary


def launch_fingerprint(seeds: list[int], num_processes: int, cfg: RunConfig) -> str:
    """The hash every process of one launch computes alike (:func:`experiments.split.fingerprint`): the seed list,
    the process count and the run configuration without its per-seed fields (:data:`PER_SEED_KEYS`); a completion
    file of other settings is not this launch's."""
    return split.fingerprint(seeds, num_processes, _launch_view(cfg.flat_dict()))


def main(argv: list[str] | None = None) -> Path:
    """Parse, check every seed's configuration and directory, run this process's seeds, summarize; returns OUT."""
    ap = build_seeds_parser()
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if args.game not in GAMES:
        raise InputError(f"unknown game {args.game!r}; valid games: {', '.join(GAMES)}")
    if args.preset is not None and args.preset not in PRESETS:
        raise InputError(f"unknown preset {args.preset!r}; valid presets: {', '.join(PRESETS)}")
    positive("--seeds", args.seeds)
    if args.resume and args.force:
        raise InputError("--resume and --force exclude each other")
    num, pid, settings = split.settings_of(args, "experiments.seeds", "seeds")  # checked before JAX starts
    seeds = list(range(args.seed, args.seed + args.seeds))
    try:
        mine = share(seeds, num, pid)
    except ValueError as e:
        raise InputError(f"--distributed: {e}") from None
    preset = args.preset or default_preset()
    out = Path(args.out or f"runs/{args.game}-{preset}-seeds")
    cfgs = {}
    for s in mine:
        args.seed = s
        cfgs[s] = config_from_args(args.game, args, run_dir=seed_dir(out, s))  # --resume: keeps the drawn library
    fingerprint = launch_fingerprint(seeds, num, cfgs[mine[0]])
    with split.marked(out, num, pid, mine, fingerprint) as started:
        todo = plan(out, cfgs, args.resume, args.force)  # a refusal is this process's failure, marked
        print(
            f"experiments.seeds {args.game}: seeds {seeds[0]}..{seeds[-1]} -> {out}"
            + (f" (process {pid} of {num}: seeds {mine})" if num > 1 else "")
        )
        runs = {s: (f"seed {s} ({cfgs[s].library} library)", seed_dir(out, s), cfgs[s]) for s in mine}
        split.run_each(runs, todo, args.keep_checkpoints)
    if pid != 0:
        return out
    split.gather(out, num, fingerprint, started, settings, tool="experiments.seeds", what="seeds")
    every, left_out = covered(out, cfgs[mine[0]], seeds)
    s = summarize(out, every, seeds, left_out)
    t = s["across_seeds"]["trained"]
    print(
        f"across {len(every)} seeds ({', '.join(map(str, every))}): trained {_pm(t)} {s['units']}"
        + (f"; frozen base {_pm(s['across_seeds']['base'])}" if s["across_seeds"]["base"] else "")
    )
    print(f"wrote {out / SUMMARY_JSON}\nwrote {out / SUMMARY_MD}")
    return out


def cli(argv: list[str] | None = None) -> Path:
    """:func:`main` under :func:`experiments.cli.run_cli` (bad input: one line ``error: ...``, exit 2)."""
    return run_cli(main, argv)


__all__ = [
    "build_seeds_parser",
    "cli",
    "covered",
    "finished",
    "main",
    "plan",
    "plan_runs",
    "seed_dir",
    "share",
    "summarize",
]

if __name__ == "__main__":
    cli()
