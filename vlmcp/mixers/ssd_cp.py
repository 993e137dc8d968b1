"""``ssd_cp``: Mamba-2's SSD scan of this rank's tokens over the whole row.

Note [vlmcp SSD under CP: the segment schedule]
-----------------------------------------------
The schedule of Note [vlmcp gated delta rule under CP: the segment schedule], with Mamba-2's
map (Note [vlmcp SSD: a segment is an affine map of its incoming state]): per head a scalar
decay in log space and the zero-state final state, ``[a | U]``, ``H x (1 + P N)`` numbers::

    global:     a a | I I I | a a | b b b c c c | d d d        P = 2, one sample
    segment:    s0     s1     s2        s3         s4
    held by:    r0    r0 r1   r0        r1         r0        (the image is replicated)

    1. local pass, no communication (one chunked kernel over the rank's segments, zero states):
       each segment's y0 and a_t, and its map [a | U]
    2. one all-gather of the exported maps (owned, in a split sample, not last):
       rank 0 sends [a0|U0], [a2|U2]     rank 1 sends [a3|U3]
    3. composition, on every rank, per sample in global order, zero at the sample start:
       S(s1) = U0,  S(s2) = exp(a1) S(s1) + U1,  S(s3) = exp(a2) S(s2) + U2,  ...
    4. outputs: y_t = y0_t + exp(a_t) S(seg) C_t

The replicated image run s1 is computed by every rank from its own copy of the image tokens'
x, dt, B, C, so each copy's gradient is that rank's share (DESIGN.md section 3); the gathered
maps' gradients return to their owners by the all-gather's dual, a reduce-scatter. Bytes per
layer: ``H x (1 + P N)`` per exported segment, independent of L (:func:`ssd_exchange_bytes`).
A whole sample (one rank, one segment) never communicates. The decays are composed as
``exp`` of log-space sums in float32 at least (PITFALLS: state and decay in fp32, log space).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vlmcp.attention.merge import accumulator_dtype
from vlmcp.layout.plan import RankShard
from vlmcp.mixers.segments import SegmentLayout, incoming_states, segment_layout
from vlmcp.mixers.ssd import ssd_segment_maps
from vlmcp.mixers.state_exchange import exchange_maps, maps_bytes

__all__ = ["ssd_cp", "ssd_exchange_bytes"]


def _compose(m: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """``exp(a) S + U`` for one map ``m (H, 1 + P N)`` and a state ``S (H, P N)``."""
    return m[..., :1].exp() * state + m[..., 1:]


def ssd_cp(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, shard: RankShard,
    group: dist.ProcessGroup | None, *, chunk_size: int = 64,
) -> torch.Tensor:
    """Exact SSD scan of this rank's slots, each sample starting from a zero state (no ``D`` term).

    Args:
        x: ``(N, H, P)``, N = ``len(shard.positions)``.
        dt: ``(N, H)`` time steps (after softplus and clamp); A: ``(H,)``.
        B, C: ``(N, G, N_state)``, ``H % G == 0``.
        shard: this rank's :class:`~vlmcp.RankShard`.
        group: the CP group (None: one process, ``shard.cp_size == 1``).
        chunk_size: tokens per chunk of the local kernel.

    Returns:
        ``(N, H, P)`` in :func:`accumulator_dtype` of ``x`` (transformers' scan output is float32),
        zero at padding slots. Differentiable; replicated slots' input gradients are this rank's
        share (Note above).
    """
    Nt, H, Pd = x.shape
    if Nt != shard.num_tokens or tuple(dt.shape) != (Nt, H) or B.shape[0] != Nt or tuple(A.shape) != (H,):
        raise ValueError(f"ssd_cp: x {tuple(x.shape)}, dt {tuple(dt.shape)}, A {tuple(A.shape)}, B "
                         f"{tuple(B.shape)} must have {shard.num_tokens} slots (len(shard.positions)), dt "
                         "(N, H) and A (H,)")
    if group is None and shard.cp_size != 1:
        raise ValueError(f"group=None means one process, but the shard was planned for "
                         f"cp_size={shard.cp_size}")
    layout = segment_layout(shard)
    valid = layout.valid.to(x.device)
    sm = ssd_segment_maps(*(t.index_select(0, valid) for t in (x, dt)), A,
                          *(t.index_select(0, valid) for t in (B, C)), layout.local_cu, chunk_size=chunk_size)
    gathered = exchange_maps(sm.maps.index_select(0, layout.export.to(x.device)), layout, group)
    incoming = incoming_states(layout, sm.maps, gathered, lambda m: m[..., 1:], _compose)
    G, Ns = B.shape[1:]
    c_heads = C.index_select(0, valid).to(sm.out0.dtype).repeat_interleave(H // G, dim=1, output_size=H)
    cu = layout.local_cu.tolist()
    pieces = []
    for i in range(layout.num_local):
        lo, hi = cu[i], cu[i + 1]
        y = sm.out0[lo:hi]
        if i in incoming:
            read = c_heads[lo:hi] * sm.log_decay[lo:hi, :, None].exp()
            y = y + torch.einsum("thn,hpn->thp", read, incoming[i].view(H, Pd, Ns))
        pieces.append(y)
    acc = accumulator_dtype(x.dtype)
    local = torch.cat(pieces) if pieces else x.new_zeros((0, H, Pd), dtype=acc)
    return x.new_zeros((Nt, H, Pd), dtype=acc).index_copy(0, valid, local)


def ssd_exchange_bytes(layout: SegmentLayout, heads: int, head_dim: int, state_dim: int,
                       dtype: torch.dtype) -> int:
    """Bytes each rank receives in one SSD layer's forward all-gather: ``[a | U]`` maps of
    ``heads x (1 + head_dim x state_dim)``."""
    return maps_bytes(layout, heads * (1 + head_dim * state_dim), dtype)
