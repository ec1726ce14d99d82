"""Format warm-up (``--format-warmup S``; off by default, ours, not the paper): S supervised LoRA steps that teach
a small model the two-line answer, merged into the frozen base before PA-MAGRPO's first round.

Why: the frozen SmolLM2-135M-Instruct fails to parse 86-97% of its ``sample`` answers to the paper's §5.1
contract (``docs/runs/frozen-smollm2-cpu/``, parts 1 and 4), and a failed parse makes the agent wait, so
PA-MAGRPO in ``sample`` mode has little to learn from. 15 supervised steps of one LoRA adapter on answers with
uniform letters made 93-100% of held-out ``sample`` answers parse, on two seeds
(``docs/runs/smollm2-format-warmup-cpu/``, whose probe this module builds into the run). The paper starts
PA-MAGRPO from the frozen base (§5.2); a run with a warm-up says so in ``config.json`` (``format_warmup``), on
the console and in ``report.md``.

Procedure (:func:`run`, called by :mod:`jaxopt_marl.pipeline` after the burn-in, before the trainer is built):

1. *Prompts.* One call of K episodes (K = the run's ``num_rollouts``) played by the frozen base (adapters off)
   in the run's ``sample`` mode, on the env seeds :func:`warmup_seeds` with the key
   :func:`jaxopt_marl.seeding.format_warmup_key`. Every decision is one example: the prompt the model saw
   (system turn, user turn, generation prompt) and the state label code of that decision
   (:data:`jaxopt_marl.prompts.STATE_LABELS`).
2. *Targets.* :data:`jaxopt_marl.prompt_ids.RESPONSE_PREFIX` with the label, then the letter token (``" B"``,
   the one ``choice_only`` scores), then the chat template's end-of-turn token
   (:func:`lora.tokenizer.end_of_turn_id`). The letter is drawn uniformly over the decision's menu letters, so
   the targets carry the format and no option preference (under the per-decision letter shuffle a uniform letter
   is a uniform option). The probe's alternatives failed: letters drawn from the base's own distribution
   collapsed onto A on one seed of two, and a letter left out of the loss left the letter slot unlearnt.
3. *Training.* S steps of AdamW (:data:`LEARNING_RATE`, no weight decay, global-norm clip :data:`MAX_GRAD_NORM`)
   on adapter 0, :data:`BATCH_ROWS` examples a step drawn with replacement, loss = the mean cross-entropy of the
   answer tokens at temperature 1. Every row is padded to the longest example, so the step compiles once.
4. *Merge.* Each LoRA projection's kernel ``W <- W + scaling * A_0 @ B_0`` (:func:`merge_adapter`), then every
   adapter is set back to its initial value (B = 0). PA-MAGRPO therefore starts as the paper's does, from
   zero-delta adapters, on a warmed-up base: "adapters off" -- the update's KL reference, the frozen-base
   evaluation, the solo test's base -- is the warmed-up base. (The Table 2 grid and the seeds study run the
   paper's settings; ``experiments.table2`` refuses the flag.)
5. *Written.* ``format_warmup/`` (orbax, :mod:`lora.checkpoint`: adapter 0 after step S, the adapter axis kept
   at length 1, with its checksums; meta: the LoRA config), then ``format_warmup.json`` (:func:`summary_path`:
   losses per step, seconds, the examples, the frozen base's parse counts in step 1 and the targets' letter
   counts). The summary is written last, so its presence means both are whole: ``--resume`` then merges the
   saved adapter again (:func:`apply_saved`) without training; without it the warm-up is redone from scratch
   (deterministic; a partial ``format_warmup/`` is deleted first).

Bad input, before any compute (:func:`check_budget`, :func:`check_resume`): a response budget too short for the
longest target answer; on ``--resume``, a saved warm-up that is damaged or of another step count, or a warm-up
asked of a run that has already trained or evaluated without one.

The merged base lives in the process only: anything that loads a warmed-up run's adapters onto a freshly loaded
base must call :func:`apply_saved` first (``experiments.crossplay`` refuses warmed-up runs instead; an adapter
exported from such a run by ``python -m experiments.export`` carries the warm-up, as a stacked adapter of rank
2r on the un-warmed base: :func:`lora.peft_export.stack_adapters`).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxopt_marl import artifacts, menus, prompts, seeding
from jaxopt_marl.prompt_ids import RESPONSE_PREFIX
from jaxopt_marl.rollout import left_pad
from lora import checkpoint as ckpt
from lora import sampling, split_model
from lora.model import LoRALinear
from lora.tokenizer import end_of_turn_id

#: AdamW learning rate of the warm-up (docs/runs/smollm2-format-warmup-cpu/: the probe's 2e-4, not swept).
LEARNING_RATE = 2e-4
#: Examples per warm-up step (the probe's 8).
BATCH_ROWS = 8
#: Global-norm gradient clip of the warm-up (the probe's, as PA-MAGRPO's MAGRPOConfig.max_grad_norm = 1.0).
MAX_GRAD_NORM = 1.0
#: Env seeds of the warm-up's episodes start here: between the evaluation's 10000-10019 and the training seeds
#: (>= 1,000,000, :data:`jaxopt_marl.trainer.TRAIN_SEED0`), so disjoint from both.
WARMUP_SEED0 = 500_000
#: Prompt columns are padded to a multiple of this (one width for every step: one compile).
WIDTH_QUANTUM = 64
#: The run directory's files (:mod:`jaxopt_marl.artifacts`).
CHECKPOINT_DIR = artifacts.FORMAT_WARMUP_DIR
SUMMARY_FILE = artifacts.FORMAT_WARMUP_JSON
#: What a run has written once it trained or evaluated (a warm-up cannot be slipped in under it on --resume).
TRAINED_FILES = ("metrics.jsonl", "checkpoints", artifacts.EVAL_JSON)


def warmup_seeds(seed: int, k: int) -> list[int]:
    """The env seeds of the warm-up's K episodes: ``WARMUP_SEED0 + (1000 seed + i) mod 500000``, i < K, in
    [500000, 1000000) (disjoint from evaluation and training; distinct across seeds < 500 with K <= 1000)."""
    seed = int(seed)
    return [WARMUP_SEED0 + (1000 * seed + i) % WARMUP_SEED0 for i in range(int(k))]


def summary_path(run_dir: Path) -> Path:
    """``run_dir/format_warmup.json``, the warm-up's summary (written last: see the module docstring)."""
    return Path(run_dir) / SUMMARY_FILE


def answer_ids(tok, label: str, letter_id: int, end_id: int) -> list[int]:
    """The target answer's token ids: ``RESPONSE_PREFIX`` with ``label`` encoded as one string, the letter token
    ``letter_id`` (``" B"``, the token ``choice_only`` scores), the end-of-turn token ``end_id``."""
    return [*tok.encode(RESPONSE_PREFIX.format(label=label), add_special_tokens=False), int(letter_id), int(end_id)]


def _end_id(tok) -> int:
    end = end_of_turn_id(tok)
    end = tok.eos_token_id if end is None else end
    if end is None:
        raise ValueError("format warm-up: the tokenizer has no end-of-turn and no EOS token to end the answer")
    return int(end)


def check_budget(cfg, tok) -> None:
    """ValueError unless the longest target answer of ``cfg.game`` fits ``cfg.max_new_tokens`` (its tokens before
    the end of turn: an answer the budget cuts before its letter would teach a reply that never parses). SmolLM2:
    Cleanup / Harvest 7 tokens, Overcooked 11 (``state: ready_to_plate``), so the paper's 12 fits and the smoke
    preset's 8 does not for Overcooked."""
    letter = tok.encode(f" {menus.LETTERS[0]}", add_special_tokens=False)[0]
    end = _end_id(tok)
    longest = max(_labels(cfg.game), key=lambda lab: len(answer_ids(tok, lab, letter, end)))
    need = len(answer_ids(tok, longest, letter, end)) - 1
    if need > cfg.max_new_tokens:
        text = RESPONSE_PREFIX.format(label=longest) + f" {menus.LETTERS[0]}"
        raise ValueError(
            f"format warm-up: the longest answer of {cfg.game}, {text!r}, is {need} tokens before the end of turn, "
            f"over max_new_tokens {cfg.max_new_tokens}: give --max-new-tokens {need} or more"
        )


#: The keys a whole ``format_warmup.json`` has (checked on ``--resume`` before it is trusted).
SUMMARY_KEYS = ("steps", "examples", "episodes", "base_parse_fail_rate", "losses")


def read_summary(out: Path, steps: int) -> dict:
    """``out/format_warmup.json``, checked: a JSON object with :data:`SUMMARY_KEYS`, ``steps`` equal to
    ``steps`` and one ``{"step", "loss"}`` row per step.

    Raises:
        ValueError: naming the file and what is wrong (unreadable, not JSON, a missing key, other steps).
    """
    path = summary_path(out)
    try:
        fw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path} is unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(fw, dict) or any(k not in fw for k in SUMMARY_KEYS):
        raise ValueError(f"{path} is not a format warm-up summary (it needs the keys {', '.join(SUMMARY_KEYS)})")
    losses = fw["losses"]
    if fw["steps"] != steps or not isinstance(losses, list) or len(losses) != steps:
        raise ValueError(
            f"{path} records {fw['steps']!r} steps and {len(losses) if isinstance(losses, list) else 'no'} "
            f"losses, not the {steps} steps asked"
        )
    if not all(isinstance(r, dict) and isinstance(r.get("loss"), int | float) for r in losses):
        raise ValueError(f"{path}: its losses are not {{'step', 'loss'}} rows")
    return fw


def check_resume(cfg, out: Path, log=print) -> None:
    """The ``--resume`` checks of a run with ``cfg.format_warmup`` > 0 (no compute; orbax reads no array).

    With a summary, it must be whole (:func:`read_summary`) and ``format_warmup/`` must hold step
    ``cfg.format_warmup`` with intact checksums (:func:`lora.checkpoint.verify`): :func:`run` then merges it
    again. Without one (a run killed during the warm-up, or its files deleted), :func:`run` redoes the warm-up
    from scratch; for a run that has already trained or evaluated (:data:`TRAINED_FILES`) that is allowed only if
    its ``config.json`` records this warm-up (the same seed redoes the same warm-up: identical on the same
    backend, within float rounding on another), and logged.

    Raises:
        ValueError: naming the file: a damaged or partial summary, a ``format_warmup/`` that is missing, holds
            another step count or fails its checksums (each with the way out: delete both to redo the warm-up);
            or no summary in a trained run whose ``config.json`` records no warm-up (a warm-up added now would
            put a new base under its adapters).
    """
    out = Path(out)
    if not cfg.format_warmup:
        return
    hint = f"delete {summary_path(out)} and {out / CHECKPOINT_DIR} to redo the warm-up, or start again with --force"
    if not summary_path(out).exists():
        done = [f for f in TRAINED_FILES if (out / f).exists()]
        if not done:
            return
        try:
            recorded = json.loads((out / "config.json").read_text()).get("format_warmup", 0)
        except (OSError, ValueError, AttributeError):
            recorded = None
        if recorded != cfg.format_warmup:
            raise ValueError(
                f"--format-warmup {cfg.format_warmup} on --resume: {out} has {', '.join(done)} from a run without "
                f"this warm-up (config.json: format_warmup {recorded!r}); a warm-up now would change the base under "
                f"them: resume without --format-warmup, or start a new run (another --out, or --force)"
            )
        log(
            f"warning: {summary_path(out)} is missing in a run that has {', '.join(done)}: the format warm-up is "
            f"redone from scratch (same seed, same warm-up; bit for bit on the same backend)"
        )
        return
    try:
        read_summary(out, cfg.format_warmup)
    except ValueError as e:
        raise ValueError(f"{e}: {hint}") from None
    path = out / CHECKPOINT_DIR
    if not path.is_dir():
        raise ValueError(f"{path} is missing, but {summary_path(out)} says the warm-up was saved: {hint}")
    mgr = ckpt.make_manager(str(path), max_to_keep=1)
    step = mgr.latest_step()
    if step != cfg.format_warmup:
        raise ValueError(
            f"{path} holds {'no complete step' if step is None else f'step {step}'}, not the "
            f"{cfg.format_warmup} steps asked: {hint}"
        )
    bad = ckpt.verify(ckpt.step_dir(mgr, step))
    if bad:
        raise ValueError(f"{path}: the saved format warm-up is damaged: {bad}: {hint}")


def examples_from(res, prefix: tuple[int, ...]) -> list[tuple[list[int], int, int]]:
    """``(prompt ids, state label code, menu size)`` of every decision of one compiled call (``res.device[0]``,
    :class:`jaxopt_marl.compiled_rollout.DecisionBuffers`): the prompt is ``prefix`` (the shared system turn)
    then the decision's own tokens, as the model saw it."""
    dec = jax.device_get(res.device[0].decisions)
    p = dec.prompt.shape[1]
    out = []
    for d in range(int(dec.count)):
        n = int(dec.prompt_len[d])
        out.append(([*prefix, *(int(t) for t in dec.prompt[d, p - n :])], int(dec.label[d]), int(dec.n_letters[d])))
    return out


def lora_projections(model) -> list[LoRALinear]:
    """Every :class:`lora.model.LoRALinear` of ``model`` that carries adapters, in graph order."""
    return [m for _, m in nnx.iter_graph(model) if isinstance(m, LoRALinear) and m.lora_a is not None]


def merge_adapter(model, index: int = 0) -> int:
    """Adds adapter ``index``'s delta to the frozen kernels in place: ``W <- W + scaling * A_i @ B_i`` for every
    LoRA projection (``W`` [..., in, out], ``A`` [..., N, in, r], ``B`` [..., N, r, out]; the leading axes are the
    stacked layers). The product and sum are formed in float32 at the highest matmul precision (no TF32) and cast
    to the kernel's dtype. The adapters are left as they are.

    Returns:
        The number of :class:`lora.model.LoRALinear` modules merged; a stacked module (one per projection name,
        all layers on its leading axis, :class:`lora.model.Decoder`) counts once, so SmolLM2 with the paper's
        four targets gives 4 for its 30 layers.

    Raises:
        ValueError: ``index`` is not an adapter of the model.
    """
    projs = lora_projections(model)
    for m in projs:
        a, b = m.lora_a[...], m.lora_b[...]
        n = a.shape[-3]
        if not 0 <= index < n:
            raise ValueError(f"adapter index {index} out of range: the model has {n} adapters")
        ai, bi = jnp.take(a, index, axis=a.ndim - 3), jnp.take(b, index, axis=b.ndim - 3)
        delta = m.scaling * jnp.einsum(
            "...ir,...ro->...io",
            ai.astype(jnp.float32),
            bi.astype(jnp.float32),
            precision=jax.lax.Precision.HIGHEST,
        )
        w = m.kernel[...]
        m.kernel[...] = (w.astype(jnp.float32) + delta).astype(w.dtype)
    return len(projs)


def _labels(game: str) -> tuple[str, ...]:
    return prompts.STATE_LABELS[prompts.family(game)]


def train(model, tok, game: str, examples, letter_ids, steps: int, seed: int, log=print) -> tuple[object, list]:
    """Step 3: ``steps`` supervised steps on adapter 0 of ``model`` (updated in place; no LoRA dropout).

    Only adapter 0 is differentiated and optimized (its gradient, the clip's norm and AdamW's two moments cover 1
    of the N stacked slices; the other slices enter as constants and keep their values bit for bit). Every step is
    bit-identical to optimizing the whole stack, where the other slices' gradients are zero: the same 30 losses
    and adapters on the tiny model (checked against commit 283398d).

    Args:
        examples: from :func:`examples_from`; those with an empty menu are left out.
        letter_ids: int32[26] the menu letters' token ids (``" A"`` .. ``" Z"``).
        seed: the run seed (:func:`jaxopt_marl.seeding.format_warmup_key` seeds the row and letter draws).
        log: called with one line per step.

    Returns:
        ``(letter counts int64[26] of the targets drawn, per-step rows [{"step", "loss"}])``; the loss is the
        batch's mean cross-entropy per answer token, in nats, before the step's update.

    Raises:
        ValueError: no example with a menu, or a tokenizer without an end-of-turn or EOS token.
    """
    examples = [e for e in examples if e[2] >= 1]
    if not examples:
        raise ValueError(f"{game}: the format warm-up's episodes gave no decision with a menu to learn from")
    end = _end_id(tok)
    # each label's answer ids up to the letter, tokenized once (the letter and the end of turn are one id each)
    heads = [answer_ids(tok, lab, letter_ids[0], end)[:-2] for lab in _labels(game)]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    width = -(-max(len(x) for x, _, _ in examples) // WIDTH_QUANTUM) * WIDTH_QUANTUM
    answer_width = max(len(h) for h in heads) + 2
    rng = np.random.default_rng(np.asarray(seeding.format_warmup_key(seed), np.uint32))
    graphdef, adapters, base = split_model(model)
    # only adapter 0 is a parameter here (every row runs on it): the optimizer state holds 1 of the N slices
    trained = _adapter0(adapters)
    opt = optax.chain(optax.clip_by_global_norm(MAX_GRAD_NORM), optax.adamw(LEARNING_RATE, weight_decay=0.0))
    opt_state = opt.init(trained)

    @jax.jit
    def step(trained, opt_state, adapters, base, pids, pmask, cids, cmask):
        def loss_fn(a0):
            m = nnx.merge(graphdef, _with_adapter0(adapters, a0), base)
            lp = sampling.continuation_logprobs(
                m, pids, pmask, cids, cmask, agent_ids=jnp.zeros(pids.shape[0], jnp.int32)
            )
            return -(lp * cmask).sum() / cmask.sum()

        loss, grads = jax.value_and_grad(loss_fn)(trained)
        updates, opt_state = opt.update(grads, opt_state, trained)
        return optax.apply_updates(trained, updates), opt_state, loss

    counts = np.zeros(len(menus.LETTERS), np.int64)
    rows = []
    for s in range(1, steps + 1):
        pick = rng.integers(0, len(examples), size=BATCH_ROWS)
        prompt_rows, answers = [], []
        for i in pick:
            ids, label, n_menu = examples[int(i)]
            j = int(rng.integers(0, n_menu))
            counts[j] += 1
            prompt_rows.append(ids)
            answers.append([*heads[label], int(letter_ids[j]), end])
        pid, pm = left_pad(prompt_rows, pad, BATCH_ROWS, width)
        cid = np.full((BATCH_ROWS, answer_width), pad, np.int32)
        cm = np.zeros((BATCH_ROWS, answer_width), bool)
        for r, x in enumerate(answers):
            cid[r, : len(x)], cm[r, : len(x)] = x, True
        trained, opt_state, loss = step(trained, opt_state, adapters, base, pid, pm, cid, cm)
        rows.append({"step": s, "loss": float(loss)})
        log(f"format warm-up step {s}/{steps}: loss {rows[-1]['loss']:.4f}")
    nnx.update(model, _with_adapter0(adapters, trained))
    return counts, rows


def run(cfg, roller, tok, out: Path, *, resume: bool = False, progress: bool = False, log=print) -> dict:
    """Steps 1-5 for the run ``cfg`` (:class:`jaxopt_marl.config.RunConfig`, ``format_warmup`` > 0) on the
    compiled ``roller`` (:class:`jaxopt_marl.compiled_rollout.CompiledRoller`)'s model, in place; on ``resume``
    with a saved warm-up (its summary present), :func:`apply_saved` instead. ``progress``: a bar over the
    frozen-base episodes. Returns the summary written to ``format_warmup.json``.

    Raises:
        ValueError: from :func:`train` (no decision to learn from, no end token) or :func:`apply_saved`.
    """
    out = Path(out)
    if resume and summary_path(out).exists():  # written after the checkpoint: both are whole
        apply_saved(roller.model, out)
        log(f"format warm-up: merged the saved adapter of {out / CHECKPOINT_DIR} into the base")
        return read_summary(out, cfg.format_warmup)
    model = roller.model
    _, init_adapters, _ = split_model(model)
    init_adapters = jax.tree.map(jnp.copy, init_adapters)
    t0 = time.perf_counter()
    k = cfg.magrpo.num_rollouts
    res = roller.collect(
        warmup_seeds(cfg.seed, k),
        seeding.format_warmup_key(cfg.seed),
        reference=True,
        progress=progress,
        desc="format warm-up episodes (frozen base)",
    )
    examples = examples_from(res, roller.prefix_ids)
    t1 = time.perf_counter()
    counts, losses = train(model, tok, cfg.game, examples, roller.letter_ids, cfg.format_warmup, cfg.seed, log=log)
    t2 = time.perf_counter()
    _, trained, _ = split_model(model)
    shutil.rmtree(out / CHECKPOINT_DIR, ignore_errors=True)  # a partial save of a killed run: orbax keeps a step
    save(trained, out, cfg)
    merged = merge_adapter(model, 0)
    nnx.update(model, init_adapters)
    summary = {
        "steps": cfg.format_warmup,
        "learning_rate": LEARNING_RATE,
        "batch_rows": BATCH_ROWS,
        "max_grad_norm": MAX_GRAD_NORM,
        "episodes": k,
        "env_seeds": warmup_seeds(cfg.seed, k),
        "examples": len(examples),
        "base_parse_counts": res.parse.as_dict(),
        "base_parse_fail_rate": res.parse.failure_rate,
        "target_letters": {menus.LETTERS[i]: int(c) for i, c in enumerate(counts) if c},
        "losses": losses,
        "projections_merged": merged,
        "collect_s": t1 - t0,
        "train_s": t2 - t1,
        "source": "jaxopt_marl.format_warmup (ours, not the paper; docs/runs/smollm2-format-warmup-cpu/)",
    }
    tmp = summary_path(out).with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    tmp.replace(summary_path(out))
    return summary


def _adapter0(adapters):
    """Adapter 0 alone, the adapter axis kept (length 1): every LoRA leaf is [..., N, in, r] or [..., N, r, out]."""
    return jax.tree.map(lambda x: x[..., :1, :, :], adapters)


def _with_adapter0(adapters, a0):
    """``adapters`` with slice 0 of the adapter axis replaced by ``a0`` (from :func:`_adapter0`'s layout); the
    other N - 1 slices enter as constants (no gradient flows to them)."""
    return jax.tree.map(
        lambda full, x: jnp.concatenate([x, jax.lax.stop_gradient(full[..., 1:, :, :])], axis=-3), adapters, a0
    )


def save(adapters, out: Path, cfg) -> None:
    """Writes the trained adapter 0 of ``adapters`` to ``out/format_warmup/`` (one orbax step = the step count;
    1/N of the adapters' size)."""
    from jaxopt_marl.config import lora_dict

    mgr = ckpt.make_manager(str(Path(out) / CHECKPOINT_DIR), max_to_keep=1)
    ckpt.save(mgr, cfg.format_warmup, _adapter0(adapters), None, meta={"lora": lora_dict(cfg.lora), "adapter": 0})


def verified_step(run_dir: Path) -> tuple[object, int]:
    """``(orbax manager, step)`` of a run's saved warm-up (``run_dir/format_warmup/``) once its newest step passes
    its checksums (:func:`lora.checkpoint.verify`); nothing is restored.

    Raises:
        FileNotFoundError: the run has no saved warm-up (no directory, or no complete step in it).
        ValueError: the step fails its checksums, naming the directory and the file.
    """
    path = Path(run_dir) / CHECKPOINT_DIR
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no saved format warm-up")
    mgr = ckpt.make_manager(str(path), max_to_keep=1)
    step = mgr.latest_step()
    if step is None:
        raise FileNotFoundError(f"{path}: no complete step of a saved format warm-up")
    bad = ckpt.verify(ckpt.step_dir(mgr, step))
    if bad:
        raise ValueError(f"{path}: the saved format warm-up is damaged: {bad}")
    return mgr, step


def load_saved(model, run_dir: Path):
    """The adapter state a run's saved warm-up (``run_dir/format_warmup/``) holds: ``model``'s adapter layout with
    the agent axis at length 1 (adapter 0 after the warm-up's last step). ``model`` is not changed.

    Raises:
        FileNotFoundError: the run has no saved warm-up (no directory, or no complete step in it).
        ValueError: a step that fails its checksums (:func:`lora.checkpoint.verify`), or that cannot be restored
            into this model (damaged data, another LoRA shape), naming the directory.
    """
    path = Path(run_dir) / CHECKPOINT_DIR
    mgr, step = verified_step(run_dir)
    _, adapters, _ = split_model(model)
    try:
        saved, _, _ = ckpt.restore(mgr, jax.tree.map(jnp.copy, _adapter0(adapters)), None, step)
    except (ValueError, KeyError, OSError) as e:
        raise ValueError(
            f"{path}: the saved format warm-up cannot be restored into this model: {ckpt.describe_error(e)}"
        ) from None
    return saved


def apply_saved(model, run_dir: Path) -> None:
    """Merges a run's saved warm-up (``run_dir/format_warmup/``, :func:`load_saved`) into ``model``'s base, in
    place, leaving its adapters as they were.

    Raises:
        FileNotFoundError, ValueError: as :func:`load_saved`.
    """
    saved = load_saved(model, run_dir)
    _, adapters, _ = split_model(model)
    keep = jax.tree.map(jnp.copy, adapters)
    nnx.update(model, jax.tree.map(lambda full, a0: full.at[..., :1, :, :].set(a0), keep, saved))
    merge_adapter(model, 0)
    nnx.update(model, keep)


__all__ = [
    "BATCH_ROWS",
    "CHECKPOINT_DIR",
    "LEARNING_RATE",
    "MAX_GRAD_NORM",
    "SUMMARY_FILE",
    "WARMUP_SEED0",
    "SUMMARY_KEYS",
    "TRAINED_FILES",
    "answer_ids",
    "apply_saved",
    "check_budget",
    "check_resume",
    "load_saved",
    "examples_from",
    "lora_projections",
    "merge_adapter",
    "read_summary",
    "run",
    "summary_path",
    "train",
    "verified_step",
]
