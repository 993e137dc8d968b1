"""Moving shapes: short clips whose captions say where each shape goes ("a red square moves left").

A clip has one or two shapes, each in its own lane, crossing the frame in a straight line
(left, right, up or down; in a two-shape clip both move along the same axis)::

    frame 0        frame 3        frame 7        "a red square moves right and a blue circle moves left"
    [#      o]     [  #  o  ]     [o      #]

The caption lists the shapes lane by lane (top to bottom, or left to right), so it is a
function of the frames alone, and only the order of the frames tells "moves left" from
"moves right": a model must compare frames, not look at one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vlmcp.data.builtin.shapes import _BACKGROUND, COLOUR_RGB, _shape_mask
from vlmcp.data.builtin.vocab import COLOURS, SHAPES

__all__ = ["MOTIONS", "Clip", "motion_clip"]

MOTIONS = {"left": (0, -1), "right": (0, 1), "up": (-1, 0), "down": (1, 0)}
"""Each motion word and its ``(dy, dx)`` direction."""


@dataclass(frozen=True, eq=False)
class Clip:
    """One clip.

    Attributes:
        frames: ``FloatTensor[n, 3, H, W]`` in [0, 1].
        caption: ``a red square moves left`` (``and a ...`` for a second shape).
    """

    frames: torch.Tensor
    caption: str


def motion_clip(seed: int, index: int, *, frames: int = 8, height: int = 64, width: int = 64) -> Clip:
    """Clip ``index`` of the stream seeded by ``seed`` (a pure function of both).

    Args:
        seed: the stream's seed.
        index: which clip.
        frames: frames of the clip (>= 2).
        height: frame height in pixels.
        width: frame width in pixels.
    """
    if frames < 2:
        raise ValueError(f"a clip needs at least 2 frames, got {frames}")
    rng = np.random.default_rng([seed, index, 1])  # images use [seed, index]: another stream
    count = int(rng.integers(1, 3))
    vertical = bool(rng.integers(2))
    colours = rng.choice(len(COLOURS), size=count, replace=False)
    radius = min(height, width) / 8
    ys = torch.arange(height, dtype=torch.float32).view(-1, 1) + 0.5
    xs = torch.arange(width, dtype=torch.float32).view(1, -1) + 0.5
    video = torch.full((frames, 3, height, width), _BACKGROUND)
    words: list[str] = []
    for lane in range(count):
        motion = ("up", "down")[int(rng.integers(2))] if vertical else ("left", "right")[int(rng.integers(2))]
        shape, colour = SHAPES[int(rng.integers(len(SHAPES)))], COLOURS[int(colours[lane])]
        scale = float(rng.uniform(0.7, 0.9))
        across = (lane + 0.5) / count + float(rng.uniform(-0.05, 0.05))  # the lane, as a fraction
        dy, dx = MOTIONS[motion]
        rgb = torch.tensor(COLOUR_RGB[colour]).view(3, 1, 1)
        for k in range(frames):
            along = 0.5 + 0.3 * (2 * k / (frames - 1) - 1) * (dy or dx)  # 0.2 -> 0.8 or back
            cy, cx = (along * height, across * width) if vertical else (across * height, along * width)
            mask = _shape_mask(shape, (xs - cx) / radius, (ys - cy) / radius, scale)
            video[k] = torch.where(mask, rgb, video[k])
        words += (["and"] if words else []) + ["a", colour, shape, "moves", motion]
    return Clip(frames=video, caption=" ".join(words))
