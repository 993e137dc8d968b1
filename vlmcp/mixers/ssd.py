"""Mamba-2's SSD scan, chunked, in torch: packed segments, initial and final states, affine maps.

Note [vlmcp SSD: a segment is an affine map of its incoming state]
------------------------------------------------------------------
Per head h (``A_h < 0`` a scalar, Mamba-2's) the state ``S`` is ``(P, N)`` (head dim x state
dim) and token t updates and reads it as (transformers' ``mamba2_chunk_scan``; ``dt_t`` after
softplus and clamp, ``B_t``, ``C_t`` of the head's group)::

    S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T          y_t = S_t C_t     (+ D_h x_t, the caller's)

Each step is affine in the state with a *scalar* decay, so a segment of n tokens is::

    S_out = exp(a) S_in + U           a = sum_t dt_t A_h (log space),  U = S_out from S_in = 0
    y_t   = y0_t + exp(a_t) S_in C_t  a_t = the same sum up to t (inclusive), y0_t = y_t from S_in = 0

One zero-state pass of the chunked kernel gives all of it: ``y0``, ``U`` (the final state),
and ``a_t`` (:func:`chunk_ssd` returns the log decays). The map of a segment is
``H x (1 + P N)`` numbers, ``[a | U]``, whatever its length.

The chunked kernel is transformers' (the SSD "dual form": within a chunk of Q tokens a
masked ``(C B^T) * exp(segsum)`` attention-like product, across chunks a scan of the states)
on a packed row of independent segments (:mod:`.chunks`), each padded to whole chunks with
zero rows (``dt = 0``: decay 1, no input: the identity step). Every decay stays in log space
until a difference of two sums within a segment is exponentiated (``exp(a_l - a_s) <= 1``); the
per-token ``a_t`` is the segment's own running sum (chunk totals accumulated from the segment
start, never a difference of row-wide cumulative sums, which would lose float32 digits far
into a long row). State, products and sums accumulate in float32 at least
(:func:`~vlmcp.attention.merge.accumulator_dtype`), as transformers' torch path does.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from vlmcp.attention.merge import accumulator_dtype
from vlmcp.mixers.chunks import chunk_layout, from_chunks, to_chunks

__all__ = ["SSDMaps", "chunk_ssd", "ssd_segment_maps"]


def chunk_ssd(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    cu_seqlens: torch.Tensor, initial_state: torch.Tensor | None = None, *, chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The SSD scan on a packed row of independent segments (Note above); no ``D`` skip term.

    Args:
        x: ``(T, H, P)``, the scan's input (after the causal conv and its activation).
        dt: ``(T, H)``, time steps after softplus and clamp (``>= 0``).
        A: ``(H,)``, the per-head decay rate (``-exp(A_log)``, ``< 0``).
        B, C: ``(T, G, N)``, ``H % G == 0`` (head h reads group ``h // (H / G)``).
        cu_seqlens: ``LongTensor[S+1]`` (CPU), segment boundaries; empty segments allowed.
        initial_state: ``(S, H, P, N)`` per segment, or None for zeros.
        chunk_size: tokens per chunk (the result does not depend on it).

    Returns:
        ``(y (T, H, P), final_state (S, H, P, N), log_decay (T, H))``, all in
        :func:`accumulator_dtype`; ``log_decay`` is ``a_t``, the segment's inclusive running sum
        of ``dt A``. Differentiable in every tensor input.
    """
    T, H, Pd = x.shape
    G, N = B.shape[1:]
    if H % G or tuple(C.shape) != tuple(B.shape) or tuple(dt.shape) != (T, H) or B.shape[0] != T:
        raise ValueError(f"chunk_ssd: x {tuple(x.shape)}, dt {tuple(dt.shape)}, B {tuple(B.shape)}, C "
                         f"{tuple(C.shape)}: need dt (T, H), B and C (T, G, N) with H a multiple of G")
    acc = accumulator_dtype(x.dtype)
    cu = cu_seqlens.to("cpu", torch.long)
    S = cu.numel() - 1
    state0 = (x.new_zeros((S, H, Pd, N), dtype=acc) if initial_state is None else initial_state.to(acc))
    seg, first, last, rows = chunk_layout(cu, chunk_size)
    if seg.numel() == 0:
        return x.new_zeros((T, H, Pd), dtype=acc), state0, x.new_zeros((T, H), dtype=acc)
    B, C = (t.to(acc).repeat_interleave(H // G, dim=1, output_size=H) for t in (B, C))
    dt = dt.to(acc)
    a = dt * A.to(acc)
    xdt = x.to(acc) * dt[..., None]
    # (T, H, *) -> (H, chunks, Q, *); zero rows past each segment's end
    xc, ac, Bc, Cc = (to_chunks(t, rows).movedim(2, 0) for t in (xdt, a, B, C))
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).triu(1)
    cum = ac.cumsum(-1)  # (H, chunks, Q): log decay from the chunk start, inclusive
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()
    y_diag = ((Cc @ Bc.transpose(-1, -2)) * decay) @ xc  # within each chunk, from a zero state
    # each chunk's own contribution to the state at its end: sum_s exp(a_Q - a_s) x_s dt_s B_s^T
    contrib = (xc * (cum[..., -1:] - cum).exp()[..., None]).transpose(-1, -2) @ Bc  # (H, chunks, P, N)
    c_read = Cc * cum.exp()[..., None]  # reads the chunk's incoming state, decayed to each token
    chunk_total = cum[..., -1]  # (H, chunks)

    inits = state0.unbind(0)
    finals = list(inits)
    outs, offsets = [], []
    state = offset = None
    first_l, last_l, seg_l = first.tolist(), last.tolist(), seg.tolist()
    # per-chunk views by one unbind each: indexing chunk c in the loop would make backward write a
    # full-size zero gradient per chunk (quadratic in the number of chunks)
    per_chunk = zip(*(t.unbind(1) for t in (c_read, contrib, chunk_total)), strict=True)
    for c, (cr, ct, tot) in enumerate(per_chunk):
        if first_l[c]:
            state, offset = inits[seg_l[c]], tot.new_zeros(H)
        outs.append(cr @ state.transpose(-1, -2))  # (H, Q, P)
        offsets.append(offset)
        state = state * tot.exp()[:, None, None] + ct
        offset = offset + tot
        if last_l[c]:
            finals[seg_l[c]] = state
    y = y_diag + torch.stack(outs, 1)  # (H, chunks, Q, P)
    log_decay = cum + torch.stack(offsets, 1)[..., None]  # (H, chunks, Q)
    return (from_chunks(y.movedim(0, 2), rows, T), torch.stack(finals, 0),
            from_chunks(log_decay.movedim(0, 2), rows, T))


class SSDMaps(NamedTuple):
    """Each segment of a packed row run from a zero state, and its affine map (Note above).

    All in :func:`accumulator_dtype`.
    """

    out0: torch.Tensor
    """``(T, H, P)``: ``y0``, the outputs from ``S_in = 0`` (no ``D`` term)."""
    log_decay: torch.Tensor
    """``(T, H)``: ``a_t``, how ``y_t`` reads ``S_in`` (``y_t = y0_t + exp(a_t) S_in C_t``)."""
    maps: torch.Tensor
    """``(S, H, 1 + P N)``: ``[a | U]`` of each segment, ``a`` its total log decay (0 when empty)."""


def ssd_segment_maps(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    cu_seqlens: torch.Tensor, *, chunk_size: int = 64,
) -> SSDMaps:
    """Outputs from a zero state and the affine map of every segment (one kernel pass).

    Args:
        x, dt, A, B, C, cu_seqlens, chunk_size: as in :func:`chunk_ssd`.

    Returns:
        :class:`SSDMaps`.
    """
    T, H, Pd = x.shape
    cu = cu_seqlens.to("cpu", torch.long)
    y0, final, log_decay = chunk_ssd(x, dt, A, B, C, cu, chunk_size=chunk_size)
    lens = cu[1:] - cu[:-1]
    # a segment's total log decay: the running sum at its last token (0 for an empty segment)
    ends = (cu[1:] - 1).clamp(min=0).to(x.device)
    total = log_decay.index_select(0, ends) if T else log_decay.new_zeros((lens.numel(), H))
    total = total * (lens > 0).to(total.device, total.dtype)[:, None]
    maps = torch.cat([total[..., None], final.flatten(-2)], -1)
    return SSDMaps(out0=y0, log_decay=log_decay, maps=maps)
