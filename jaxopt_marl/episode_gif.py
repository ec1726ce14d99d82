"""The run's ``episode.gif``: an evaluation episode's frames with a step counter, a caption and a colour legend.

The frames come from :meth:`jaxopt_marl.compiled_rollout.CompiledRoller.replay_frames` (the recorded primitive
actions of one evaluation episode re-played with the same env keys: exactly that episode, not a fresh sample).
Each GIF frame is the game's ``env.render`` picture with a header (``step t / T``: the picture shows the state
after env step t; then the caption) above it and a legend (every colour the renderer uses, with its meaning)
below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: Header text colour and background (RGB).
_INK, _PAPER = (20, 20, 20), (255, 255, 255)


def legend_for(env: Any) -> list[tuple[str, tuple[int, int, int]]]:
    """``[(label, rgb)]`` of every colour ``env.render`` paints, in palette order: the env's own ``legend()``.

    Melting Pot games (:meth:`envs_jax.meltingpot.MeltingPotEnv.legend`: ``PALETTE_BASE`` / ``PALETTE_AGENTS``):
    floor, wall, river, dirt, grass, apple, then agent i's colour as ``a<i>``. Overcooked
    (:meth:`envs_jax.overcooked.Overcooked.legend`: ``PALETTE``): floor, counter, dispensers, serving, pot states,
    items, agents and the black facing mark.

    Raises:
        ValueError: ``env`` has no ``legend`` (no palette known).
    """
    if not callable(getattr(env, "legend", None)):
        raise ValueError(f"legend_for: no palette known for {type(env).__name__}")
    return env.legend()


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: the fixed bitmap font
        return ImageFont.load_default()


def annotate_frames(frames: np.ndarray, legend: Sequence[tuple[str, tuple[int, int, int]]], caption: str) -> np.ndarray:
    """Frames with a header (first line ``step t / T``, then ``caption``, wrapped) and a legend panel.

    Args:
        frames: uint8[T, H, W, 3] rendered states, frame t after env step t + 1.
        legend: ``[(label, rgb)]`` (:func:`legend_for`).
        caption: one line naming the episode (whose, which seed, how it was obtained).

    Returns:
        uint8[T, H + header + legend, max(W, min width), 3].

    Raises:
        ValueError: ``frames`` is not uint8[T, H, W, 3] with T >= 1.
    """
    from PIL import Image, ImageDraw

    f = np.asarray(frames)
    if f.dtype != np.uint8 or f.ndim != 4 or f.shape[-1] != 3 or f.shape[0] < 1:
        raise ValueError(f"annotate_frames: frames must be uint8[T, H, W, 3], got {f.dtype} {f.shape}")
    t_max, h, w = f.shape[:3]
    font = _font(11)
    width = max(w, 320)
    sw, row_h, pad = 10, 15, 4
    # Legend layout: entries left to right, wrapping at the width.
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    cells, x, y = [], pad, 0
    for label, rgb in legend:
        tw = int(probe.textlength(label, font=font))
        cw = sw + 4 + tw + 10
        if x + cw > width - pad and x > pad:
            x, y = pad, y + row_h
        cells.append((x, y, label, rgb))
        x += cw
    legend_h = y + row_h + 2 * pad
    lines = [""]
    for word in caption.split():  # the caption, wrapped at the width
        trial = f"{lines[-1]} {word}".strip()
        if lines[-1] and probe.textlength(trial, font=font) > width - 2 * pad:
            lines.append(word)
        else:
            lines[-1] = trial
    header_h = (len(lines) + 1) * row_h + pad
    base = Image.new("RGB", (width, header_h + h + legend_h), _PAPER)
    draw = ImageDraw.Draw(base)
    for k, line in enumerate(lines):  # the first header line is the step counter's
        draw.text((pad, pad // 2 + (k + 1) * row_h), line, fill=_INK, font=font)
    top = header_h + h + pad
    for x, y, label, rgb in cells:
        draw.rectangle([x, top + y + 2, x + sw, top + y + 2 + sw], fill=rgb, outline=(0, 0, 0))
        draw.text((x + sw + 4, top + y), label, fill=_INK, font=font)
    out = np.empty((t_max, base.height, width, 3), np.uint8)
    for t in range(t_max):
        im = base.copy()
        d = ImageDraw.Draw(im)
        d.text((pad, pad // 2), f"step {t + 1} / {t_max}", fill=_INK, font=font)
        im.paste(Image.fromarray(f[t]), ((width - w) // 2, header_h))
        out[t] = np.asarray(im)
    return out


def write_episode_gif(frames: np.ndarray, path: str | Path, env: Any, caption: str, fps: float = 8.0) -> Path:
    """:func:`annotate_frames` with :func:`legend_for` ``(env)``, written by ``envs_jax.render.write_gif``."""
    from envs_jax.render import write_gif

    return write_gif(annotate_frames(frames, legend_for(env), caption), path, fps=fps)


def gif_caption(seed: int, policy: str = "trained adapters") -> str:
    """The caption of the run's GIF: whose episode, which seed, how the frames were obtained."""
    return f"{policy}, evaluation episode 0 (seed {seed}), replayed from its recorded actions"


def write_eval_gif(
    roller,
    env: Any,
    game: str,
    seed: int,
    key,
    actions: np.ndarray,
    checkpoint_round: int | None,
    path: str | Path,
    policy: str | None = None,
) -> Path:
    """The run's ``episode.gif``: the first evaluation episode (``eval.json``'s episode 0, ``seed``) replayed from
    its recorded primitive actions (int32[T, N]) with the same env keys
    (:meth:`jaxopt_marl.compiled_rollout.CompiledRoller.replay_frames`) and rendered, with a step counter, a
    caption and a colour legend, at 8 frames per second. ``policy``: the caption's name of the policy (default
    ``trained adapters of round <checkpoint_round>``)."""
    return write_episode_gif(
        roller.replay_frames(seed, key, actions),
        path,
        env,
        f"{game}: " + gif_caption(seed, policy or f"trained adapters of round {checkpoint_round}"),
        fps=8,
    )


__all__ = ["annotate_frames", "gif_caption", "legend_for", "write_episode_gif", "write_eval_gif"]
