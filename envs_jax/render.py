"""Rendering helpers shared by the games: palette lookup, upscaling, GIF writing."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import jax.numpy as jnp
import numpy as np


def paint(codes: jnp.ndarray, palette: jnp.ndarray, cell_px: int) -> jnp.ndarray:
    """Paints an integer cell-code grid with a palette, each cell ``cell_px`` pixels square.

    Args:
        codes: int32[H, W] cell codes in ``[0, len(palette))``.
        palette: uint8[C, 3] colour per code.
        cell_px: pixels per cell side (static).

    Returns:
        uint8[H * cell_px, W * cell_px, 3].
    """
    rgb = palette[codes]
    return jnp.repeat(jnp.repeat(rgb, cell_px, axis=0), cell_px, axis=1).astype(jnp.uint8)


def write_gif(frames: Iterable[np.ndarray], path: str | Path, fps: float = 8.0) -> Path:
    """Writes RGB frames (each uint8[H, W, 3]) to an animated GIF (via imageio) and returns its path.

    Raises:
        ValueError: no frames, or a frame that is not uint8[H, W, 3].
    """
    import imageio.v3 as iio

    arr = [np.asarray(f) for f in frames]
    if not arr:
        raise ValueError(f"write_gif({str(path)!r}): no frames given")
    for i, f in enumerate(arr):
        if f.dtype != np.uint8 or f.ndim != 3 or f.shape[-1] != 3:
            raise ValueError(f"write_gif: frame {i} has dtype {f.dtype} shape {f.shape}; want uint8[H, W, 3]")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, np.stack(arr), duration=1000.0 / fps, loop=0)
    return path
