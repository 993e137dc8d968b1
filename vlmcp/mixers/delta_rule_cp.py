"""``gated_delta_rule_cp``: the gated delta rule of this rank's tokens over the whole row.

Note [vlmcp gated delta rule under CP: the segment schedule]
------------------------------------------------------------
The row's segments (:mod:`vlmcp.mixers.segments`) in global order; each is an affine
map ``S_out = M S_in + U`` of the recurrent state (Note [vlmcp gated delta rule: a
segment is an affine map of its incoming state]). P = 2, one sample, text chunks
``a b c d`` (rank 0 holds a and d, rank 1 b and c), an image after the prompt::

    global:     a a | I I I | a a | b b b c c c | d d d
    segment:    s0     s1     s2        s3         s4
    held by:    r0    r0 r1   r0        r1         r0        (the image is replicated)

    1. local pass, no communication (one chunked kernel per kind of segment):
       rank 0:  s0 -> U0, O0     s1 -> [M1|U1], R, O0   s2 -> [M2|U2], R, O0   s4 -> R, O0
       rank 1:                   s1 -> [M1|U1], R, O0   s3 -> [M3|U3], R, O0
       (s0 starts the sample: plain kernel from zero, no M; s4 is last: nobody needs its map)
    2. one all-gather of the exported maps (owned, in a split sample, not last):
       rank 0 sends [0|U0], [M2|U2]     rank 1 sends [M3|U3]      Hv x K x (K+V) each
    3. composition, on every rank, per sample in global order, zero at the sample start:
       S(s1) = U0,  S(s2) = M1 S(s1) + U1,  S(s3) = M2 S(s2) + U2,  S(s4) = M3 S(s3) + U3
       (each rank stops after the last segment it holds)
    4. outputs: o_t = O0_t + S(seg)^T R_t            (rank 0: s1, s2, s4; rank 1: s1, s3)

Every rank computes the replicated image run s1 itself: its map is built from the
rank's own copy of the image tokens' q, k, v, g, beta, so in backward each copy
receives that rank's share of the gradient and the shares sum to the truth (DESIGN.md
section 3). The maps of other ranks' segments arrive by the all-gather, whose
backward reduce-scatters their gradients to the owner; the rest of backward is
autograd through the local kernels and the composition. The bytes of a layer are
``Hv x K x (K + V)`` per exported segment, independent of L; the composition costs
``K x K x V`` per segment. A whole sample (one rank, one segment) never communicates.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vlmcp.layout.plan import RankShard
from vlmcp.mixers.delta_rule import accumulator_dtype, segment_maps
from vlmcp.mixers.segments import incoming_states, segment_layout
from vlmcp.mixers.state_exchange import exchange_maps

__all__ = ["gated_delta_rule_cp"]


def gated_delta_rule_cp(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    shard: RankShard, group: dist.ProcessGroup | None, *, chunk_size: int = 64, scale: float | None = None,
    use_qk_l2norm: bool = False, kernel: str = "auto",
) -> torch.Tensor:
    """Exact gated delta rule of this rank's slots, each sample starting from a zero state.

    Args:
        q, k: ``(N, Hk, K)``, N = ``len(shard.positions)``.
        v: ``(N, Hv, V)``, ``Hv % Hk == 0``.
        g: ``(N, Hv)`` log decays; beta: ``(N, Hv)``.
        shard: this rank's :class:`~vlmcp.RankShard`.
        group: the CP group (None: one process, ``shard.cp_size == 1``).
        chunk_size, scale, use_qk_l2norm, kernel: as in :func:`vlmcp.mixers.chunk_gated_delta_rule`.

    Returns:
        ``(N, Hv, V)`` in ``v.dtype``, zero at padding slots. Differentiable; replicated
        slots' input gradients are this rank's share (Note above).
    """
    N, Hk, K = k.shape
    Hv = v.shape[1]
    for name, x, shape in (("q", q, (N, Hk, K)), ("g", g, (N, Hv)), ("beta", beta, (N, Hv))):
        if tuple(x.shape) != shape:
            raise ValueError(f"gated_delta_rule_cp: {name} must be {shape} (k is {tuple(k.shape)}, "
                             f"v {tuple(v.shape)}), got {tuple(x.shape)}")
    if N != shard.num_tokens or v.shape[0] != N or Hv % Hk:
        raise ValueError(f"gated_delta_rule_cp: k {tuple(k.shape)} and v {tuple(v.shape)} must have "
                         f"{shard.num_tokens} slots (len(shard.positions)) and Hv a multiple of Hk")
    if group is None and shard.cp_size != 1:
        raise ValueError(f"group=None means one process, but the shard was planned for "
                         f"cp_size={shard.cp_size}")
    layout = segment_layout(shard)
    valid = layout.valid.to(v.device)
    sm = segment_maps(*(x.index_select(0, valid) for x in (q, k, v, g, beta)), layout.local_cu, layout.fresh,
                      chunk_size=chunk_size, scale=scale, use_qk_l2norm=use_qk_l2norm, kernel=kernel)
    gathered = exchange_maps(sm.maps.index_select(0, layout.export.to(v.device)), layout, group)
    incoming = incoming_states(layout, sm.maps, gathered, lambda m: m[..., K:],
                               lambda m, state: m[..., :K] @ state + m[..., K:])
    cu = layout.local_cu.tolist()
    pieces = []
    for i in range(layout.num_local):
        o = sm.out0[cu[i]:cu[i + 1]]
        if i in incoming:
            o = o + torch.einsum("thk,hkv->thv", sm.read[cu[i]:cu[i + 1]], incoming[i])
        pieces.append(o)
    acc = accumulator_dtype(v.dtype)
    local = torch.cat(pieces) if pieces else v.new_zeros((0,) + tuple(v.shape[1:]), dtype=acc)
    return v.new_zeros(v.shape).index_copy(0, valid, local.to(v.dtype))
