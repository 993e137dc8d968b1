"""Hybrid Ulysses x ring attention (USP): an all-to-all over heads inside groups of U ranks,
ring attention across the groups.

Note [vlmcp USP: Ulysses groups are the virtual ranks of a ring]
----------------------------------------------------------------
The P ranks form R = P/U Ulysses groups of U consecutive ranks (yunchang's USP;
ms-swift's ulysses = gcd(kv_heads, P) with the rest on the ring). Group g, ranks
``gU .. gU+U-1``, is *virtual rank* g of a derived plan with ``cp_size = R`` whose
owner is ``owner // U`` (replicated tokens stay ``-1``): its *merged shard* holds the
union of its members' tokens of split samples, in global order, plus every replicated
token. Whole samples (``sample_placement``) are in no merged shard: their owner holds
every key they see and computes them locally for all heads, with no message. P = 4,
U = 2, one sample, text chunks ``c0..c7``, an image ``I`` after a prompt in ``c0``::

    rank         0             1             2             3
    holds     c0 I c7       I c1 c6       I c2 c5       I c3 c4        (zigzag, P = 4)
              '--- group 0 ----'          '--- group 1 ----'
    merged    c0 I c1 c6 c7               I c2 c3 c4 c5                (virtual ranks, R = 2)

    1. all-to-all in each group: member i sends head slice j of its travelling
       (non-replicated) q, k, v to member j; member j then holds the merged shard for
       heads [jH/U, (j+1)H/U), its replicated (image) tokens sliced from its own copy:
       rank 0: c0 I c1 c6 c7 (heads 0..H/2)    rank 1: the same, heads H/2..H
    2. ring attention over ranks {j, j+U, ...} (ranks 0-2 and 1-3 here) on the merged
       shards: Note [vlmcp ring attention schedule], with R steps; only the merged
       travelling K/V (m/U heads) circulate, image K/V stay local
    3. the inverse all-to-all returns each member its travelling outputs, all heads;
       images after text (head slice j, computed in the ring) are all-gathered over
       heads in the group; images that open their sample see only image keys and are
       computed locally for all heads (as in :mod:`.ulysses`), with no message, like
       whole samples

A group whose members hold no travelling token skips its all-to-alls (every member
knows it from the plan) but still joins the ring, forward and backward.

U = 1 is the ring (every group one rank, no all-to-all) and U = P is Ulysses (one
virtual rank: step 2 is local, over the whole row); P need not divide the
head count, only U must. K/V heads travel repeated up to ``m = lcm(kv_heads, U)`` as
in Ulysses. Messages per layer, rank r = gU + j, T_i travelling tokens of CP rank i,
M_g = sum over g's members of T_i, I_t image tokens after text::

    forward   a2a: out T_r x (H + 2m) heads, in M_g x (H + 2m)/U     Ulysses group
              R-1 P2P batches: K, V of m/U heads, M_g' tokens        ring group
                (g' = the group whose buffer passes at that step)
              a2a: out M_g x H/U heads, in T_r x H                   Ulysses group
              all-gather: I_t x H/U heads in, I_t x H out (I_t > 0)  Ulysses group
    backward  the duals in reverse (reduce-scatter, a2a), the ring's R-1 K/V and
              R-1 dK/dV batches, a2a

Share semantics: an image query's head slice j is computed on the R ranks ``gU + j``,
each with the sum of its group's output-gradient shares (the dual reduce-scatter), so
the sums over the CP group of dq and of the image dK/dV are the single-process ones.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from dataclasses import dataclass

import torch

from vlmcp.attention.blockwise import blockwise_attention
from vlmcp.attention.exchange import exchange_of
from vlmcp.attention.kernels import AttentionKernel
from vlmcp.attention.masks import Block, sample_runs, self_blocks
from vlmcp.attention.ring import RingSchedule, _RingAttention, local_segments, ring_schedule
from vlmcp.attention.ulysses import _heads_to_seq, _HeadsToSeq, _SeqToHeads, late_heads, local_blocks
from vlmcp.attention.usp_groups import UspGroups
from vlmcp.layout.plan import CPPlan, RankShard

__all__ = ["UspSchedule", "usp_attention", "usp_schedule", "virtual_plan"]


@dataclass(frozen=True)
class UspSchedule:
    """Rank r = gU + j's USP metadata (pure metadata, cached per shard; index tensors on one device).

    Attributes:
        counts: travelling tokens of each member of the rank's Ulysses group (the
            all-to-all split sizes).
        send_index: ``LongTensor[T_r]``, local slots of the rank's travelling tokens.
        image_index: ``LongTensor[I]``, local slots of the valid replicated tokens.
        merged_size: slots of the merged shard (virtual rank g).
        merged_slots: ``LongTensor[sum(counts) + I]``, merged slot of each row of
            ``[received travelling rows, member order | replicated rows]``.
        travelling_slots: ``LongTensor[sum(counts)]``, merged slots of the received rows.
        ring: the merged shard's ring schedule over the R virtual ranks, without the
            queries of leading images (computed locally instead).
        late_slots, late_merged: local and merged slots of the images after text.
        local_index: local slots computed here for all heads, with no message: each split
            sample's leading images and this rank's whole samples.
        local_blocks: blocks of those queries over their keys (indices into ``local_index``).
    """

    counts: tuple[int, ...]
    send_index: torch.Tensor
    image_index: torch.Tensor
    merged_size: int
    merged_slots: torch.Tensor
    travelling_slots: torch.Tensor
    ring: RingSchedule
    late_slots: torch.Tensor
    late_merged: torch.Tensor
    local_index: torch.Tensor
    local_blocks: tuple[Block, ...]


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def virtual_plan(plan: CPPlan, ulysses_size: int) -> CPPlan:
    """The plan of the R = P/U virtual ranks (Ulysses groups) over the split samples, cached per plan.

    A travelling token's owner is ``owner // U``; replicated tokens stay ``-1``; whole
    samples belong to no virtual rank (owner R, no slots): their owner computes them
    locally for all heads. Its ``cuts`` are still the P-rank zigzag cut points (nothing
    here reads them).
    """
    per_plan = _PLANS.setdefault(plan, {})
    if ulysses_size not in per_plan:
        U, P, S = ulysses_size, plan.cp_size, plan.num_samples
        R = P // U
        owner = torch.where(plan.travelling, plan.owner // U, torch.where(plan.owner < 0, -1, R))
        rank_lens = plan.rank_lens.masked_fill((plan.whole >= 0)[:, None], 0).view(S, R, U).sum(2)
        per_plan[U] = dataclasses.replace(plan, cp_size=R, owner=owner, rank_lens=rank_lens,
                                          whole=torch.full_like(plan.whole, -1), cost_estimates=None)
    return per_plan[ulysses_size]


def _leading(plan: CPPlan) -> torch.Tensor:
    """``BoolTensor[L]``: replicated tokens with no travelling token before them in their sample."""
    moving = plan.travelling.long()
    before = torch.cumsum(moving, 0) - moving
    before = before - before[plan.cu_seqlens[:-1]][plan.images.sample_ids]
    return (before == 0) & (plan.owner < 0)


def _merged_ring(merged: RankShard, lead: torch.Tensor, image_attention: str) -> RingSchedule:
    """The merged shard's ring schedule with the leading images' queries left out of step 0
    (later steps give them no block: every key they see is an image key, held locally)."""
    bidir = image_attention == "bidirectional"
    valid = merged.positions >= 0
    computed = valid & ~lead[merged.positions.clamp(min=0)]
    queries: list[list[tuple[int, int]]] = [[] for _ in range(merged.plan.num_samples)]
    for s, a, b in sample_runs(computed, merged.sample_ids):
        queries[s].append((a, b))
    segments = [seg._replace(queries=tuple(queries[s]))
                for s, seg in enumerate(local_segments(merged, bidir))]
    full = ring_schedule(merged, image_attention)
    return RingSchedule(exchange=full.exchange,
                        step_blocks=(tuple(self_blocks(segments)), *full.step_blocks[1:]))


def usp_schedule(shard: RankShard, ulysses_size: int, image_attention: str,
                 device: torch.device | str = "cpu") -> UspSchedule:
    """Build (or fetch) the :class:`UspSchedule` of ``shard``. See Note [vlmcp USP: Ulysses
    groups are the virtual ranks of a ring]."""
    device = torch.device(device)
    per_shard = _CACHE.setdefault(shard, {})
    key = (ulysses_size, image_attention, device)
    if key in per_shard:
        return per_shard[key]
    U, plan = ulysses_size, shard.plan
    g = shard.rank // U
    ex = exchange_of(shard)
    members = range(g * U, (g + 1) * U)
    merged = virtual_plan(plan, U).for_rank(g)
    slot_of = torch.full((plan.seq_len,), -1, dtype=torch.long)
    valid = torch.nonzero(merged.positions >= 0).flatten()
    slot_of[merged.positions[valid]] = valid
    lead = _leading(plan)
    rep = torch.nonzero(shard.replicated & (shard.positions >= 0)).flatten()
    rep_pos = shard.positions[rep]
    is_lead = lead[rep_pos]
    travelling = slot_of[torch.cat([ex.positions[i] for i in members])]
    # computed here for all heads: leading images (image keys only) and this rank's whole samples
    local = lead | ((plan.owner == shard.rank) & ~plan.travelling)
    local_index = torch.nonzero((shard.positions >= 0) & local[shard.positions.clamp(min=0)]).flatten()
    on = lambda x: x.to(device)  # noqa: E731
    sched = UspSchedule(
        counts=tuple(ex.counts[i] for i in members), send_index=on(ex.send_index), image_index=on(rep),
        merged_size=merged.num_tokens, merged_slots=on(torch.cat([travelling, slot_of[rep_pos]])),
        travelling_slots=on(travelling), ring=_merged_ring(merged, lead, image_attention),
        late_slots=on(rep[~is_lead]), late_merged=on(slot_of[rep_pos[~is_lead]]),
        local_index=on(local_index),
        local_blocks=tuple(local_blocks(shard, local_index, image_attention == "bidirectional")))
    per_shard[key] = sched
    return sched


def usp_attention(q, k, v, shard: RankShard, groups: UspGroups, image_attention: str, scale: float,
                  kernel: AttentionKernel, need_lse: bool = False):
    """USP CP attention (inputs already validated by :func:`vlmcp.attention.cp_attention`).

    Args:
        q: ``(N, H, D)``; k, v: ``(N, Hk, D)``, ``H % U == 0``.
        groups: this rank's :class:`~vlmcp.attention.usp_groups.UspGroups`.

    Returns:
        ``out (N, H, D)`` and ``lse (N, H)`` (``lse`` is None unless ``need_lse``; it
        costs one more all-to-all, and one more all-gather when images follow text).
    """
    U, j, ug = groups.ulysses_size, groups.ulysses_rank, groups.ulysses
    sched = usp_schedule(shard, U, image_attention, q.device)
    counts, idx, rep = sched.counts, sched.send_index, sched.image_index
    N, H = q.shape[:2]
    m = math.lcm(k.shape[1], U)  # K/V heads that travel (Note in .ulysses on the GQA grouping)
    kx, vx = (x.repeat_interleave(m // k.shape[1], 1) for x in (k, v)) if m > k.shape[1] else (k, v)
    # an all-to-all only where something travels in the group (counts: the same on its ranks)
    exchange = U > 1 and sum(counts) > 0
    if exchange:
        qg, kg, vg = _SeqToHeads.apply(counts, j, ug, q[idx], kx[idx], vx[idx])
    else:  # U = 1, or no rank of the group holds a travelling token (then these are empty)
        qg, kg, vg = (x[idx, j * w:(j + 1) * w] for x, w in ((q, H // U), (kx, m // U), (vx, m // U)))

    def merged(x_recv, x, width):
        """The merged shard ``(merged_size, width, D)``: received rows and this rank's head slice
        of the replicated ones; padding zero."""
        rows = torch.cat([x_recv, x[rep, j * width:(j + 1) * width]])
        return rows.new_zeros(sched.merged_size, width, x.shape[2]).index_copy(0, sched.merged_slots, rows)

    qm, km, vm = merged(qg, q, H // U), merged(kg, kx, m // U), merged(vg, vx, m // U)
    out_m, lse_m = _RingAttention.apply(qm, km, vm, sched.ring, groups.ring, scale, kernel)
    out_g = out_m[sched.travelling_slots]
    if exchange:
        out_t = _HeadsToSeq.apply(counts, j, ug, out_g)
    else:  # U > 1: (0, H, D), still from the ring's output, so that every rank joins its backward
        out_t = out_g if U == 1 else out_g.repeat(1, U, 1)
    out = q.new_zeros(N, H, v.shape[2]).index_copy(0, idx, out_t)  # MLA: V's head dim
    lse = None
    if need_lse:
        lse_t = lse_m[sched.travelling_slots]
        if exchange:
            lse_t = _heads_to_seq([lse_t.unsqueeze(-1).contiguous()], counts, j, ug)[0][..., 0]
        elif U > 1:
            lse_t = lse_t.new_zeros(0, H)
        lse = lse_t.new_full((N, H), float("-inf")).index_copy(0, idx, lse_t)
    if sched.late_slots.numel():
        out, lse = late_heads(out, lse, sched.late_slots, out_m[sched.late_merged],
                              lse_m[sched.late_merged] if need_lse else None, ug, U)
    local = sched.local_index
    if local.numel():
        out_i, lse_i = blockwise_attention(q[local], k[local], v[local], sched.local_blocks, scale, kernel)
        out = out.index_copy(0, local, out_i)
        if need_lse:
            lse = lse.index_copy(0, local, lse_i)
    return out, lse
