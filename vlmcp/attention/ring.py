"""Ring attention: travelling K/V circulate, replicated image K/V stay local.

Note [vlmcp ring attention schedule]
------------------------------------
Per sample, rank r holds the replicated image prefix I (``image_strategy="replicate"``)
and zigzag chunks r and 2P-1-r of the rest. Only the zigzag chunks travel. P = 2::

    rank 0: [ I | c0 | c3 ]                     rank 1: [ I | c1 | c2 ]

    step 0, own K/V (I included): local order is global order, so each sample
            is ONE causal block (two with bidirectional images: prefix full + causal).
    step 1, rank 0 holds (c1, c2):              rank 1 holds (c0, c3):
                  k: c1     c2                               k: c0     c3
            q: c0    empty  empty                      q: c1    full   empty
               c3    full   full   -> 1 full call         c2    full   empty  -> 1 full call

Query chunk a against key chunk b is full if a > b, causal if a == b (step 0 only),
empty if a < b. At every step s >= 1 each rank computes exactly two c x c full
blocks per sample (chunk 2P-1-r always sees chunk j = r-s; one more pair depending on
j < r or j > r), so steps are balanced across ranks as well as in total. Image
queries see no travelling key (text follows images), so their blocks are skipped.

Timeline of rank r (P ranks; "post" = batched isend/irecv, before compute)::

    forward   step s:  post K/V(owner r-s) -> r+1, recv K/V(owner r-s-1) <- r-1
                       compute blocks(q_local, K/V(owner r-s)); merge in fp32
                       wait
    backward  step s:  post K/V as in forward
                       compute dQ and dK/dV of owner r-s (s = 0: own, image included)
                       s >= 2: wait partial dK/dV(owner r-s) <- r-1, add it
                       s >= 1: post dK/dV(owner r-s) -> r+1
                       wait K/V
              end:     wait dK/dV(owner r) <- r-1 (every other rank's share), add

Forward: P-1 K/V messages per rank; backward: P-1 K/V and P-1 dK/dV messages
(dK/dV travel in float32, float64 for float64 inputs). P = 1 communicates nothing.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vlmcp.attention.blockwise import blocks_backward, blocks_forward
from vlmcp.attention.comm import RingComm
from vlmcp.attention.exchange import Exchange, exchange_of
from vlmcp.attention.kernels import AttentionKernel
from vlmcp.attention.masks import Block, cross_blocks, self_blocks, split_runs
from vlmcp.attention.merge import accumulator_dtype
from vlmcp.layout.plan import RankShard, TokenKind

__all__ = ["RingSchedule", "ring_attention", "ring_schedule"]


@dataclass(frozen=True)
class RingSchedule:
    """The blocks a rank computes at each ring step (pure metadata, cached per shard).

    Attributes:
        exchange: travelling tokens of every rank.
        step_blocks: ``step_blocks[0]`` are the local blocks (own K/V, key indices are
            local slots); ``step_blocks[s]`` for ``s >= 1`` pair local queries with the
            packed buffer of rank ``(rank - s) % P`` (key indices into that buffer).
    """

    exchange: Exchange
    step_blocks: tuple[tuple[Block, ...], ...]


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def ring_schedule(shard: RankShard, image_attention: str) -> RingSchedule:
    """Build (or fetch) the :class:`RingSchedule` of ``shard``. See Note [vlmcp ring attention schedule]."""
    per_shard = _CACHE.setdefault(shard, {})
    if image_attention in per_shard:
        return per_shard[image_attention]
    ex = exchange_of(shard)
    bidir = image_attention == "bidirectional"
    image_lens = shard.image_lens.tolist() if bidir else [0] * shard.plan.num_samples
    n_samples = shard.plan.num_samples
    valid = torch.zeros(n_samples, dtype=torch.long).index_add_(
        0, shard.sample_ids, (shard.positions >= 0).long())
    images = torch.zeros(n_samples, dtype=torch.long).index_add_(
        0, shard.sample_ids, (shard.kinds == TokenKind.IMAGE).long())
    starts = shard.cu_seqlens[:-1].tolist()
    local = self_blocks([(starts[s], int(valid[s]), 0, int(images[s]) if bidir else 0)
                         for s in range(n_samples)])
    q_runs = split_runs(ex.local_runs, image_lens) if bidir else ex.local_runs
    steps = [tuple(local)]
    for s in range(1, shard.cp_size):
        k_runs = ex.runs[(shard.rank - s) % shard.cp_size]
        k_runs = split_runs(k_runs, image_lens) if bidir else k_runs
        steps.append(tuple(cross_blocks(q_runs, k_runs, image_lens)))
    sched = RingSchedule(exchange=ex, step_blocks=tuple(steps))
    per_shard[image_attention] = sched
    return sched


def _heads(x: torch.Tensor) -> torch.Tensor:
    """``(N, H, D)`` -> ``(H, N, D)`` view (the kernels accept strided inputs)."""
    return x.transpose(0, 1)


class _RingAttention(torch.autograd.Function):
    """Ring attention of this rank's queries over the whole row.

    Forward: ``q (N, H, D), k, v (N, Hk, D) -> out (N, H, D), lse (N, H)``.
    Backward (the dual ring): ``dout (N, H, D) -> dq (N, H, D), dk, dv (N, Hk, D)``;
    dK/dV of travelling tokens come back to their owner; dK/dV of replicated image
    tokens hold this rank's share (its own queries' contribution). lse is not
    differentiable; non-tensor inputs get ``None``.
    """

    @staticmethod
    def forward(ctx, q, k, v, sched: RingSchedule, group, scale: float, kernel: AttentionKernel):
        ex = sched.exchange
        P, r = ex.cp_size, ex.rank
        acc = accumulator_dtype(q.dtype)
        N, H, D = q.shape
        out = q.new_zeros((N, H, D), dtype=acc)
        lse = q.new_full((N, H), float("-inf"), dtype=acc)
        touched = torch.zeros(N, dtype=torch.bool)
        oh, lh = _heads(out), lse.t()
        comm = RingComm(group) if P > 1 else None
        idx = ex.send_index.to(q.device)
        kv = torch.stack([k[idx], v[idx]]) if P > 1 else None
        for s in range(P):
            if s + 1 < P:
                nxt = kv.new_empty((2, ex.counts[(r - s - 1) % P], *k.shape[1:]))
                comm.send_recv(kv, nxt)
                comm.commit()
            if s == 0:
                kh, vh = _heads(k), _heads(v)
            else:
                kh, vh = _heads(kv[0]), _heads(kv[1])
            blocks_forward(kernel, _heads(q), kh, vh, sched.step_blocks[s], scale, oh, lh, touched)
            if s + 1 < P:
                comm.wait()
                kv = nxt
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.sched, ctx.group, ctx.scale, ctx.kernel = sched, group, scale, kernel
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        sched, kernel, scale = ctx.sched, ctx.kernel, ctx.scale
        ex = sched.exchange
        P, r = ex.cp_size, ex.rank
        acc = lse.dtype
        dq, dk, dv = (x.new_zeros(x.shape, dtype=acc) for x in (q, k, v))
        dout = dout.to(q.dtype).contiguous()  # e.g. out.sum() gives a stride-0 dout
        args = (_heads(dout), _heads(q))
        tail = (_heads(out), lse.t())
        idx = ex.send_index.to(q.device)
        if P == 1:
            blocks_backward(kernel, *args, _heads(k), _heads(v), *tail, sched.step_blocks[0], scale,
                            _heads(dq), _heads(dk), _heads(dv))
            return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None
        kv_comm, dkv_comm = RingComm(ctx.group), RingComm(ctx.group)
        kv = torch.stack([k[idx], v[idx]])
        partial = None  # dK/dV arriving from r-1 for the owner held next
        for s in range(P):
            if s + 1 < P:
                nxt = kv_comm.send_recv(kv, kv.new_empty((2, ex.counts[(r - s - 1) % P], *k.shape[1:])))
                kv_comm.commit()
            if s == 0:
                blocks_backward(kernel, *args, _heads(k), _heads(v), *tail, sched.step_blocks[0], scale,
                                _heads(dq), _heads(dk), _heads(dv))
            else:
                dkv = kv.new_zeros(kv.shape, dtype=acc)
                blocks_backward(kernel, *args, _heads(kv[0]), _heads(kv[1]), *tail, sched.step_blocks[s],
                                scale, _heads(dq), _heads(dkv[0]), _heads(dkv[1]))
                if s >= 2:
                    dkv_comm.wait()
                    dkv += partial
                partial = dkv.new_empty((2, ex.counts[(r - s - 1) % P], *k.shape[1:]))
                dkv_comm.send_recv(dkv, partial)
                dkv_comm.commit()
            if s + 1 < P:
                kv_comm.wait()
                kv = nxt
        dkv_comm.wait()
        dk.index_add_(0, idx, partial[0])
        dv.index_add_(0, idx, partial[1])
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def ring_attention(q, k, v, shard: RankShard, group: dist.ProcessGroup, image_attention: str,
                   scale: float, kernel: AttentionKernel):
    """Ring CP attention (inputs already validated by :func:`vlmcp.attention.cp_attention`).

    Returns:
        ``out (N, H, D)`` and ``lse (N, H)``.
    """
    return _RingAttention.apply(q, k, v, ring_schedule(shard, image_attention), group, scale, kernel)
