"""One run of ``python -m experiments.{cleanup,harvest,overcooked}``: every check, then the pipeline's steps.

burn-in (``burnin/records.parquet``, ``burnin/burnin.json``: :func:`jaxopt_marl.burnin.write_outputs`) -> guards
(``guards.jsonl``) -> the optional format warm-up (``--format-warmup``, ours, not the paper:
``format_warmup.json``, ``format_warmup/``, merged into the base: :mod:`jaxopt_marl.format_warmup`) -> PA-MAGRPO
rounds (``checkpoints/``, ``best/``, ``metrics.jsonl``, ``decisions/round_XXXX.jsonl``: :mod:`jaxopt_marl.trainer`)
-> evaluation on seeds 10000.. (paper §6.1: 20 episodes, seeds disjoint from training) with the adapters of the
paper's checkpoint rule (``eval.json``, ``eval_traj.npz``, ``decisions/eval*.jsonl``: :mod:`jaxopt_marl.evaluation`)
-> solo test (paper §6.4, ``solo.json``: :mod:`jaxopt_marl.solo_test`) -> ``episode.gif``
(:func:`jaxopt_marl.episode_gif.write_eval_gif`) -> ``report.md`` (:mod:`jaxopt_marl.report`).

``rounds = 0`` (:attr:`jaxopt_marl.config.RunConfig.frozen`; paper Table 2's frozen cells, :mod:`experiments.table2`)
trains nothing: burn-in and guards as usual (the menu the frozen base is shown is the trained runs' menu), no
trainer, no ``metrics.jsonl`` / ``checkpoints/`` / ``best/``, and the evaluation, the solo test and the GIF play the
frozen base with the adapters off (:mod:`jaxopt_marl.evaluation`); ``report.md`` opens with a note saying so. One
process only (not with ``dist``). Every other run is unchanged.

An existing run directory is never overwritten: ``resume`` continues it from its last complete checkpoint,
``force`` deletes it first -- after every check has passed (a bad input leaves it intact). ``resume`` takes the
run's original settings: a value that differs from its ``config.json`` fails, naming each key with both values,
except the keys of :data:`jaxopt_marl.config.RESUME_MAY_DIFFER` (``rounds``, to extend or cut a run, and the
evaluation-only settings, since a resumed run evaluates afresh). Bad input (a model path without weights, a
truncated or mismatched GGUF file, an unusable ``out``, only corrupt checkpoints, a checkpoint of other LoRA
settings, a corrupt ``guards.jsonl`` or differing settings on ``resume``, a prompt over its limit) fails before
any compute, and before the run directory is written or deleted, with an :class:`jaxopt_marl.errors.InputError`
naming the file or value and the cause (:mod:`jaxopt_marl.preflight`). A corrupt newest checkpoint is named
(round and file) and the run resumes from the newest intact one (``keep_checkpoints`` main checkpoints are
kept, plus ``best/``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from jaxopt_marl import artifacts, preflight
from jaxopt_marl.config import CHECKPOINT_RULE, DEFAULT_MODEL_NAME, EVAL_SEED0, RunConfig, smoke_warning
from jaxopt_marl.errors import InputError

#: What a run writes, in the order :func:`run` lists them at the end.
RUN_FILES = (
    "config.json",
    "burnin/records.parquet",
    "burnin/burnin.json",
    "guards.jsonl",
    artifacts.FORMAT_WARMUP_JSON,
    artifacts.FORMAT_WARMUP_DIR + "/",
    "metrics.jsonl",
    "checkpoints/",
    "best/",
    "decisions/",
    "eval.json",
    "solo.json",
    "eval_traj.npz",
    "episode.gif",
    "report.md",
)


#: The head of a ``rounds = 0`` run's report (paper Table 2's frozen cells; :mod:`jaxopt_marl.evaluation`).
FROZEN_NOTE = "No training (rounds = 0)"
FROZEN_DETAIL = (
    "the evaluated policy (`trained` in `eval.json` and below, labelled `frozen_base`) is the frozen base with the "
    "adapters off, on the usual evaluation seeds; there is no `metrics.jsonl` and no checkpoint."
)


def write_config(cfg: RunConfig, out: Path) -> Path:
    """``out/config.json``: :meth:`RunConfig.flat_dict` with ``reduced_budget``, ``num_agents``, ``eval_seed0``."""
    path = out / "config.json"
    d = {
        **cfg.flat_dict(),
        "reduced_budget": cfg.reduced_budget,
        "num_agents": cfg.num_agents,
        "eval_seed0": EVAL_SEED0,
    }
    path.write_text(json.dumps(d, indent=2) + "\n")
    return path


def write_report(run_dir: Path, cfg: RunConfig) -> Path:
    """``run_dir/report.md`` by :func:`jaxopt_marl.report.write_report`, headed by a reduced-budget note for any
    preset but ``paper`` if the report lacks one. An error of the report is raised, not replaced by a minimal
    report that would hide it: ``report.write_report`` lists missing or malformed inputs in the report and raises
    only when the run directory cannot be written (or on a bug), and every other file of the run is on disk by
    then (``jaxopt_marl.report.write_report(run_dir)`` writes the report again)."""
    from jaxopt_marl import report

    path = report.write_report(run_dir)
    if cfg.frozen and FROZEN_NOTE not in path.read_text():
        path.write_text(f"> **{FROZEN_NOTE}**: {FROZEN_DETAIL}\n\n" + path.read_text())
    if cfg.reduced_budget:
        text = path.read_text()
        if "Reduced budget" not in text:
            path.write_text(f"> **Reduced budget (preset `{cfg.preset}`)** — not the paper's §6.1 budget.\n\n" + text)
    return path


def _print_header(cfg: RunConfig, out: Path, resume: bool, ckpt_round: int | None) -> None:
    import jax

    mcfg = cfg.magrpo
    print(
        f"jaxopt-marl {cfg.game} | preset={cfg.preset} seed={cfg.seed} library={cfg.library} "
        f"device={jax.devices()[0]} model={cfg.model or DEFAULT_MODEL_NAME} | out={out}"
    )
    print(
        f"  {cfg.rounds} rounds x K={mcfg.num_rollouts} rollouts x {cfg.episode_steps} steps, {cfg.num_agents} "
        f"agents, scoring={cfg.mode}, T={mcfg.temperature}, LoRA r={cfg.lora.rank} (alpha {cfg.lora.alpha:g}), "
        f"lr={mcfg.learning_rate}, KL={mcfg.kl_beta}, clip={mcfg.clip_eps}, epochs={mcfg.epochs}, "
        f"min support={cfg.min_support}"
    )
    if cfg.frozen:
        print("  rounds 0: NO TRAINING; the evaluation plays the frozen base (adapters off)")
    if cfg.format_warmup:
        print(
            f"  FORMAT WARM-UP (not the paper): {cfg.format_warmup} supervised steps merged into the base before "
            f"round 0; every 'frozen base' of this run (KL reference, evaluation) is the warmed-up base"
        )
    print(
        f"  eval: {cfg.eval_episodes} episodes on seeds {EVAL_SEED0}-{EVAL_SEED0 + cfg.eval_episodes - 1}"
        f"{' + frozen base' if cfg.eval_base and not cfg.frozen else ''}, adapters: "
        f"{'none (frozen base)' if cfg.frozen else CHECKPOINT_RULE if cfg.eval_checkpoint == 'best' else 'final (last round)'}"
        + (f"; solo test on {cfg.solo_episodes} seed(s)" if cfg.solo_episodes else "; no solo test")
    )
    if cfg.reduced_budget:
        print(
            f"  NOTE: preset '{cfg.preset}' is a REDUCED BUDGET, not the paper's (§6.1); results are not "
            f"comparable to the paper's numbers."
        )
    if smoke_warning(cfg):
        print(smoke_warning(cfg), file=sys.stderr)
    if resume:
        print(f"  resuming from checkpoint round {ckpt_round}" if ckpt_round else "  resuming: no checkpoint yet")


def run(
    cfg: RunConfig,
    out: Path | None = None,
    resume: bool = False,
    force: bool = False,
    progress: bool = True,
    keep_checkpoints: int = 2,
    dist=None,
) -> Path:
    """Runs the whole pipeline into ``out`` (default ``runs/<game>-<preset>-s<seed>``); returns the run directory.

    ``keep_checkpoints``: main checkpoints kept on disk (>= 1; ``best/`` holds one more); a disk setting, not a
    hyper-parameter, so it is not part of :class:`RunConfig` / ``config.json`` and may change on ``--resume``.

    ``dist``: this process's :class:`jaxopt_marl.distributed.Context` in a multi-process run (None: alone). Every
    process makes every check; they agree on the verdict (bad input in one stops all, naming it) before process 0
    alone clears and writes the run directory (``config.json``, burn-in, ``guards.jsonl``; the others wait, then
    read ``guards.jsonl``). Each process plays its share ``K / P`` of every round's rollouts and the update runs
    over the global mesh (:class:`jaxopt_marl.trainer.Trainer`: every process saves and restores the orbax
    checkpoints, process 0 writes ``metrics.jsonl`` and ``decisions/``). Every process restores the evaluated
    adapters (``best/``: an orbax restore is collective); process 0 alone then plays the evaluation, the solo
    test, the GIF and the report while the others wait at a barrier (:meth:`~jaxopt_marl.distributed.Context.wait`):
    they are forward passes of a few episodes, whose files need every episode's trajectory in one process.

    Raises:
        InputError: bad input (module docstring), before any compute and before ``out`` is written or deleted.
    """
    if dist is None or not dist.multi:
        return _run(cfg, out, resume, force, progress, keep_checkpoints, dist, lambda: None)
    agreed = []

    def agree():
        dist.agree(None)
        agreed.append(True)

    try:
        return _run(cfg, out, resume, force, progress, keep_checkpoints, dist, agree)
    except InputError as e:
        if agreed:
            raise
        msg = str(e.code).removeprefix("error: ")
        try:
            dist.agree(msg)  # the others learn of it and stop too
        except ValueError:
            pass
        raise


def _run(cfg, out, resume, force, progress, keep_checkpoints, dist, agree) -> Path:
    """:func:`run`'s body; ``agree()`` is called once every check has passed, before the first write."""
    t_start = time.perf_counter()
    writer = dist is None or dist.is_writer()

    def wait(name: str) -> None:  # the other processes wait while process 0 writes or plays alone
        if dist is not None:
            dist.wait(name)

    out = Path(out or f"runs/{cfg.game}-{cfg.preset}-s{cfg.seed}")
    # 0. Every check that needs no compute.
    preflight.check_out_dir(out)
    if keep_checkpoints < 1:
        raise InputError(f"--keep-checkpoints must be >= 1, got {keep_checkpoints}")
    preflight.check_model(cfg.model)
    if resume:
        preflight.check_resume_guards(out)  # before check_library, which imports the games (seconds)
    preflight.check_library(cfg.game)
    preflight.check_stats()
    warned: set[str] = set()  # each corrupt-checkpoint line once (the check here, then the trainer's restore)

    def warn(msg: str) -> None:
        if msg not in warned:
            warned.add(msg)
            print(f"warning: {msg}", file=sys.stderr)

    ckpt_round = preflight.prepare_run_dir(cfg, out, resume, force, warn)

    import jax

    import envs_jax
    from jaxopt_marl import guards as G
    from jaxopt_marl import options

    # 0a. On --resume, the burn-in's guards are reused: a corrupt guards.jsonl stops here, naming its file and line
    # (before the heavier imports, the model and the header).
    env = envs_jax.make(cfg.game, max_steps=cfg.episode_steps)
    lib = options.get_library(cfg.game, env, library=cfg.library)
    bdir = out / "burnin"
    guard_path = out / "guards.jsonl"
    guards = None
    if resume and (bdir / "burnin.json").exists() and guard_path.exists():
        try:
            guards = G.load_guards(guard_path, lib.option_names, lib.vocab, reasons=lib.reasons)
        except (ValueError, OSError, UnicodeDecodeError) as e:
            raise InputError(f"--resume: {e} ({preflight.guards_hint(guard_path)})") from None

    if resume and cfg.format_warmup:  # a damaged or mismatched saved warm-up, or one slipped in under trained rounds
        from jaxopt_marl import format_warmup

        try:
            format_warmup.check_resume(cfg, out, log=lambda m: print(m, file=sys.stderr))
        except ValueError as e:
            raise InputError(f"--resume: {e}") from None

    # Compiled programs persist across runs (the 30-layer model compiles once per batch shape).
    jax.config.update(
        "jax_compilation_cache_dir", os.environ.get("JAXOPT_MARL_JAX_CACHE", str(Path("runs/.jax_cache").resolve()))
    )
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.0)

    from jaxopt_marl import burnin, episode_gif, evaluation, interfaces, rollout, seeding, solo_test
    from jaxopt_marl.compiled_rollout import CompiledRoller
    from jaxopt_marl.prompt_ids import DEVICE_INTERFACES, PromptIds

    _print_header(cfg, out, resume, ckpt_round)
    # 0b. The model and the prompt limits, before any compute and before the run directory is written (or, with
    # force, deleted): an unreadable model file, a menu longer than the letters, a prompt over its limit or
    # letters that are not single tokens stop here with a message naming the file or the game and the limit.
    t0 = time.perf_counter()
    try:
        model, tok = rollout.load_policy_model(cfg.model, cfg.lora, seed=seeding.lora_init_seed(cfg.seed))
    except (ValueError, OSError) as e:
        raise InputError(f"model {cfg.model or DEFAULT_MODEL_NAME} could not be loaded: {e}") from None
    print(f"model loaded in {time.perf_counter() - t0:.1f} s")
    if cfg.format_warmup:  # the response budget must hold the target answer
        from jaxopt_marl import format_warmup

        try:
            format_warmup.check_budget(cfg, tok)
        except ValueError as e:
            raise InputError(str(e)) from None
    menu = cfg.interface == interfaces.MENU
    # The interfaces the compiled rollout plays (menu, native); compound_json plays the host loop.
    compiled_loop = cfg.interface in DEVICE_INTERFACES
    if cfg.frozen and dist is not None:
        raise InputError(
            "rounds 0 (no training: evaluate the frozen base) runs in one process, not under --distributed"
        )
    if cfg.format_warmup and dist is not None:
        raise InputError("--format-warmup runs in one process, not under --distributed")
    if not compiled_loop and dist is not None:
        raise InputError(
            f"interface {cfg.interface} plays the host rollout loop; several processes need the compiled rollout "
            f"(interface {' or '.join(DEVICE_INTERFACES)})"
        )
    try:  # the compiled rollout's prompt limits (menu, native; compound_json runs the host loop)
        prompt = (
            PromptIds(cfg.game, env, lib, tok, mode=cfg.mode, max_steps=cfg.episode_steps, interface=cfg.interface)
            if compiled_loop
            else None
        )
    except ValueError as e:
        raise InputError(str(e)) from None
    try:
        agree()  # several processes: bad input in any stops every one, before anything is written
    except ValueError as e:
        raise InputError(str(e)) from None
    if writer:
        if force:
            preflight.clear_run_dir(out)  # every check has passed
        out.mkdir(parents=True, exist_ok=True)
        write_config(cfg, out)
    wait("run-dir")

    # 1. Burn-in and guards (on --resume: those loaded in step 0a).
    if guards is not None:
        print(f"burn-in: reusing {bdir} ({len(guards)} guards)")
    elif not writer:  # process 0 plays the burn-in and writes the guards; the others read them
        wait("burnin")
        guards = G.load_guards(guard_path, lib.option_names, lib.vocab, reasons=lib.reasons)
        print(f"burn-in: process 0's {guard_path} ({len(guards)} guards)")
    else:
        steps = cfg.burnin_steps or cfg.episode_steps
        res = burnin.run_burnin(
            lib,
            env,
            cfg.burnin_episodes,
            cfg.burnin_episodes,
            seed=cfg.seed,
            chunk=100,
            num_steps=steps,
            progress=progress,
        )
        t1 = time.perf_counter()
        guards = burnin.synthesize(lib, res.codes, min_support=cfg.min_support)
        summary = burnin.write_outputs(
            lib,
            res,
            guards,
            bdir,
            guard_path=guard_path,
            seed=cfg.seed,
            seconds_guards=time.perf_counter() - t1,
            steps=steps,
            min_support=cfg.min_support,
        )
        warning = burnin.never_succeeded_warning(summary)
        if warning:
            print(warning, file=sys.stderr)
        print(f"burn-in: {res.decisions} decisions in {res.seconds:.1f} s; {len(guards)} guards -> {guard_path}")
        if dist is not None:
            wait("burnin")
    compiled = G.compile_guards(guards, lib.vocab)
    if not menu:
        print(f"interface {cfg.interface}: no menu, the guards are not applied (jaxopt_marl.interfaces)")

    # 2. Policy and trainer. The compiled rollout (one jitted program per call of K episodes, LLM included) also
    # plays the evaluation, the frozen base and the solo test, in calls of K, under the menu and native interfaces.
    # The compound_json interface (Ablation D) plays the host loop (jaxopt_marl.rollout.Roller), the same traces
    # and batch.
    mcfg = cfg.magrpo
    # Several processes: each plays its share of the K rollouts (K / P, checked by the command line) in one call.
    batch = mcfg.num_rollouts // (1 if dist is None else dist.num_processes)
    try:
        if compiled_loop:
            roller = CompiledRoller.for_run(cfg, env, lib, compiled, model, tok, batch=batch, prompt=prompt)
        else:
            host_policy = rollout.LLMPolicy(model, tok, cfg.game, cfg.policy_config())
            roller = rollout.Roller(
                cfg.game, env, lib, compiled, host_policy, menu_seed=seeding.interface_seed(cfg.seed)
            )
    except ValueError as e:  # a model whose adapters do not fit the mode: before any compute
        raise InputError(str(e)) from None
    # 2a. The optional format warm-up (ours, not the paper): supervised steps merged into the base, so that
    # "adapters off" (the KL reference, the frozen-base evaluation) is the warmed-up base from here on.
    if cfg.format_warmup:
        from jaxopt_marl import format_warmup

        try:
            fw = format_warmup.run(cfg, roller, tok, out, resume=resume, progress=progress)
        except (ValueError, FileNotFoundError) as e:
            raise InputError(f"format warm-up: {e}") from None
        print(
            f"format warm-up (not the paper): {fw['steps']} supervised steps on {fw['examples']} decisions of "
            f"the frozen base (its parse failures {fw['base_parse_fail_rate']:.2f}); loss "
            f"{fw['losses'][0]['loss']:.3f} -> {fw['losses'][-1]['loss']:.3f}; merged into the base"
        )
    # 3. Training (none for rounds 0: no trainer, no checkpoints; the evaluation plays the frozen base).
    # 4. Evaluation on held-out seeds (trained adapters, then the frozen base on the same menus), solo test, GIF.
    # Several processes: all restore the adapters (collective), process 0 alone plays and writes (run's docstring).
    if cfg.frozen:
        ck = evaluation.frozen_choice()
    else:
        ck = _train(cfg, out, roller, resume, progress, keep_checkpoints, dist, warn)
    if not writer:
        wait("evaluation")
        print(f"total wall time {time.perf_counter() - t_start:.0f} s (process {dist.process_id}: training only)")
        return out
    print(
        f"eval adapters: {ck.checkpoint_rule}"
        + (f", round {ck.checkpoint_round}" if ck.checkpoint_round is not None else "")
        + (f" (training return {ck.checkpoint_train_return:.2f})" if ck.checkpoint_train_return is not None else "")
    )
    ev = evaluation.evaluate(cfg, roller, out, ck, progress=progress)
    solo_test.run_solo_test(cfg, roller, ev, ck, out, progress=progress)
    episode_gif.write_eval_gif(
        roller,
        env,
        cfg.game,
        ev.seeds[0],
        ev.key,
        ev.trained.traj["actions"][0],
        ck.checkpoint_round,
        out / "episode.gif",
        policy="frozen base (no training, adapters off)" if cfg.frozen else None,
    )
    evaluation.write_trajectories(env, roller, roller.lib, ev, out / "eval_traj.npz")

    # 5. Report.
    write_report(out, cfg)
    s = ev.record.trained.summary["team_return"]
    base = ev.record.base
    print(
        f"eval {ev.record.trained.policy.replace('_', ' ')}: team return {s['mean']:.2f} ± {s['std']:.2f}"
        + (
            f"; frozen base {base.summary['team_return']['mean']:.2f} ± {base.summary['team_return']['std']:.2f}"
            if base is not None
            else ""
        )
    )
    print(f"total wall time {time.perf_counter() - t_start:.0f} s")
    for f in RUN_FILES:
        if (out / f).exists():
            print(f"wrote {out / f}" + (" (report: jaxopt_marl.report)" if f == "report.md" else ""))
    wait("evaluation")
    return out


def _train(cfg: RunConfig, out: Path, roller, resume, progress, keep_checkpoints, dist, warn):
    """Step 3 of :func:`_run`: the PA-MAGRPO rounds (restored first on ``resume``); returns the
    :class:`jaxopt_marl.evaluation.CheckpointChoice` of the adapters to evaluate, set on the policy."""
    from jaxopt_marl import evaluation, trainer

    mcfg = cfg.magrpo
    policy = roller.policy
    tr = trainer.Trainer(
        out,
        roller,
        mcfg,
        trainer.TrainConfig(
            rounds=cfg.rounds,
            seed=cfg.seed,
            skip_zero_advantage=cfg.skip_zero_advantage,
            keep_checkpoints=keep_checkpoints,
            update_progress=progress,
        ),
        dist=dist,
    )
    if resume:
        try:
            done = tr.restore(warn)
        except ValueError as e:
            raise InputError(str(e)) from None
        print(f"restored {done} completed rounds")

    def show(m):
        print(
            f"round {m['round']}: return {m['train/return_mean']:.2f} ± {m['train/return_std']:.2f} "
            f"({m['train/decisions']} decisions, parse fail {m['train/parse_fail_rate']:.2f}, "
            f"kl {m['train/kl']:.4f}, clip {m['train/clip_frac']:.2f}, {m['perf/decisions_per_s']:.2f} dec/s, "
            f"{m['perf/round_s']:.0f} s{'' if m['train/updated'] else ', no update: no return spread'})"
        )

    tr.train(progress=progress, on_round=show)

    return evaluation.choose_adapters(cfg, tr, policy)


__all__ = ["RUN_FILES", "run", "write_config", "write_report"]
