"""PA-MAGRPO training rounds (paper §5.2, Algorithm 1): rollouts -> team returns -> advantages -> update -> checkpoint.

One round ``r``:

1. K joint rollouts under the current adapters (:meth:`jaxopt_marl.rollout.Roller.collect`) on the training env
   seeds :func:`train_seeds` (disjoint from the evaluation seeds 10000-10019);
2. team return R_k per rollout (apples eaten / soups delivered, unshaped) and the group-relative advantage
   (R_k - mean) / std, shared by every decision of rollout k (:mod:`jaxopt_marl.magrpo`);
3. every decision becomes one token row (prompt + sampled response, :func:`jaxopt_marl.train_step.pack_decisions`);
   the reference log-probs (adapters off) are scored by the update's own program (``TrainStep.prepare``), then E
   epochs of per-agent PPO-clip + KL (``TrainStep.update``) change each agent's adapter on its own decisions;
   theta_old's log-probs are the first step's own forward (one minibatch), or scored by ``prepare`` too (several);
4. adapters, optimizer state, the round number and the LoRA config (meta ``lora``: rank, alpha, ...; a restore
   into a model of other LoRA settings names them instead of failing as corrupt) are checkpointed atomically
   (:mod:`lora.checkpoint`), the
   decisions go to ``decisions/round_XXXX.jsonl`` and one line with namespaced keys to ``metrics.jsonl``.

Checkpoint rule (paper §6.1: "highest training-time team return"): the K rollouts of round r are played by the
adapters held at the *start* of round r (before its update), so round r's mean team return scores those
adapters. Whenever it is strictly greater than every earlier round's (ties keep the earliest; round 0 always sets
it), those adapters (adapters only: no optimizer state, ``best/`` is only evaluated) are written to a second orbax
directory ``best/`` (one step, ``max_to_keep=1``, step number = r, meta ``{"round": r, "train_return": mean}``), before
the update and before the round's main checkpoint. :meth:`Trainer.best_adapters` loads them for evaluation.
The main checkpoint's meta also carries ``best_round`` / ``best_return``, the best known when it was written.

Determinism and resume: every random draw of round ``r`` comes from ``fold_in(PRNGKey(seed), r)`` (rollout
keys, env seeds, update key), and the state carried between rounds is exactly what the checkpoint holds
(adapters, optimizer state). A run stopped after round r and resumed with ``resume=True`` therefore ends with
the same adapters as an uninterrupted run (tested bit for bit). ``checkpoints/`` keeps the newest
``TrainConfig.keep_checkpoints`` steps (default 2; ``best/`` one more). A newest checkpoint damaged on disk
(checked against the checksums :mod:`lora.checkpoint` writes, or failing to load) is named with its round and
file, and :meth:`Trainer.restore` resumes from the newest intact one, replaying the rounds in between -- exact
for the same reason.

Zero advantage: a round whose advantages are all 0 runs no update in every preset (``TrainConfig``).

Several processes (``Trainer(..., dist=distributed.initialize(...))``, issue #17): process p plays rollouts
``dist.share(K)`` of the round (same seeds and keys as one process would give them), the returns, traces and
decision rows are gathered into what one process playing all K would hold, and the update runs over the global
mesh; every process keeps the same replicated adapters and optimizer state and saves / restores every checkpoint,
process 0 alone writes ``metrics.jsonl`` and ``decisions/`` (:mod:`jaxopt_marl.distributed`).

Metrics (one JSON line per round):
    ``round``; ``train/return_mean``, ``train/return_std``, ``train/return_min``, ``train/return_max``,
    ``train/returns`` (per rollout), ``train/decisions``, ``train/parse_fail_rate``, ``train/parse`` (counts by
    reason), ``train/outcome_success_rate``, ``train/adv_zero`` (the cohort had no spread: no update,
    :class:`TrainConfig`), ``train/updated``;
    update metrics averaged over optimizer steps and agents with decisions: ``train/loss``, ``train/pg_loss``,
    ``train/kl``, ``train/clip_frac``, ``train/ratio_mean``, ``train/grad_norm``; ``perf/decisions_per_s``
    (rollout decisions per rollout second), ``perf/rollout_s``, ``perf/llm_s``, ``perf/update_s``,
    ``perf/round_s``; ``train/best_round``, ``train/best_return`` (the best round so far and its mean return).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxopt_marl import distributed, magrpo, seeding
from jaxopt_marl import progress as progress_lib
from jaxopt_marl import train_step as ts
from jaxopt_marl.rollout import Roller, RolloutResult
from lora import checkpoint as ckpt
from lora import split_model

log = logging.getLogger(__name__)

#: Training env seeds start here (evaluation uses 10000-10019; paper §6.1: disjoint seeds).
TRAIN_SEED0 = 1_000_000
#: Prompt columns of a packed decision are padded to a multiple of this.
PROMPT_BUCKET = 64


def train_seeds(seed: int, round_idx: int, k: int) -> list[int]:
    """Env seeds of round ``round_idx``'s K rollouts (never in 10000-10019)."""
    base = TRAIN_SEED0 + seed * 100_000 + round_idx * k
    return [base + i for i in range(k)]


def round_key(seed: int, round_idx: int) -> jax.Array:
    """All randomness of one round: ``fold_in(PRNGKey(seed), round)`` (:func:`jaxopt_marl.seeding.round_key`)."""
    return seeding.round_key(seed, round_idx)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The training loop's own knobs (update hyper-parameters live in :class:`MAGRPOConfig`)."""

    # Training rounds.
    rounds: int = 1
    # Run seed (rollout seeds, sampling, update keys).
    seed: int = 0
    # Zero advantage = exactly zero update (every preset): a round whose advantages are all 0 (no return spread)
    # runs no update, so adapters and optimizer state (Adam moments and step count) stay bit-identical. With
    # an update the PPO term is 0 but the KL term is not: at fresh adapters theta_old (the update's own
    # forward) and the reference (``prepare``'s program) differ by float rounding only (KL ~1e-13, gradient
    # ~1e-7), and Adam rescales that noise into a step of ~1x the learning rate. False = always update (the
    # KL pull alone acts; kept for ablations, not used by any preset).
    skip_zero_advantage: bool = True
    # Main checkpoints (``checkpoints/<step>``) kept on disk, >= 1; ``best/`` holds one more. A corrupt newest
    # checkpoint can only fall back to an older one that is still kept (:meth:`Trainer.restore`).
    keep_checkpoints: int = 2
    # Per-micro-batch progress of the update: a train step built here compiles host ticks into ``prepare`` and
    # ``update`` (:mod:`jaxopt_marl.train_step`, "Progress": numerics unchanged, but such programs are not
    # persisted by JAX's compilation cache), shown as a tqdm bar by ``run_round(progress=True)``.
    update_progress: bool = False

    def __post_init__(self):
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")


@dataclasses.dataclass
class TrainState:
    """What carries over between rounds (exactly the checkpoint's content)."""

    adapters: object
    opt_state: object
    round: int


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)


def read_metrics(path: Path) -> list[dict]:
    """The metrics lines of a run (empty if none)."""
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


class Trainer:
    """PA-MAGRPO over a :class:`Roller`.

    Args:
        run_dir: the run directory (``checkpoints/``, ``decisions/``, ``metrics.jsonl`` are written here).
        roller: rollouts (its ``policy`` holds the model whose adapters are trained).
        mcfg: update hyper-parameters (``num_rollouts`` = K, ``temperature`` = sampling temperature).
        tcfg: loop settings.
        step: optional prebuilt :class:`jaxopt_marl.train_step.TrainStep` (same model and ``mcfg``).
        dist: a multi-process run's :class:`jaxopt_marl.distributed.Context` (None: this process alone, on one
            device unless ``step`` says otherwise). With it, each process plays its share of the K rollouts
            (``dist.share(K)``; the roller should play that many per call), the returns and decision rows are
            gathered, the update runs over ``dist.mesh`` (the global mesh), every process saves and restores the
            orbax checkpoints, and only process 0 writes ``metrics.jsonl`` and ``decisions/``. Same adapters,
            optimizer state and metrics as one process over a mesh of the same shape
            (:mod:`jaxopt_marl.distributed`, ``tests/test_distributed.py``).
    """

    def __init__(
        self,
        run_dir: Path,
        roller: Roller,
        mcfg: magrpo.MAGRPOConfig,
        tcfg: TrainConfig,
        step: ts.TrainStep | None = None,
        dist: distributed.Context | None = None,
    ):
        self.run_dir, self.roller, self.mcfg, self.tcfg = Path(run_dir), roller, mcfg, tcfg
        self.dist = dist
        self.policy = roller.policy
        # One temperature: the rollouts sample at the policy's, the update scores log-probs at mcfg's.
        if self.policy.cfg.temperature != mcfg.temperature:
            raise ValueError(
                f"temperature: the policy samples at {self.policy.cfg.temperature}, the update scores at "
                f"{mcfg.temperature}; build both from one value (jaxopt_marl.config.RunConfig.policy_config)"
            )
        self.graphdef, adapters, self.base = split_model(self.policy.model)
        n_adapters = 1 if self.policy.cfg.shared_adapter else roller.n
        # ``step``: reuse compiled functions of an earlier trainer with the same model and config.
        self.step = step or ts.make_train_step(
            self.graphdef,
            mcfg,
            ts.make_mesh(1) if dist is None else dist.mesh,
            num_adapters=n_adapters,
            progress=tcfg.update_progress,
        )
        if dist is None:
            self.state = TrainState(adapters=adapters, opt_state=ts.init_opt_state(self.step, adapters), round=0)
        else:
            dist.share(mcfg.num_rollouts)  # K must split over the processes: refused before any compute
            # Adapters, optimizer state and the frozen base live replicated on the global mesh (the update's
            # inputs and what orbax saves from every process); the rollout plays local copies.
            self.base = dist.replicate(self.base)
            opt_state = dist.replicate(self.step.optimizer.init(adapters))
            self.state = TrainState(adapters=dist.replicate(adapters), opt_state=opt_state, round=0)
        self.manager = ckpt.make_manager(str(self.run_dir / "checkpoints"), max_to_keep=tcfg.keep_checkpoints)
        # Checkpoint rule: the adapters with the highest training-time team return (module docstring).
        self.best_manager = ckpt.make_manager(str(self.run_dir / "best"), max_to_keep=1)
        #: ``(round, mean team return)`` of the best round so far, None before round 0 has been played.
        self.best: tuple[int, float] | None = None
        self.metrics_path = self.run_dir / "metrics.jsonl"
        if self.writer:
            (self.run_dir / "decisions").mkdir(parents=True, exist_ok=True)

    @property
    def writer(self) -> bool:
        """This process writes the run files (always, unless it is not process 0 of a distributed run)."""
        return self.dist is None or self.dist.is_writer()

    def _play(self, adapters) -> None:
        """The rollout plays ``adapters`` from now on (a distributed run's: this process's local copy)."""
        self.policy.set_adapters(adapters if self.dist is None else self.dist.local(adapters))

    # -- checkpoints --------------------------------------------------------------------------------------

    def restore(self, warn: Callable[[str], None] | None = None) -> int:
        """Loads the newest intact checkpoint; returns the number of completed rounds (0 if none).

        Checkpoint ``s`` (orbax step ``s``) holds the state after round ``s - 1``, i.e. ``s`` completed rounds.
        The steps are tried newest first: a step whose files differ from its ``checksums.json``
        (:func:`lora.checkpoint.verify`, e.g. a truncated file) or whose restore raises is reported through
        ``warn`` in one line naming the step, the round and the file (or orbax's first message line), and the
        next older step is tried. Steps newer than the one restored are then moved out of ``checkpoints/`` into
        ``checkpoints.corrupt/<step>`` (replacing an earlier copy of that step there) so the replayed rounds can
        write them again; the replay is exact (module docstring), so the run ends as an uninterrupted one would.
        How far back this can go is bounded by ``TrainConfig.keep_checkpoints``.

        Args:
            warn: receives each one-line message (default: ``logging.warning`` of this module).

        Raises:
            ValueError: no step can be restored (one line per step: its directory and what is wrong).
        """
        warn = warn or log.warning
        steps = sorted(self.manager.all_steps(), reverse=True)
        if not steps:
            return 0
        bad: list[tuple[int, str]] = []
        restored = None
        for step in steps:
            where = ckpt.step_dir(self.manager, step)
            problem = ckpt.verify(where)
            if problem is None:
                self._check_lora(step, where)
                try:
                    adapters, opt_state, meta = ckpt.restore(
                        self.manager, self.state.adapters, self.state.opt_state, step
                    )
                    restored = step
                    break
                except Exception as e:  # orbax / TensorStore raise many types on corrupt data
                    problem = f"{where} cannot be read ({ckpt.describe_error(e)})"
            bad.append((step, problem))
            older = [s for s in steps if s < step]
            warn(
                f"checkpoint {step} (after round {step - 1}) is corrupt: {problem}; "
                + (f"trying checkpoint {older[0]}" if older else "no older checkpoint is left")
            )
        if restored is None:
            raise ValueError(
                f"{self.run_dir / 'checkpoints'}: no intact checkpoint to resume from ("
                + "; ".join(f"checkpoint {s} is corrupt: {p}" for s, p in bad)
                + "); start the run again with --force"
            )
        if bad:
            aside = self.run_dir / "checkpoints.corrupt"
            if self.writer:
                aside.mkdir(exist_ok=True)
                for step, _ in bad:
                    dst = aside / str(step)
                    if dst.exists():
                        shutil.rmtree(dst)
                    shutil.move(str(ckpt.step_dir(self.manager, step)), str(dst))
            if self.dist is not None:
                self.dist.barrier("trainer-restore-aside")
            self.manager.reload()
            warn(
                f"resuming from checkpoint {restored} (after round {restored - 1}): rounds {restored}.."
                f"{bad[0][0] - 1} are played again; the corrupt checkpoint(s) were moved to {aside}"
            )
        self.state = TrainState(adapters=adapters, opt_state=opt_state, round=int(meta.get("round", restored)))
        self._play(adapters)
        # Metrics of rounds after the checkpoint belong to the interrupted attempt.
        rows = [m for m in read_metrics(self.metrics_path) if m["round"] < self.state.round]
        if self.dist is not None:
            self.dist.barrier("trainer-restore-read")  # every process read the metrics before they change
        if self.writer:
            _write_jsonl(self.metrics_path, rows)
        self.best = self._restore_best(meta)
        return self.state.round

    def lora_meta(self) -> dict | None:
        """The model's LoRA config as JSON (every checkpoint's meta ``lora``), None without adapters."""
        from jaxopt_marl.config import lora_dict

        lcfg = getattr(self.policy.model, "lora_cfg", None)
        return None if lcfg is None else lora_dict(lcfg)

    def _check_lora(self, step: int, where: Path) -> None:
        """ValueError naming each LoRA key (``lora_rank``, ...) where checkpoint ``step``'s meta differs from the
        model's: adapters of another rank are another run's, not a corrupt checkpoint (no fallback)."""
        now = self.lora_meta()
        try:
            stored = ckpt.restore_meta(self.manager, step).get("lora")
        except Exception:  # an unreadable meta is the restore's to report (as corrupt)
            return
        if now is None or not isinstance(stored, dict):
            return
        diff = {f"lora_{k}": (stored[k], v) for k, v in now.items() if k in stored and stored[k] != v}
        if diff:
            keys = "; ".join(
                f"{k}: {json.dumps(a)} in the checkpoint, {json.dumps(b)} given" for k, (a, b) in diff.items()
            )
            raise ValueError(f"checkpoint {where} holds adapters of other LoRA settings ({keys})")

    def _best_meta(self) -> dict | None:
        """Meta of the ``best/`` checkpoint (``round``, ``train_return``, ...), None if there is none.

        Raises:
            ValueError: ``best/`` holds a checkpoint whose meta cannot be read (message names the directory).
        """
        step = self.best_manager.latest_step()
        if step is None:
            return None
        try:
            meta = self.best_manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            meta = dict(meta["meta"])
            return {**meta, "round": int(meta.get("round", step)), "train_return": float(meta["train_return"])}
        except Exception as e:  # orbax raises many types on corrupt data
            raise ValueError(
                f"{self.run_dir / 'best'}: best checkpoint {step} is corrupt or incompatible ({ckpt.describe_error(e)})"
            ) from e

    def _restore_best(self, meta: dict) -> tuple[int, float] | None:
        """The best-so-far after a restore, from ``best/`` checked against the main checkpoint's meta.

        ``best/`` is written before the round's main checkpoint, so a run killed in between leaves ``best/`` at
        the round being replayed (``round == state.round``): it holds exactly the restored adapters (those that
        start that round) with the return that attempt measured, and stays the best unless the replay beats it.
        A ``best/`` from a round the main checkpoint does not cover yet cannot exist otherwise; one that
        disagrees with the meta (e.g. copied by hand) is reported and the meta wins where it can.
        """
        disk = self._best_meta()
        if disk is not None and disk["round"] <= self.state.round:
            if meta.get("best_round") is not None and disk["round"] < int(meta["best_round"]):
                log.warning(
                    "%s: holds round %d but the checkpoint says the best round is %s; the best adapters "
                    "of that round are lost",
                    self.run_dir / "best",
                    disk["round"],
                    meta["best_round"],
                )
            return disk["round"], disk["train_return"]
        if disk is not None:
            log.warning(
                "%s: holds round %d, beyond the restored round %d; ignored until it is replayed",
                self.run_dir / "best",
                disk["round"],
                self.state.round,
            )
        if meta.get("best_round") is not None:
            log.warning(
                "%s: missing; the checkpoint's best round %s cannot be evaluated",
                self.run_dir / "best",
                meta["best_round"],
            )
        elif self.state.round > 0:
            log.warning(
                "%s: no best checkpoint (a run from before the checkpoint rule); the best is chosen "
                "among the rounds from %d on",
                self.run_dir / "best",
                self.state.round,
            )
        return None

    def save_best(self, round_idx: int, train_return: float, adapters) -> None:
        """Writes ``best/`` (atomically, replacing the previous best): the adapters that played round
        ``round_idx``'s rollouts and their mean training team return (apples / deliveries). Adapters only: ``best/``
        is evaluated, never trained on, so it keeps no optimizer state.

        A ``best/`` step at or after ``round_idx`` can only come from an abandoned attempt (a resume that fell back
        to an older checkpoint replays those rounds); it is deleted first, since orbax silently skips a save
        whose step is not newer than its latest."""
        for stale in [s for s in self.best_manager.all_steps() if s >= round_idx]:
            self.best_manager.delete(stale)
        ckpt.save(
            self.best_manager,
            round_idx,
            adapters,
            None,
            meta={
                "round": int(round_idx),
                "train_return": float(train_return),
                "seed": self.tcfg.seed,
                "rule": "highest training-time team return (paper §6.1)",
                "lora": self.lora_meta(),
            },
        )
        self.best = (int(round_idx), float(train_return))

    def best_adapters(self) -> tuple[object, int, float] | None:
        """The adapters with the highest training-time team return (paper §6.1 checkpoint rule).

        Returns:
            ``(adapters, round, train_return)``: the adapter ``nnx.State`` (same structure as
            ``state.adapters``, a fresh copy) that played round ``round``'s rollouts, and that round's mean team
            return over its K rollouts (apples eaten / soups delivered); None if no round has been played.

        Raises:
            ValueError: the ``best/`` checkpoint cannot be read (message names the directory).
        """
        step = self.best_manager.latest_step()
        if step is None:
            return None
        template = jax.tree.map(jnp.copy, self.state.adapters)
        problem = ckpt.verify(ckpt.step_dir(self.best_manager, step))
        if problem is not None:
            raise ValueError(f"{self.run_dir / 'best'}: best checkpoint {step} is corrupt: {problem}")
        try:
            adapters, _, meta = ckpt.restore(self.best_manager, template, None, step)
        except Exception as e:  # orbax raises many types on corrupt data
            raise ValueError(
                f"{self.run_dir / 'best'}: best checkpoint {step} is corrupt or incompatible ({ckpt.describe_error(e)})"
            ) from e
        return adapters, int(meta.get("round", step)), float(meta["train_return"])

    def save(self) -> None:
        best_round, best_return = self.best if self.best is not None else (None, None)
        ckpt.save(
            self.manager,
            self.state.round,
            self.state.adapters,
            self.state.opt_state,
            meta={
                "round": self.state.round,
                "seed": self.tcfg.seed,
                "best_round": best_round,
                "best_return": best_return,
                "lora": self.lora_meta(),
            },
        )

    # -- one round --------------------------------------------------------------------------------------

    def pack(self, res: RolloutResult, adv: np.ndarray) -> ts.DecisionBatch:
        """The round's decisions as one token batch (D padded for the micro-batch size), forced choices after the
        others (:func:`jaxopt_marl.train_step.trainable_first`: their micro-batches cost the update no forward).

        A compiled rollout's batch is built on the device from its decision buffers
        (:func:`jaxopt_marl.compiled_rollout.decision_batch`); the host loop's is packed from its lists.
        """
        multiple = max(1, self.mcfg.micro_batch) * self.mcfg.num_minibatches * self.step.mesh.size
        return ts.trainable_first(self._pack(res, adv, multiple))

    def _pack(self, res: RolloutResult, adv: np.ndarray, multiple: int) -> ts.DecisionBatch:
        if res.device is not None:
            from jaxopt_marl import compiled_rollout

            return compiled_rollout.decision_batch(
                self.roller,
                res,
                adv,
                row_multiple=multiple,
                prefix=tuple(self.policy.prefix_ids),
                width_step=PROMPT_BUCKET,
            )
        prompts = [d.prompt_ids for _, _, d in res.decisions]
        responses = [d.response_ids for _, _, d in res.decisions]
        aids = [a for _, a, _ in res.decisions]
        advs = [float(adv[b]) for b, _, _ in res.decisions]
        # The shared system turn is stripped from the rows and run once per adapter (TrainStep); choice_only
        # decisions carry their menu's letter tokens so the update scores the distribution they were drawn from.
        prefix = self.policy.prefix_ids if self.policy.cfg.prefix_cache else []
        choices = [d.choices for _, _, d in res.decisions]
        choices = None if any(c is None for c in choices) else choices
        tp = -(-max(len(p) - len(prefix) for p in prompts) // PROMPT_BUCKET) * PROMPT_BUCKET
        return ts.pack_decisions(
            prompts,
            responses,
            aids,
            advs,
            pad_id=self.policy.pad_id,
            prompt_len=tp,
            response_len=self.policy.cfg.response_len,
            pad_to_multiple=max(multiple, 4),
            prefix=prefix,
            choices=choices,
        )

    def run_round(self, progress: bool = False) -> dict:
        """Plays, updates and checkpoints round ``state.round``; returns its metrics line."""
        r = self.state.round
        t0 = time.perf_counter()
        # The rollout and minibatch channels of the run seed (jaxopt_marl.seeding).
        k_roll, k_upd = seeding.round_keys(self.tcfg.seed, r)
        k = self.mcfg.num_rollouts
        seeds = train_seeds(self.tcfg.seed, r, k)
        share = range(k) if self.dist is None else self.dist.share(k)
        res = self.roller.collect(
            seeds[share.start : share.stop], k_roll, round_idx=r, progress=progress, desc=f"round {r} rollouts"
        )
        if self.dist is not None:
            res = self._gather(res, share.start)
        if self.writer:
            _write_jsonl(self.run_dir / "decisions" / f"round_{r:04d}.jsonl", res.traces)
        # Checkpoint rule: these rollouts scored the adapters held now, before this round's update.
        ret = float(res.returns.mean())
        if self.best is None or ret > self.best[1]:
            self.save_best(r, ret, self.state.adapters)
        adv_fn = magrpo.get("advantage", self.mcfg.advantage)
        adv = np.asarray(adv_fn(jnp.asarray(res.returns), ddof=self.mcfg.std_ddof))
        zero = not np.any(adv != 0)
        upd: dict = {}
        t1 = time.perf_counter()
        updated = res.num_decisions > 0 and not (zero and self.tcfg.skip_zero_advantage)
        if updated:
            batch = self.pack(res, adv)
            bar = None
            if progress and self.tcfg.update_progress:
                from tqdm import tqdm

                bar = tqdm(
                    total=sum(ts.progress_ticks(self.mcfg, batch.num_decisions)),
                    leave=False,
                    unit="micro-batch",
                    desc=f"round {r} update ({batch.num_decisions} rows: reference "
                    f"scoring, then {self.mcfg.epochs} epoch(s))",
                )
            if self.dist is not None:  # the single-process batch, split by row over the global mesh
                batch, k_upd = self.dist.shard_rows(batch), self.dist.replicate(k_upd)
            with progress_lib.route(bar):
                batch = self.step.prepare(self.base, self.state.adapters, batch)
                adapters, opt_state, m = jax.block_until_ready(
                    self.step.update(self.base, self.state.adapters, self.state.opt_state, batch, k_upd)
                )
                if bar is not None:
                    jax.effects_barrier()  # every tick delivered before the bar closes
            if bar is not None:
                bar.close()
            m = {key: distributed.to_host(v) for key, v in m.items()}
            has = m["count"] > 0  # [S, N]
            for key in ("loss", "pg_loss", "kl", "clip_frac", "ratio_mean", "grad_norm"):
                upd[f"train/{key}"] = float(m[key][has].mean()) if has.any() else 0.0
            self.state.adapters, self.state.opt_state = adapters, opt_state
            self._play(adapters)
        t_upd = time.perf_counter() - t1
        self.state.round = r + 1
        self.save()
        outcomes = [t["outcome"] for t in res.traces if t["outcome"] not in ("running", "episode_end", "idle")]
        line = {
            "round": r,
            "train/return_mean": ret,
            "train/return_std": float(res.returns.std()),
            "train/return_min": float(res.returns.min()),
            "train/return_max": float(res.returns.max()),
            "train/returns": res.returns.tolist(),
            "train/decisions": res.num_decisions,
            "train/parse_fail_rate": res.parse.failure_rate,
            "train/parse": res.parse.as_dict(),
            "train/outcome_success_rate": (sum(o == "success" for o in outcomes) / len(outcomes)) if outcomes else 0.0,
            "train/adv_zero": bool(zero),
            "train/updated": bool(updated),
            "train/best_round": self.best[0],
            "train/best_return": self.best[1],
            **{"train/kl": 0.0, "train/clip_frac": 0.0, **upd},
            "train/parse_mismatch": int(res.parse_mismatch),
            "perf/decisions_per_s": res.num_decisions / max(res.seconds, 1e-9),
            "perf/rollout_s": res.seconds,
            # The host loop times its LLM calls; the compiled rollout is one program (None: not separable).
            "perf/llm_s": None if np.isnan(res.llm_seconds) else res.llm_seconds,
            "perf/waves": int(res.waves),
            "perf/model_rows": int(res.model_rows),
            "perf/update_s": t_upd,
            "perf/round_s": time.perf_counter() - t0,
        }
        if self.writer:
            with self.metrics_path.open("a") as f:
                f.write(json.dumps(line) + "\n")
        return line

    def _gather(self, res: RolloutResult, offset: int) -> RolloutResult:
        """A distributed round's rollouts as one process playing all K would have returned them: returns,
        traces (global rollout indices, single-call order), parse counts, waves (the slowest share's) and, for
        :meth:`pack`, the merged decision buffers (:func:`jaxopt_marl.distributed.merge_decisions`)."""
        dist = self.dist
        if res.device is None or len(res.device) != 1:
            raise ValueError(
                "distributed training needs the compiled rollout playing each process's share of the K rollouts "
                f"in one call (roller batch = K / processes = {self.mcfg.num_rollouts // dist.num_processes})"
            )
        traces = distributed.gather_traces(dist, res.traces, offset)
        parse = type(res.parse)()
        for t in traces:
            parse.counts[t["parse"]] += 1
        scalars = dist.allgather(np.asarray([res.parse_mismatch, res.waves, res.seconds, res.model_rows], np.float64))
        merged = distributed.merge_decisions(dist, res.device[0].decisions, offset)
        return dataclasses.replace(
            res,
            returns=dist.gather_returns(res.returns),
            traces=traces,
            parse=parse,
            traj={},
            stats={key: dist.allgather(v).reshape((-1,) + np.shape(v)[1:]) for key, v in res.stats.items()},
            device=[res.device[0]._replace(decisions=merged)],
            batches=[self.mcfg.num_rollouts],
            parse_mismatch=int(scalars[:, 0].sum()),
            waves=int(scalars[:, 1].max()),
            seconds=float(scalars[:, 2].max()),
            model_rows=int(scalars[:, 3].sum()),
        )

    def train(
        self, rounds: int | None = None, progress: bool = False, on_round: Callable[[dict], None] | None = None
    ) -> list[dict]:
        """Runs rounds ``state.round .. rounds - 1`` (default ``tcfg.rounds``); returns their metrics lines."""
        rounds = self.tcfg.rounds if rounds is None else rounds
        lines = []
        while self.state.round < rounds:
            line = self.run_round(progress=progress)
            lines.append(line)
            if on_round is not None:
                on_round(line)
        return lines


__all__ = [
    "PROMPT_BUCKET",
    "TRAIN_SEED0",
    "TrainConfig",
    "TrainState",
    "Trainer",
    "read_metrics",
    "round_key",
    "train_seeds",
]
