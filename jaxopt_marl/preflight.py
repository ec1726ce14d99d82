"""The checks a run makes before any compute and before anything in its run directory is written or deleted.

Each raises :class:`jaxopt_marl.errors.InputError` with one line naming the file or value and the cause (the
command line prints it as ``error: ...`` and exits with status 2, :mod:`experiments.cli`):

- :func:`check_model`: the model path holds weights (a GGUF whose header and tensor table fit the file, or an HF
  dir whose safetensors headers fit their sizes);
- :func:`check_out_dir`: ``--out`` is a directory or can be created;
- :func:`prepare_run_dir`: ``--resume`` / ``--force`` against the run directory: on ``--resume`` the stored
  ``config.json`` is compared with the given flags (:func:`resume_differences`, every differing key named) and
  the newest intact checkpoint is found (:func:`check_checkpoint`; one written with other LoRA settings is named
  as such, not as corrupt); nothing is deleted here (``--force`` deletes the old run only after every check of
  :func:`jaxopt_marl.pipeline.run` has passed, :func:`clear_run_dir`);
- :func:`check_resume_guards`: the JSON syntax of a reused ``guards.jsonl``;
- :func:`check_library`, :func:`check_stats`: the game's option library and scipy are importable.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from jaxopt_marl.config import (
    DEFAULT_MODEL_NAME,
    RESUME_MAY_DIFFER,
    TINY_RANDOM,
    RunConfig,
    lora_differences,
)
from jaxopt_marl.errors import InputError


def check_model(model: str | None) -> None:
    """A model path must hold weights: a GGUF file whose header, tensor table and tensor sizes fit its metadata
    and the file's size (:func:`lora.gguf_loader.check_gguf`, milliseconds: a truncated file is caught here,
    not when the weights are read), or an HF dir with config.json and *.safetensors whose headers fit their
    sizes (:func:`lora.hf_loader.check_safetensors`) and a config.json the loader can map
    (:func:`lora.hf_loader.read_hf_config`: its shape and field types).

    Raises:
        InputError: naming the path and the cause (missing, not .gguf, no weights, truncated, misshapen).
    """
    if model == TINY_RANDOM:
        return
    from lora import gguf_loader

    if model is None:
        try:
            model = gguf_loader.default_gguf_path()
        except FileNotFoundError as e:
            raise InputError(str(e)) from None
    p = Path(model)
    if p.is_dir():
        if not (p / "config.json").exists() or not any(p.glob("*.safetensors")):
            raise InputError(f"model directory {model} has no weights (needs config.json and *.safetensors)")
        from lora.hf_loader import check_safetensors, read_hf_config

        for shard in sorted(p.glob("*.safetensors")):
            try:
                check_safetensors(str(shard))
            except (ValueError, OSError) as e:
                raise InputError(f"model {e}") from None
        try:
            read_hf_config(str(p))  # config.json only: its shape and types, no weights read
        except (ValueError, OSError) as e:
            raise InputError(f"model {e}") from None
    elif p.is_file():
        if p.suffix != ".gguf":
            raise InputError(f"model file {model} is not a .gguf file")
        try:
            gguf_loader.check_gguf(str(p))
        except (ValueError, OSError) as e:
            raise InputError(f"model {e}") from None
    else:
        raise InputError(f"model path {model} does not exist")


def check_out_dir(out: Path) -> None:
    """InputError unless ``out`` is a directory or can be created (its nearest existing parent is a writable
    directory): found before any compute, not when the first file is written."""
    if out.exists():
        if not out.is_dir():
            raise InputError(f"--out {out} exists and is not a directory")
        if not os.access(out, os.W_OK | os.X_OK):
            raise InputError(f"--out {out} is not writable")
        return
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"--out {out} cannot be created: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"--out {out} cannot be created: {parent} is not writable")


def _meta_dicts(meta: Path) -> list[dict]:
    """The JSON objects under a checkpoint step's ``meta/`` (orbax's JsonSave file)."""
    files = list(meta.rglob("*")) if meta.exists() else []
    data = [
        json.loads(f.read_text())
        for f in files
        if f.is_file() and f.suffix in ("", ".json") and f.stat().st_size < 1 << 20
    ]
    return [d for d in data if isinstance(d, dict)]


def lora_mismatch(where: str, stored: dict, cfg: RunConfig) -> str | None:
    """One line naming every LoRA key (``lora_rank``, ``lora_alpha``, ...) where a checkpoint's meta ``lora``
    differs from ``cfg.lora``, or None when they agree."""
    diff = lora_differences(stored, cfg.lora)
    if not diff:
        return None
    keys = "; ".join(f"{k}: {json.dumps(a)} in the checkpoint, {json.dumps(b)} given" for k, (a, b) in diff.items())
    return (
        f"{where} holds adapters of other LoRA settings ({keys}); give the run's original flags "
        f"(e.g. --lora-rank {stored.get('rank')}) or a new --out"
    )


def check_checkpoint(run_dir: Path, warn=None, cfg: RunConfig | None = None) -> int | None:
    """The newest intact checkpoint of ``run_dir`` (its step = completed rounds; None if there is none), found
    before any compute; InputError if every checkpoint is corrupt.

    A step is intact here if its files match its ``checksums.json`` (:func:`lora.checkpoint.verify`), its meta
    holds the round number and its adapters and opt_state exist. Each corrupt step, newest first, is reported
    through ``warn`` (default: a ``warning: ...`` line on stderr) naming the step, the round and the file; the
    trainer's restore then falls back to the same step (:meth:`jaxopt_marl.trainer.Trainer.restore`).

    With ``cfg``, an intact step whose meta ``lora`` (the adapters' LoRA config) differs from ``cfg.lora`` is an
    InputError naming each differing key (``lora_rank``, ...): another rank is not a corrupt checkpoint.
    """
    from lora import checkpoint as ckpt

    warn = warn or (lambda m: print(f"warning: {m}", file=sys.stderr))
    ck = run_dir / "checkpoints"
    if not ck.exists():
        return None
    steps = sorted((int(d.name) for d in ck.iterdir() if d.is_dir() and d.name.isdigit()), reverse=True)
    if not steps:
        return None
    bad = []
    for step in steps:
        last = ck / str(step)
        meta = last / "meta"
        try:
            problem = ckpt.verify(last)
            if problem is not None:
                raise ValueError(problem)
            data = _meta_dicts(meta)
            if not any("round" in d for d in data):
                raise ValueError(f"{meta}: no readable meta with the round number")
            if not (last / "adapters").exists() or not (last / "opt_state").exists():
                raise ValueError(f"{last}: adapters or opt_state missing")
        except (ValueError, OSError, UnicodeDecodeError) as e:
            bad.append(f"checkpoint {last} is corrupt: {e}")
            older = [s for s in steps if s < step]
            warn(
                f"checkpoint {step} (after round {step - 1}) is corrupt: {e}; "
                + (f"trying checkpoint {older[0]}" if older else "no older checkpoint is left")
            )
            continue
        stored = next((d["lora"] for d in data if isinstance(d.get("lora"), dict)), None)
        if cfg is not None and stored is not None:
            msg = lora_mismatch(f"checkpoint {last}", stored, cfg)
            if msg:
                raise InputError(f"--resume: {msg}")
        return step
    raise InputError("; ".join(bad) + f"; no intact checkpoint in {ck} to resume from (use --force to start over)")


def prepare_run_dir(cfg: RunConfig, out: Path, resume: bool, force: bool, warn=None) -> int | None:
    """Validates ``out`` against ``--resume`` / ``--force`` (before any compute); returns the checkpoint round
    (the newest intact one; ``warn`` receives a line per corrupt newer one, :func:`check_checkpoint`).

    Deletes nothing: with ``force`` an existing run is deleted by :func:`clear_run_dir` once every other check
    has passed (a bad input then leaves the old run intact).
    """
    exists = out.exists() and any(out.iterdir())
    if resume and force:
        raise InputError("--resume and --force exclude each other")
    if resume:
        if not exists:
            raise InputError(f"--resume: run directory {out} does not exist")
        conf = out / "config.json"
        if not conf.exists():
            raise InputError(f"--resume: {conf} is missing")
        try:
            old = json.loads(conf.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"--resume: {conf} is unreadable ({type(e).__name__}: {e})") from None
        if not isinstance(old, dict):
            raise InputError(f"--resume: {conf} is not a JSON object")
        if old.get("game") != cfg.game:
            raise InputError(f"--resume: {out} is a {old.get('game')} run, not {cfg.game}")
        check_resume_config(old, cfg, conf)
        return check_checkpoint(out, warn, cfg)
    if exists and not force:
        raise InputError(f"run directory {out} exists; pass --resume to continue it or --force to overwrite it")
    return None


def clear_run_dir(out: Path) -> None:
    """``--force``: deletes an existing run directory (called after every check has passed)."""
    if out.exists() and any(out.iterdir()):
        shutil.rmtree(out)


def resume_differences(old: dict, cfg: RunConfig) -> dict[str, tuple]:
    """``{key: (value in config.json, value given)}`` for every key of ``cfg.flat_dict()`` whose value differs
    from ``old`` (a run's ``config.json``), except :data:`~jaxopt_marl.config.RESUME_MAY_DIFFER`. Keys that
    ``old`` lacks (written before that field existed) are not compared; values are compared as JSON spells them
    (tuples as lists). The LoRA settings are keys of their own (``lora_rank``, ``lora_alpha``, ...)."""
    new = json.loads(json.dumps(cfg.flat_dict()))
    return {k: (old[k], v) for k, v in new.items() if k not in RESUME_MAY_DIFFER and k in old and old[k] != v}


def check_resume_config(old: dict, cfg: RunConfig, conf: Path) -> None:
    """InputError naming every key (both values) where ``cfg`` differs from the run's ``config.json``."""
    diff = resume_differences(old, cfg)
    if diff:
        keys = "; ".join(f"{k}: {json.dumps(a)} in config.json, {json.dumps(b)} given" for k, (a, b) in diff.items())
        raise InputError(
            f"--resume: the flags differ from {conf} in {len(diff)} key(s): {keys}. Give the run's "
            f"original flags (on --resume only {', '.join(sorted(RESUME_MAY_DIFFER))} may change) or "
            f"a new --out"
        )


def guards_hint(guard_path: Path) -> str:
    return f"delete {guard_path} to redo the burn-in and guard synthesis, or start again with --force"


def check_resume_guards(out: Path) -> None:
    """On ``--resume``, the JSON syntax of ``out/guards.jsonl`` (reused when ``burnin/burnin.json`` exists), read
    before JAX and the games are imported: a truncated or garbled file fails in about a second. The guards'
    contents (options, features, values) are checked when they are loaded against the option library (step 0a
    of :func:`jaxopt_marl.pipeline.run`), still before the model and any compute. The option names are also
    checked here, against the library's options that ``burnin.json`` lists (``guards_per_option``, every option of
    the library that mined the guards; :class:`jaxopt_marl.burnin.BurninSummary`), so that a guard of an unknown
    option fails before the games are imported too (importing them costs 5-8 s on 2 cores).

    Raises:
        InputError: ``--resume: <file>:<line>: malformed JSON (...)`` (or unreadable), or ``unknown option``,
            with what to do.
    """
    guard_path = out / "guards.jsonl"
    burnin_path = out / "burnin" / "burnin.json"
    if not (burnin_path.exists() and guard_path.exists()):
        return
    try:
        listed = json.loads(burnin_path.read_text()).get("guards_per_option")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        listed = None  # burnin.json itself is checked where the run reads it
    known = set(listed) if isinstance(listed, dict) and listed else None
    try:
        lines = guard_path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(
            f"--resume: {guard_path} is unreadable ({type(e).__name__}: {e}) ({guards_hint(guard_path)})"
        ) from None
    for lineno, line in enumerate(lines, start=1):
        if line.strip():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(
                    f"--resume: {guard_path}:{lineno}: malformed JSON ({e.msg}): "
                    f"{line.strip()[:80]!r} ({guards_hint(guard_path)})"
                ) from None
            opt = obj.get("opt") if isinstance(obj, dict) else None
            if known is not None and isinstance(opt, str) and opt not in known:
                raise InputError(f"--resume: {guard_path}:{lineno}: unknown option {opt!r} ({guards_hint(guard_path)})")


def check_stats() -> None:
    """InputError unless scipy (the evaluation's statistics, :mod:`jaxopt_marl.stats`) is importable and new
    enough: found before any compute, not after the training rounds."""
    try:
        from jaxopt_marl import stats

        stats.check_scipy()
    except ImportError as e:
        raise InputError(f"the evaluation statistics need scipy: {e}") from None


def check_library(game: str) -> None:
    """InputError unless the option library of ``game`` is importable (naming the missing module)."""
    from jaxopt_marl import options

    if not options.available(game):
        try:
            options.get_library(game)
        except options.LibraryNotAvailable as e:
            raise InputError(str(e)) from None


__all__ = [
    "DEFAULT_MODEL_NAME",
    "check_checkpoint",
    "check_library",
    "check_model",
    "check_out_dir",
    "check_resume_config",
    "check_resume_guards",
    "check_stats",
    "clear_run_dir",
    "guards_hint",
    "lora_mismatch",
    "prepare_run_dir",
    "resume_differences",
]
