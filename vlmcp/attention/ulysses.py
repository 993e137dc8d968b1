"""Ulysses attention: all-to-all over heads for travelling tokens, image queries local or head-split.

Rank r sends head slice p of its travelling tokens (text, under
``image_strategy="replicate"``) to rank p, and receives every rank's travelling
tokens for its own slice of H/P heads. Together with its own copy of the image
K/V (slice r, no communication) that is the whole row for H/P heads: rank r
computes the travelling queries there and sends the outputs back by the inverse
all-to-all::

    rank r:  q,k,v (N, H, D) -- travelling slots --> all-to-all --> (sum_p T_p, H/P, D)
               |                                                     + image q,K,V[:, slice r]
               |                                                     = whole row, H/P heads
               |                                                     -> attention (travelling q,
               |  out (T_r, H, D) <-- inverse all-to-all <-----------/   and images after text)
               |  out of images after text (I_t, H, D) <-- all-gather over heads
               `-- images of a sample's leading image run, and whole samples (sample_placement):
                   q (all heads) x their K/V (local, no communication)

Image queries. An image at the start of its sample (before any text) sees only
image keys, which every rank holds whole: each rank computes it for all heads
locally, with no communication. An image after text sees that text, which only
the gathered row has: rank r computes it there for its head slice (from its own
copy of the image queries) and an all-gather over heads gives every rank all
heads (its dual, a reduce-scatter, sums the ranks' output-gradient shares, so the
slice's dQ is whole on rank r and zero elsewhere: share semantics). That costs one
all-gather of ``I_t x H x D`` per layer (and its reduce-scatter), only when some
image follows text; no image K/V travels either way.

Share semantics: the image K/V gradient on rank r holds every text query's
contribution for head slice r plus rank r's image queries' contribution; the sum
over ranks is the full gradient.

GQA with ``kv_heads % P != 0``: each K/V head is repeated ``m / kv_heads`` times,
``m = lcm(kv_heads, P)``, before the exchange (autograd sums the copies back). ``m``
divides ``heads`` (``kv_heads`` and ``P`` both divide it), and rank r's query heads
``[r H/P, (r+1) H/P)`` use exactly the repeated K/V heads ``[r m/P, (r+1) m/P)``, in
the kernel's GQA grouping (query head i of the slice uses K/V head ``i // (H/m)``).
Repeating up to ``heads`` instead would send ``heads / m`` times the K/V bytes.

The index metadata (who sends what, the permutation to the global row, the block
lists) depends only on the shard: :func:`ulysses_schedule` builds it once per shard
and every layer reuses it.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vlmcp.attention.blockwise import blockwise_attention
from vlmcp.attention.exchange import exchange_of
from vlmcp.attention.kernels import AttentionKernel
from vlmcp.attention.masks import Block, image_runs, sample_runs, segments, self_blocks
from vlmcp.attention.merge import accumulator_dtype
from vlmcp.comm import all_gather
from vlmcp.layout.plan import RankShard

__all__ = ["UlyssesSchedule", "ulysses_attention", "ulysses_schedule"]


@dataclass(frozen=True)
class UlyssesSchedule:
    """Rank r's Ulysses metadata (pure metadata, cached per shard; index tensors on one device).

    The gathered row is ``[travelling tokens of rank 0 | ... of rank P-1 | rank r's
    replicated tokens]``; ``row_order`` sorts it into the global row.

    Attributes:
        counts: ``T_p`` for every rank p (travelling tokens, the all-to-all split sizes).
        send_index: ``LongTensor[T_r]``, local slots of this rank's travelling tokens.
        image_index: ``LongTensor[I]``, local slots of the valid replicated (image) tokens.
        row_order: ``LongTensor[R]``, gathered-row index of each row position. The row
            is the split samples' tokens in global order (whole samples are not in it).
        travelling_positions: ``LongTensor[sum_p T_p]``, row positions of the
            travelling tokens of every rank, in rank order (the outputs sent back).
        row_blocks: blocks of the queries computed in the gathered row (travelling
            tokens and images after text) over the whole row (row indices).
        late_slots, late_positions: local slots and row positions of the replicated
            images after text (computed in the row for the head slice, then gathered).
        lead_index: ``LongTensor[I_l]``, local slots computed locally for all heads: the
            images of each split sample's leading image run, and the whole samples.
        lead_blocks: blocks of those queries over their keys (indices into ``lead_index``).
    """

    counts: tuple[int, ...]
    send_index: torch.Tensor
    image_index: torch.Tensor
    row_order: torch.Tensor
    travelling_positions: torch.Tensor
    row_blocks: tuple[Block, ...]
    late_slots: torch.Tensor
    late_positions: torch.Tensor
    lead_index: torch.Tensor
    lead_blocks: tuple[Block, ...]


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def local_blocks(shard: RankShard, local_index: torch.Tensor, bidirectional: bool,
                 window: int = 0) -> list[Block]:
    """Blocks of local queries that see only local keys (a sample's leading images, whole
    samples) over themselves, stored compactly in ``local_index`` (local slots, global order)."""
    images, S = shard.plan.images, shard.plan.num_samples
    pos = shard.positions[local_index]
    lens = torch.bincount(images.sample_ids[pos], minlength=S)
    starts = (torch.cumsum(lens, 0) - lens).tolist()
    spans = image_runs(images.image_ids[pos], images.samples) if bidirectional else []
    return self_blocks(segments(S, starts, lens.tolist(), spans), window)


def ulysses_schedule(shard: RankShard, image_attention: str,
                     device: torch.device | str = "cpu", window: int = 0) -> UlyssesSchedule:
    """Build (or fetch) the :class:`UlyssesSchedule` of ``shard`` with index tensors on ``device``.

    ``window``: sliding window (:func:`~vlmcp.attention.masks.windowed`); the gathered row
    and the local samples hold whole samples, so offsets are indices there.
    """
    device = torch.device(device)
    per_shard = _CACHE.setdefault(shard, {})
    key = (image_attention, device) if not window else (image_attention, device, window)
    if key in per_shard:
        return per_shard[key]
    ex = exchange_of(shard)
    plan, bidir = shard.plan, image_attention == "bidirectional"
    images = plan.images
    S = plan.num_samples
    rep = torch.nonzero(shard.replicated & (shard.positions >= 0)).flatten()
    rep_pos = shard.positions[rep]
    travelling = torch.cat(ex.positions)
    # the gathered row holds the split samples (travelling + replicated tokens), compacted
    in_row = plan.travelling | (plan.owner < 0)
    compact = torch.cumsum(in_row.long(), 0) - 1
    # a replicated token "leads" if no travelling token precedes it in its sample
    moving = plan.travelling.long()
    before = torch.cumsum(moving, 0) - moving
    before = before - before[plan.cu_seqlens[:-1]][images.sample_ids]
    lead = (before == 0) & (plan.owner < 0)
    late_pos = rep_pos[~lead[rep_pos]]
    computed = plan.travelling.clone()
    computed[late_pos] = True
    row_sid = images.sample_ids[in_row]
    row_lens = torch.bincount(row_sid, minlength=S)
    row_starts = (torch.cumsum(row_lens, 0) - row_lens).tolist()
    spans = []
    if bidir:
        spans = [(int(images.samples[i]), int(compact[a]), int(compact[a]) + b - a)
                 for i, (a, b) in enumerate(images.spans.tolist()) if bool(in_row[a])]
    row_blocks = self_blocks(segments(S, row_starts, row_lens.tolist(), spans,
                                      sample_runs(computed[in_row], row_sid)), window)
    # computed locally for all heads, compact: each split sample's leading images (they see
    # image keys only) and the whole samples on this rank (every key they see is here)
    local = lead.clone()
    local |= (plan.owner == shard.rank) & ~plan.travelling
    valid = shard.positions >= 0
    lead_index = torch.nonzero(valid & local[shard.positions.clamp(min=0)]).flatten()
    lead_blocks = local_blocks(shard, lead_index, bidir, window)
    sched = UlyssesSchedule(
        counts=ex.counts, send_index=ex.send_index.to(device), image_index=rep.to(device),
        row_order=torch.cat([travelling, rep_pos]).argsort().to(device),
        travelling_positions=compact[travelling].to(device), row_blocks=tuple(row_blocks),
        late_slots=rep[~lead[rep_pos]].to(device), late_positions=compact[late_pos].to(device),
        lead_index=lead_index.to(device), lead_blocks=tuple(lead_blocks))
    per_shard[key] = sched
    return sched


def _seq_to_heads(xs, counts, group):
    """``[(T_rank, Hx, D)]`` -> ``[(sum_p T_p, Hx/P, D)]``: one all-to-all for all tensors.

    Each token's message to rank p is ``[x0 heads of p | x1 heads of p | ...]``.
    """
    P, T = len(counts), xs[0].shape[0]
    widths = [x.shape[1] // P * x.shape[2] for x in xs]
    width = sum(widths)
    send = torch.cat([x.reshape(T, P, w) for x, w in zip(xs, widths, strict=True)], dim=2)
    send = send.transpose(0, 1).contiguous()  # (P, T, width): chunk p goes to rank p
    recv = send.new_empty(sum(counts), width)
    dist.all_to_all_single(recv, send.view(-1, width), list(counts), [T] * P, group=group)
    return [part.reshape(-1, x.shape[1] // P, x.shape[2])
            for part, x in zip(recv.split(widths, dim=1), xs, strict=True)]


def _heads_to_seq(xs, counts, rank, group):
    """``[(sum_p T_p, h, D)]`` -> ``[(T_rank, P*h, D)]``: the inverse of :func:`_seq_to_heads`."""
    P, T = len(counts), counts[rank]
    widths = [x.shape[1] * x.shape[2] for x in xs]
    send = torch.cat([x.reshape(x.shape[0], x.shape[1] * x.shape[2]) for x in xs], dim=1)  # rank order
    recv = send.new_empty(P * T, sum(widths))
    dist.all_to_all_single(recv, send, [T] * P, list(counts), group=group)
    recv = recv.view(P, T, sum(widths))  # not -1: T may be 0
    return [part.reshape(P, T, x.shape[1], x.shape[2]).transpose(0, 1).reshape(T, P * x.shape[1], x.shape[2])
            for part, x in zip(recv.split(widths, dim=2), xs, strict=True)]


class _SeqToHeads(torch.autograd.Function):
    """All-to-all, sequence-sharded -> head-sharded; its dual is :class:`_HeadsToSeq`.

    Forward: each ``x (T_rank, Hx, D)`` -> ``(sum_p T_p, Hx/P, D)`` (rank order).
    Backward: gradients ``(sum_p T_p, Hx/P, D)`` -> ``(T_rank, Hx, D)`` by the inverse all-to-all.
    """

    @staticmethod
    def forward(ctx, counts, rank, group, *xs):
        ctx.counts, ctx.rank, ctx.group = counts, rank, group
        return tuple(_seq_to_heads([x.contiguous() for x in xs], counts, group))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, *_heads_to_seq([g.contiguous() for g in grads], ctx.counts, ctx.rank,
                                                 ctx.group))


class _HeadsToSeq(torch.autograd.Function):
    """All-to-all, head-sharded -> sequence-sharded; its dual is :class:`_SeqToHeads`.

    Forward: ``x (sum_p T_p, h, D)`` -> ``(T_rank, P*h, D)``.
    Backward: ``(T_rank, P*h, D)`` -> ``(sum_p T_p, h, D)``.
    """

    @staticmethod
    def forward(ctx, counts, rank, group, x):
        ctx.counts, ctx.rank, ctx.group = counts, rank, group
        return _heads_to_seq([x.contiguous()], counts, rank, group)[0]

    @staticmethod
    def backward(ctx, grad):
        return None, None, None, _seq_to_heads([grad.contiguous()], ctx.counts, ctx.group)[0]


def ulysses_attention(q, k, v, shard: RankShard, group: dist.ProcessGroup, image_attention: str,
                      scale: float, kernel: AttentionKernel, need_lse: bool = False, window: int = 0):
    """Ulysses CP attention (inputs already validated by :func:`vlmcp.attention.cp_attention`).

    Returns:
        ``out (N, H, D)`` and ``lse (N, H)`` (``lse`` is None unless ``need_lse``; it
        costs one more all-to-all, and one more all-gather when images follow text).
    """
    sched = ulysses_schedule(shard, image_attention, q.device, window)
    P, r, counts = shard.cp_size, shard.rank, sched.counts
    N, H = q.shape[:2]
    idx, rep, order = sched.send_index, sched.image_index, sched.row_order
    m = math.lcm(k.shape[1], P)  # K/V heads that travel: see the module docstring
    kx, vx = (x.repeat_interleave(m // k.shape[1], 1) for x in (k, v)) if m > k.shape[1] else (k, v)
    out = q.new_zeros(N, H, v.shape[2])  # MLA: V's head dim
    lse = q.new_full((N, H), float("-inf"), dtype=accumulator_dtype(q.dtype)) if need_lse else None
    if sum(counts) == 0:  # nothing travels on any rank (every sample whole): every query is local
        return _local_queries(q, k, v, sched, scale, kernel, out, lse)
    # the whole row for this rank's heads, in global order
    if P > 1:
        qg, kg, vg = _SeqToHeads.apply(counts, r, group, q[idx], kx[idx], vx[idx])
    else:
        qg, kg, vg = q[idx], kx[idx], vx[idx]
    h, hk = H // P, m // P
    row_q = torch.cat([qg, q[rep, r * h:(r + 1) * h]])[order]
    row_k = torch.cat([kg, kx[rep, r * hk:(r + 1) * hk]])[order]
    row_v = torch.cat([vg, vx[rep, r * hk:(r + 1) * hk]])[order]
    out_row, lse_row = blockwise_attention(row_q, row_k, row_v, sched.row_blocks, scale, kernel)
    out_g = out_row[sched.travelling_positions]
    out_t = _HeadsToSeq.apply(counts, r, group, out_g) if P > 1 else out_g
    out = out.index_copy(0, idx, out_t)
    if need_lse:
        lse_t = lse_row[sched.travelling_positions]
        if P > 1:
            lse_t = _heads_to_seq([lse_t.unsqueeze(-1).contiguous()], counts, r, group)[0][..., 0]
        lse = lse.index_copy(0, idx, lse_t)
    if sched.late_slots.numel():  # images after text: this rank's head slice from the row
        out, lse = late_heads(out, lse, sched.late_slots, out_row[sched.late_positions],
                              lse_row[sched.late_positions] if need_lse else None, group, P)
    return _local_queries(q, k, v, sched, scale, kernel, out, lse)


def late_heads(out: torch.Tensor, lse: torch.Tensor | None, slots: torch.Tensor, out_h: torch.Tensor,
               lse_h: torch.Tensor | None, group: dist.ProcessGroup, size: int):
    """Images after text: every head of their rows from each rank's head slice (Ulysses and USP).

    Args:
        out: ``(N, H, Dv)`` this rank's output, filled at ``slots``.
        lse: ``(N, H)`` or None.
        slots: local slots of the late image rows.
        out_h: ``(n, H / size, Dv)`` their output for this rank's heads; ``lse_h`` ``(n, H / size)``.
        group: the head group of ``size`` ranks.

    The output's gather is :func:`vlmcp.comm.all_gather` on the head dim (dual: reduce-scatter);
    the log-sum-exp is not differentiated (a plain all-gather).
    """
    out = out.index_copy(0, slots, all_gather(out_h, group, dim=1) if size > 1 else out_h)
    if lse is not None:
        lse_h = lse_h.contiguous()
        if size > 1:
            parts = [torch.empty_like(lse_h) for _ in range(size)]
            dist.all_gather(parts, lse_h, group=group)
            lse_h = torch.cat(parts, dim=1)
        lse = lse.index_copy(0, slots, lse_h)
    return out, lse


def _local_queries(q, k, v, sched: UlyssesSchedule, scale, kernel, out, lse):
    """Queries that see only local keys, all heads: leading images and whole samples."""
    # called even without such queries: the output stays in q, k and v's graph (zero gradients)
    lead = sched.lead_index
    out_i, lse_i = blockwise_attention(q[lead], k[lead], v[lead], sched.lead_blocks, scale, kernel)
    out = out.index_copy(0, lead, out_i)
    if lse is not None:
        lse = lse.index_copy(0, lead, lse_i)
    return out, lse
