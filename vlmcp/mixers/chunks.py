"""A packed row of independent segments, tiled into fixed-size chunks (the chunked kernels' layout).

Both chunked kernels (:mod:`.delta_rule`, :mod:`.ssd`) run a row of segments back to back
(``cu_seqlens``), each padded to whole chunks with zero rows: a zero row is the identity
step of either recurrence (zero decay in log space, zero input). A chunk never spans two
segments, so a sequential scan over chunks resets at each segment's first chunk and reads
its final state at its last::

    cu_seqlens [0, 5, 5, 12], chunk 4:   seg 0: [t0 t1 t2 t3] [t4 .  .  . ]
                                         seg 1: (empty: no chunk)
                                         seg 2: [t5 t6 t7 t8] [t9 t10 t11 .]
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

__all__ = ["chunk_layout", "from_chunks", "to_chunks"]


def chunk_layout(cu: torch.Tensor, chunk: int) -> tuple[torch.Tensor, ...]:
    """Per chunk of the packed row: its segment, whether it is the segment's first/last, its token rows.

    Args:
        cu: ``LongTensor[S+1]`` (CPU), segment boundaries; empty segments allowed.
        chunk: tokens per chunk.

    Returns:
        ``(seg (C,), first (C,), last (C,), rows (C, chunk))``; ``rows`` holds token indices,
        ``T = cu[-1]`` (a zero row, :func:`to_chunks`) past a segment's end.
    """
    lens = cu[1:] - cu[:-1]
    n = (lens + chunk - 1) // chunk
    seg = torch.repeat_interleave(torch.arange(lens.numel()), n)
    start_chunk = torch.cumsum(n, 0) - n
    within = torch.arange(seg.numel()) - start_chunk[seg]
    rows = (cu[:-1][seg] + within * chunk)[:, None] + torch.arange(chunk)[None]
    rows = torch.where(rows < cu[1:][seg][:, None], rows, int(cu[-1]))
    return seg, within == 0, within == n[seg] - 1, rows


def to_chunks(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``x (T, *)`` -> ``(C, chunk, *)`` by :func:`chunk_layout`'s ``rows``; zero past each segment's end."""
    padded = F.pad(x, (0, 0) * (x.dim() - 1) + (0, 1))
    return padded[rows.to(x.device)]


def from_chunks(y: torch.Tensor, rows: torch.Tensor, T: int) -> torch.Tensor:
    """``y (C, chunk, *)`` -> ``(T, *)``: the real tokens' rows, in row order (undoes :func:`to_chunks`)."""
    flat = y.reshape(rows.numel(), *y.shape[2:])
    return flat[(rows.flatten() < T).to(y.device)]
