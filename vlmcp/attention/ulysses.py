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
over ranks is the full gradient. When ``kv_heads % P != 0`` (GQA), K/V heads are
replicated up to ``heads`` before the exchange (autograd sums them back).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vlmcp.attention.blockwise import blockwise_attention
from vlmcp.attention.exchange import exchange_of
from vlmcp.attention.kernels import AttentionKernel
from vlmcp.attention.masks import self_blocks
from vlmcp.layout.plan import RankShard

__all__ = ["ulysses_attention"]


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
    ex = exchange_of(shard)
    P, r = shard.cp_size, shard.rank
    N, H, D = q.shape
    if k.shape[1] % P:
        k, v = (x.repeat_interleave(H // k.shape[1], 1) for x in (k, v))
    bidir = image_attention == "bidirectional"
    plan = shard.plan
    dev = q.device
    idx = ex.send_index.to(dev)
    rep = torch.nonzero(shard.replicated & (shard.positions >= 0)).flatten().to(dev)
    # the whole row for this rank's heads, indexed by global position
    if P > 1:
        qg, kg, vg = _SeqToHeads.apply(ex.counts, r, group, q[idx], k[idx], v[idx])
    else:
        qg, kg, vg = q[idx], k[idx], v[idx]
    h, hk = H // P, k.shape[1] // P
    where = torch.cat([*ex.positions, shard.positions[rep.cpu()]]).argsort().to(dev)
    row_q = torch.cat([qg, qg.new_zeros(rep.numel(), h, D)])[where]
    row_k = torch.cat([kg, k[rep][:, r * hk:(r + 1) * hk]])[where]
    row_v = torch.cat([vg, v[rep][:, r * hk:(r + 1) * hk]])[where]
    starts, lens = plan.cu_seqlens[:-1].tolist(), (plan.cu_seqlens[1:] - plan.cu_seqlens[:-1]).tolist()
    rep_lens, image_lens = plan.replicated_lens.tolist(), plan.image_lens.tolist()
    segs = [(starts[s], lens[s], rep_lens[s], image_lens[s] if bidir else 0) for s in range(len(lens))]
    out_row, lse_row = blockwise_attention(row_q, row_k, row_v, self_blocks(segs), scale, kernel)
    gathered = torch.cat(ex.positions).to(dev)
    out_g = out_row[gathered]
    out_t = _HeadsToSeq.apply(ex.counts, r, group, out_g) if P > 1 else out_g
    out = q.new_zeros(N, H, D).index_copy(0, idx, out_t)
    lse = None
    if need_lse:
        lse_t = lse_row[gathered]
        if P > 1:
            lse_t = _heads_to_seq([lse_t.unsqueeze(-1).contiguous()], ex.counts, r, group)[0][..., 0]
        lse = lse_t.new_full((N, H), float("-inf")).index_copy(0, idx, lse_t)
    if rep.numel():
        # replicated image queries: image keys only, all heads, no communication
        cu = torch.cumsum(torch.tensor([0, *rep_lens]), 0).tolist()
        img_segs = [(cu[s], rep_lens[s], 0, rep_lens[s] if bidir else 0) for s in range(len(rep_lens))]
        out_i, lse_i = blockwise_attention(q[rep], k[rep], v[rep], self_blocks(img_segs), scale, kernel)
        out = out.index_copy(0, rep, out_i)
        if need_lse:
            lse = lse.index_copy(0, rep, lse_i)
    return out, lse
