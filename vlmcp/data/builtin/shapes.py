"""Scenes of coloured shapes: sampling, rendering, and the captions that describe them.

A scene is a few shapes, each in its own cell of a ``grid x grid`` layout. The caption
lists the shapes in cell order (row-major), so it is a function of the image alone:
a model can only predict the colour, shape and position words by looking at the image.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vlmcp.data.builtin.config import ShapesConfig
from vlmcp.data.builtin.vocab import COLOURS, COLS, ROWS, SHAPES

__all__ = ["COLOUR_RGB", "SceneObject", "caption_words", "render", "sample_scene", "sentence_words"]

# RGB in [0, 1]; far apart so a 1-pixel-wide average still tells them apart.
COLOUR_RGB = {
    "red": (0.9, 0.1, 0.1), "green": (0.1, 0.8, 0.2), "blue": (0.15, 0.3, 0.95),
    "yellow": (0.95, 0.9, 0.1), "purple": (0.6, 0.2, 0.8), "white": (0.95, 0.95, 0.95),
}
_BACKGROUND = 0.05


@dataclass(frozen=True)
class SceneObject:
    """One shape of a scene.

    Attributes:
        colour: a name from :data:`vlmcp.data.builtin.vocab.COLOURS`.
        shape: a name from :data:`vlmcp.data.builtin.vocab.SHAPES`.
        cell: row-major cell index in ``[0, grid**2)``.
        scale: shape radius as a fraction of the half cell (its shorter side).
        offset: ``(dy, dx)`` shift of the shape centre, as a fraction of the half cell.
        tint: per-channel colour jitter added to the base colour.
    """

    colour: str
    shape: str
    cell: int
    scale: float
    offset: tuple[float, float]
    tint: tuple[float, float, float]


def sample_scene(cfg: ShapesConfig, rng: np.random.Generator) -> tuple[int, int, list[SceneObject]]:
    """Draw an image size and its shapes (sorted by cell).

    Returns:
        ``(height, width, objects)``.
    """
    sides = np.arange(cfg.min_image_size, cfg.max_image_size + 1, cfg.patch_size)
    height = int(rng.choice(sides))
    width = height if cfg.square_images else int(rng.choice(sides))
    count = int(rng.integers(1, cfg.max_objects + 1))
    cells = sorted(int(c) for c in rng.choice(cfg.grid ** 2, size=count, replace=False))
    objects = [
        SceneObject(colour=COLOURS[int(rng.integers(len(COLOURS)))],
                    shape=SHAPES[int(rng.integers(len(SHAPES)))], cell=cell,
                    scale=float(rng.uniform(0.6, 0.85)),
                    offset=(float(rng.uniform(-0.1, 0.1)), float(rng.uniform(-0.1, 0.1))),
                    tint=tuple(float(t) for t in rng.uniform(-0.05, 0.05, size=3)))
        for cell in cells]
    return height, width, objects


def _shape_mask(shape: str, u: torch.Tensor, v: torch.Tensor, s: float) -> torch.Tensor:
    """Pixels inside ``shape`` of radius ``s``; ``u``, ``v`` are cell coordinates in [-1, 1]."""
    au, av = u.abs(), v.abs()
    if shape == "circle":
        return u * u + v * v <= s * s
    if shape == "square":
        # Shrunk so its area is close to the circle's: size must not give the shape away.
        return torch.maximum(au, av) <= 0.85 * s
    if shape == "diamond":
        return au + av <= 1.05 * s
    if shape == "triangle":  # apex up; v grows downwards
        return (v >= -s) & (v <= s) & (au <= (v + s) / 2)
    if shape == "cross":
        return ((au <= s / 3) & (av <= s)) | ((av <= s / 3) & (au <= s))
    raise ValueError(f"unknown shape {shape!r}")


def render(cfg: ShapesConfig, height: int, width: int, objects: list[SceneObject]) -> torch.Tensor:
    """Draw a scene.

    Returns:
        ``FloatTensor[3, height, width]`` with values in [0, 1] (not normalised; that is
        the vision tower's business).
    """
    image = torch.full((3, height, width), _BACKGROUND)
    ys = torch.arange(height, dtype=torch.float32).view(-1, 1) + 0.5
    xs = torch.arange(width, dtype=torch.float32).view(1, -1) + 0.5
    half_h, half_w = height / cfg.grid / 2, width / cfg.grid / 2
    # One radius for both axes keeps a square square in a non-square image.
    radius = min(half_h, half_w)
    for obj in objects:
        row, col = divmod(obj.cell, cfg.grid)
        cy = (2 * row + 1 + obj.offset[0]) * half_h
        cx = (2 * col + 1 + obj.offset[1]) * half_w
        mask = _shape_mask(obj.shape, (xs - cx) / radius, (ys - cy) / radius, obj.scale)
        rgb = torch.tensor(COLOUR_RGB[obj.colour]) + torch.tensor(obj.tint)
        image = torch.where(mask, rgb.clamp(0, 1).view(3, 1, 1), image)
    return image


def caption_words(cfg: ShapesConfig, objects: list[SceneObject]) -> list[str]:
    """``a red circle top left and a blue square bottom right`` (cell order)."""
    words: list[str] = []
    for obj in objects:
        row, col = divmod(obj.cell, cfg.grid)
        words += (["and"] if words else []) + ["a", obj.colour, obj.shape,
                                               ROWS[cfg.grid][row], COLS[cfg.grid][col]]
    return words


def sentence_words(rng: np.random.Generator) -> list[str]:
    """A text-only sentence: ``the red circle is left of the blue square``."""
    relation = [["left", "of"], ["right", "of"], ["above"], ["below"]][int(rng.integers(4))]
    pick = lambda names: names[int(rng.integers(len(names)))]
    return ["the", pick(COLOURS), pick(SHAPES), "is", *relation, "the", pick(COLOURS), pick(SHAPES)]
