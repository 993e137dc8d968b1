"""Ulysses attention: all-to-all over heads for travelling tokens, image queries local.

Rank r sends head slice p of its travelling tokens (text, under
``image_strategy="replicate"``) to rank p, and receives every rank's travelling
tokens for its own slice of H/P heads. Together with its own copy of the image
K/V (slice r, no communication) that is the whole row for H/P heads: rank r
computes the travelling queries there and sends the outputs back by the inverse
all-to-all. Replicated image queries see image keys only, which every rank holds
whole, so each rank computes them for all heads locally::

    rank r:  q,k,v (N, H, D) -- travelling slots --> all-to-all --> (sum_p T_p, H/P, D)
               |                                                     + image K/V[:, slice r]
               |                                                     = whole row, H/P heads
               |                                                     -> attention (travelling q)
               |  out (T_r, H, D) <-- inverse all-to-all <-----------/
               `-- image q (all heads) x image K/V -> out of image slots (local)

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

import itertools
import math
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vlmcp.attention.blockwise import blockwise_attention
from vlmcp.attention.exchange import exchange_of
from vlmcp.attention.kernels import AttentionKernel
from vlmcp.attention.masks import Block, self_blocks
from vlmcp.layout.plan import RankShard

__all__ = ["UlyssesSchedule", "ulysses_attention", "ulysses_schedule"]


@dataclass(frozen=True)
class UlyssesSchedule:
    """Rank r's Ulysses metadata (pure metadata, cached per shard; index tensors on one device).

    The gathered row is ``[travelling tokens of rank 0 | ... of rank P-1 | rank r's
    image tokens]``; ``row_order`` sorts it into the global row.

    Attributes:
        counts: ``T_p`` for every rank p (travelling tokens, the all-to-all split sizes).
        send_index: ``LongTensor[T_r]``, local slots of this rank's travelling tokens.
        image_index: ``LongTensor[I]``, local slots of the valid replicated (image) tokens.
        row_order: ``LongTensor[L]``, gathered-row index of each global position.
        travelling_positions: ``LongTensor[sum_p T_p]``, global positions of the
            travelling tokens of every rank, in rank order (the outputs sent back).
        row_blocks: blocks of the travelling queries over the whole row (global indices).
        image_blocks: blocks of the image queries over the image keys (indices into
            ``image_index``).
    """

    counts: tuple[int, ...]
    send_index: torch.Tensor
    image_index: torch.Tensor
    row_order: torch.Tensor
    travelling_positions: torch.Tensor
    row_blocks: tuple[Block, ...]
    image_blocks: tuple[Block, ...]


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def ulysses_schedule(shard: RankShard, image_attention: str,
                     device: torch.device | str = "cpu") -> UlyssesSchedule:
    """Build (or fetch) the :class:`UlyssesSchedule` of ``shard`` with index tensors on ``device``."""
    device = torch.device(device)
    per_shard = _CACHE.setdefault(shard, {})
    key = (image_attention, device)
    if key in per_shard:
        return per_shard[key]
    ex = exchange_of(shard)
    plan, bidir = shard.plan, image_attention == "bidirectional"
    rep = torch.nonzero(shard.replicated & (shard.positions >= 0)).flatten()
    travelling = torch.cat(ex.positions)
    starts = plan.cu_seqlens[:-1].tolist()
    lens = (plan.cu_seqlens[1:] - plan.cu_seqlens[:-1]).tolist()
    rep_lens = plan.replicated_lens.tolist()
    image_lens = plan.image_lens.tolist() if bidir else [0] * len(lens)
    # image queries come from the local path: skip them (q_skip) in the whole row
    row_segs = [(starts[s], lens[s], rep_lens[s], image_lens[s]) for s in range(len(lens))]
    rep_starts = [0, *itertools.accumulate(rep_lens)]
    img_segs = [(rep_starts[s], rep_lens[s], 0, rep_lens[s] if bidir else 0) for s in range(len(rep_lens))]
    sched = UlyssesSchedule(
        counts=ex.counts, send_index=ex.send_index.to(device), image_index=rep.to(device),
        row_order=torch.cat([travelling, shard.positions[rep]]).argsort().to(device),
        travelling_positions=travelling.to(device),
        row_blocks=tuple(self_blocks(row_segs)), image_blocks=tuple(self_blocks(img_segs)))
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
    send = torch.cat([x.reshape(x.shape[0], -1) for x in xs], dim=1)  # rows in rank order
    recv = send.new_empty(P * T, sum(widths))
    dist.all_to_all_single(recv, send, [T] * P, list(counts), group=group)
    recv = recv.view(P, T, -1)
    return [part.reshape(P, T, x.shape[1], x.shape[2]).transpose(0, 1).reshape(T, P * x.shape[1], -1)
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
                      scale: float, kernel: AttentionKernel, need_lse: bool = False):
    """Ulysses CP attention (inputs already validated by :func:`vlmcp.attention.cp_attention`).

    Returns:
        ``out (N, H, D)`` and ``lse (N, H)`` (``lse`` is None unless ``need_lse``; it
        costs one more all-to-all).
    """
    sched = ulysses_schedule(shard, image_attention, q.device)
    P, r, counts = shard.cp_size, shard.rank, sched.counts
    N, H, D = q.shape
    idx, rep, order = sched.send_index, sched.image_index, sched.row_order
    m = math.lcm(k.shape[1], P)  # K/V heads that travel: see the module docstring
    kx, vx = (x.repeat_interleave(m // k.shape[1], 1) for x in (k, v)) if m > k.shape[1] else (k, v)
    # the whole row for this rank's heads, in global order
    if P > 1:
        qg, kg, vg = _SeqToHeads.apply(counts, r, group, q[idx], kx[idx], vx[idx])
    else:
        qg, kg, vg = q[idx], kx[idx], vx[idx]
    h, hk = H // P, m // P
    row_q = torch.cat([qg, qg.new_zeros(rep.numel(), h, D)])[order]
    row_k = torch.cat([kg, kx[rep, r * hk:(r + 1) * hk]])[order]
    row_v = torch.cat([vg, vx[rep, r * hk:(r + 1) * hk]])[order]
    out_row, lse_row = blockwise_attention(row_q, row_k, row_v, sched.row_blocks, scale, kernel)
    out_g = out_row[sched.travelling_positions]
    out_t = _HeadsToSeq.apply(counts, r, group, out_g) if P > 1 else out_g
    out = q.new_zeros(N, H, D).index_copy(0, idx, out_t)
    lse = None
    if need_lse:
        lse_t = lse_row[sched.travelling_positions]
        if P > 1:
            lse_t = _heads_to_seq([lse_t.unsqueeze(-1).contiguous()], counts, r, group)[0][..., 0]
        lse = lse_t.new_full((N, H), float("-inf")).index_copy(0, idx, lse_t)
    if rep.numel():
        # replicated image queries: image keys only, all heads, no communication
        out_i, lse_i = blockwise_attention(q[rep], k[rep], v[rep], sched.image_blocks, scale, kernel)
        out = out.index_copy(0, rep, out_i)
        if need_lse:
            lse = lse.index_copy(0, rep, lse_i)
    return out, lse
