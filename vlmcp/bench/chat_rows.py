"""Synthetic chat-layout rows: the sample mix the interleaved-layout balance figures are measured on.

Samples are drawn as in issue 9's benchmark and packed in order into rows of at most
``row_tokens`` tokens (a sample that does not fit opens the next row)::

    share   sample
    20%     text only, lognormal(6.5, 1.0) tokens
    55%     one image of 16-1,280 tokens
    15%     2-4 images of 16-600 tokens, 3-12 text tokens between them
    10%     a video run of 2,000-8,000 tokens

Every sample with images starts with a 12-40-token prompt and ends with an answer of
lognormal(5.5, 1.1) tokens, capped at 4,000.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["chat_rows", "chat_sample"]


def chat_sample(rng: np.random.Generator, max_tokens: int) -> list[tuple[bool, int]]:
    """One sample as ``[(is_image, length), ...]`` pieces in order (at most ``max_tokens``)."""
    kind = rng.choice(4, p=[0.20, 0.55, 0.15, 0.10])
    if kind == 0:
        return [(False, int(min(max(1, round(rng.lognormal(6.5, 1.0))), max_tokens)))]
    pieces = [(False, int(rng.integers(12, 41)))]
    if kind == 1:
        pieces.append((True, int(rng.integers(16, 1281))))
    elif kind == 2:
        for i in range(int(rng.integers(2, 5))):
            if i:
                pieces.append((False, int(rng.integers(3, 13))))
            pieces.append((True, int(rng.integers(16, 601))))
    else:
        pieces.append((True, int(rng.integers(2000, 8001))))
    pieces.append((False, int(min(max(1, round(rng.lognormal(5.5, 1.1))), 4000))))
    while sum(n for _, n in pieces) > max_tokens:  # only a long answer can overflow: trim it
        pieces[-1] = (False, pieces[-1][1] - (sum(n for _, n in pieces) - max_tokens))
    return pieces


def chat_rows(num_rows: int, row_tokens: int = 32768, seed: int = 0):
    """``num_rows`` packed rows as ``(is_image BoolTensor[L], cu_seqlens LongTensor[S+1])``."""
    rng = np.random.default_rng(seed)
    rows, pending = [], None
    while len(rows) < num_rows:
        pieces, lens, used = [], [], 0
        while True:
            sample = pending if pending is not None else chat_sample(rng, row_tokens)
            n = sum(k for _, k in sample)
            if used + n > row_tokens:
                pending = sample
                break
            pending = None
            pieces += sample
            lens.append(n)
            used += n
        is_image = torch.cat([torch.full((n,), img) for img, n in pieces])
        rows.append((is_image, torch.tensor([0, *np.cumsum(lens).tolist()])))
    return rows
