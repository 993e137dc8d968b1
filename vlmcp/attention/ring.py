"""Ring attention: travelling K/V circulate, replicated image K/V stay local.

Note [vlmcp ring attention schedule]
------------------------------------
Per sample, rank r holds every replicated image token (``image_strategy="replicate"``)
and zigzag chunks r and 2P-1-r of the text, all in global order. Only the zigzag
chunks travel. P = 2, a prompt ``p`` before an image ``I`` and text after it::

    rank 0: [ p | I | c0 | c3 ]                 rank 1: [ I | c1 | c2 ]

    step 0, own K/V (images included): local order is global order, so each sample
            is ONE causal block (with bidirectional images: a full block per image
            and a full + causal pair per stretch of text).
    step 1, rank 0 holds (c1, c2):              rank 1 holds (p, c0, c3):
                  k: c1     c2                               k: p      c0     c3
            q: p     empty  empty                      q: I     full   empty  empty
               I     empty  empty                         c1    full   full   empty
               c0    empty  empty                         c2    full   full   empty
               c3    full   full   -> 1 full call

Travelling chunks and the rank's own tokens hold disjoint offsets, so every block
of a step s >= 1 is full or empty (a key run entirely before or after a query run);
under bidirectional attention runs are split at image boundaries and two pieces of
one image (``"shard"``) see each other in full. Text queries: query chunk a against
key chunk b is full if a > b, empty if a < b, and each rank's text work is equal by
the choice of cut points (Note [vlmcp zigzag cut points: equal chunks or equal causal
work]). Image queries: an image after text sees that text, most of which lives on
other ranks. Every rank computes its (replicated) image queries against the text
chunks as they pass by, so image queries never need a message of their own; this
repeats ``image tokens x text before them`` pairs on each rank (exact under share
semantics: each rank backpropagates its own share of the image outputs, and the
dK/dV of the passing chunks ride back with the ring's dK/dV). On chat rows, where
an image follows a prompt of ~15-40 tokens, that is a small fraction of the row's
pairs (``vlmcp bench plan`` reports it).

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
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from vlmcp.attention.blockwise import VarlenPlan, blocks_backward, blocks_forward
from vlmcp.attention.exchange import Exchange, exchange_of
from vlmcp.attention.kernels import AttentionKernel
from vlmcp.attention.masks import Block, Segment, cross_blocks, image_runs, runs_of, segments, self_blocks
from vlmcp.attention.merge import accumulator_dtype
from vlmcp.attention.ring_comm import RingComm
from vlmcp.layout.plan import RankShard

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
    _send_index: dict = field(default_factory=dict, repr=False, compare=False)
    _plans: dict = field(default_factory=dict, repr=False, compare=False)

    def plan(self, step: int) -> VarlenPlan:
        """The :class:`~vlmcp.attention.blockwise.VarlenPlan` of step ``step`` (built once, for
        kernels that batch: Note [vlmcp one kernel call per block])."""
        plan = self._plans.get(step)
        if plan is None:
            plan = self._plans[step] = VarlenPlan(self.step_blocks[step])
        return plan

    def send_index(self, device: torch.device) -> torch.Tensor:
        """``exchange.send_index`` on ``device``, copied once (not once per layer and direction)."""
        idx = self._send_index.get(device)
        if idx is None:
            idx = self._send_index[device] = self.exchange.send_index.to(device)
        return idx


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def image_offset_spans(shard: RankShard) -> list[tuple[int, int]]:
    """Per image of the row (row order), its ``[start, end)`` sample offsets."""
    images = shard.plan.images
    start = images.offsets[images.spans[:, 0]]
    return list(zip(start.tolist(), (start + images.lens).tolist(), strict=True))


def local_segments(shard: RankShard, bidirectional: bool) -> list[Segment]:
    """The rank's local samples as :class:`Segment` s (valid slots are each segment's prefix)."""
    n_samples = shard.plan.num_samples
    valid = torch.zeros(n_samples, dtype=torch.long).index_add_(
        0, shard.sample_ids, (shard.positions >= 0).long())
    spans = image_runs(shard.image_index, shard.plan.images.samples) if bidirectional else []
    return segments(n_samples, shard.cu_seqlens[:-1].tolist(), valid.tolist(), spans)


def buffer_runs(shard: RankShard, positions: torch.Tensor, bidirectional: bool) -> list:
    """Runs of a packed buffer of global ``positions`` (split at images when bidirectional)."""
    images = shard.plan.images
    return runs_of(images.sample_ids[positions], images.offsets[positions],
                   images.image_ids[positions] if bidirectional else None)


def ring_schedule(shard: RankShard, image_attention: str, window: int = 0) -> RingSchedule:
    """Build (or fetch) the :class:`RingSchedule` of ``shard``. See Note [vlmcp ring attention schedule].

    With a sliding ``window`` (:func:`~vlmcp.attention.masks.windowed`) the blocks of a
    step that fall wholly outside it are dropped (K/V still travel: the ring is fixed).
    """
    per_shard = _CACHE.setdefault(shard, {})
    key = image_attention if not window else (image_attention, window)
    if key in per_shard:
        return per_shard[key]
    ex = exchange_of(shard)
    bidir = image_attention == "bidirectional"
    spans = image_offset_spans(shard) if bidir else []
    q_runs = runs_of(shard.sample_ids, shard.offsets, shard.image_index if bidir else None)
    # a rank's zigzag chunks are not contiguous in offsets: windowed, they go through runs
    steps = [tuple(cross_blocks(q_runs, q_runs, spans, window) if window
                   else self_blocks(local_segments(shard, bidir)))]
    for s in range(1, shard.cp_size):
        k_runs = buffer_runs(shard, ex.positions[(shard.rank - s) % shard.cp_size], bidir)
        steps.append(tuple(cross_blocks(q_runs, k_runs, spans, window)))
    sched = RingSchedule(exchange=ex, step_blocks=tuple(steps))
    per_shard[key] = sched
    return sched


def _heads(x: torch.Tensor) -> torch.Tensor:
    """``(N, H, D)`` -> ``(H, N, D)`` view (the kernels accept strided inputs)."""
    return x.transpose(0, 1)


class _RingAttention(torch.autograd.Function):
    """Ring attention of this rank's queries over the whole row.

    Forward: ``q (N, H, D), k (N, Hk, D), v (N, Hk, Dv) -> out (N, H, Dv), lse (N, H)``.
    Backward (the dual ring): ``dout (N, H, Dv) -> dq (N, H, D), dk (N, Hk, D), dv (N, Hk, Dv)``;
    K and V travel as one ``(n, Hk, D + Dv)`` buffer (MLA: ``Dv != D``);
    dK/dV of travelling tokens come back to their owner; dK/dV of replicated image
    tokens hold this rank's share (its own queries' contribution). lse is not
    differentiable; non-tensor inputs get ``None``.
    """

    @staticmethod
    def forward(ctx, q, k, v, sched: RingSchedule, group, scale: float, kernel: AttentionKernel):
        ex = sched.exchange
        P, r = ex.cp_size, ex.rank
        acc = accumulator_dtype(q.dtype)
        N, H = q.shape[:2]
        dk_ = k.shape[2]
        out = q.new_zeros((N, H, v.shape[2]), dtype=acc)
        lse = q.new_full((N, H), float("-inf"), dtype=acc)
        touched = torch.zeros(N, dtype=torch.bool)
        oh, lh = _heads(out), lse.t()
        comm = RingComm(group) if P > 1 else None
        idx = sched.send_index(q.device)
        kv = _pack(k[idx], v[idx]) if P > 1 else None
        for s in range(P):
            if s + 1 < P:
                nxt = kv.new_empty((ex.counts[(r - s - 1) % P], *kv.shape[1:]))
                comm.send_recv(kv, nxt)
                comm.commit()
            if s == 0:
                kh, vh = _heads(k), _heads(v)
            else:
                kh, vh = _heads(kv[..., :dk_]), _heads(kv[..., dk_:])
            blocks_forward(kernel, _heads(q), kh, vh, sched.step_blocks[s], scale, oh, lh, touched,
                           sched.plan(s))
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
        idx = sched.send_index(q.device)
        if P == 1:
            blocks_backward(kernel, *args, _heads(k), _heads(v), *tail, sched.step_blocks[0], scale,
                            _heads(dq), _heads(dk), _heads(dv), sched.plan(0))
            return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None
        kv_comm, dkv_comm = RingComm(ctx.group), RingComm(ctx.group)
        kv = _pack(k[idx], v[idx])
        dk_ = k.shape[2]
        partial = None  # dK/dV arriving from r-1 for the owner held next
        for s in range(P):
            if s + 1 < P:
                nxt = kv_comm.send_recv(kv, kv.new_empty((ex.counts[(r - s - 1) % P], *kv.shape[1:])))
                kv_comm.commit()
            if s == 0:
                blocks_backward(kernel, *args, _heads(k), _heads(v), *tail, sched.step_blocks[0], scale,
                                _heads(dq), _heads(dk), _heads(dv), sched.plan(0))
            else:
                dkv = kv.new_zeros(kv.shape, dtype=acc)
                blocks_backward(kernel, *args, _heads(kv[..., :dk_]), _heads(kv[..., dk_:]), *tail,
                                sched.step_blocks[s], scale, _heads(dq), _heads(dkv[..., :dk_]),
                                _heads(dkv[..., dk_:]), sched.plan(s))
                if s >= 2:
                    dkv_comm.wait()
                    dkv += partial
                partial = dkv.new_empty((ex.counts[(r - s - 1) % P], *kv.shape[1:]))
                dkv_comm.send_recv(dkv, partial)
                dkv_comm.commit()
            if s + 1 < P:
                kv_comm.wait()
                kv = nxt
        dkv_comm.wait()
        dk.index_add_(0, idx, partial[..., :dk_])
        dv.index_add_(0, idx, partial[..., dk_:])
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def _pack(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """K and V as one send buffer ``(n, Hk, D + Dv)``: one transfer per step, any ``Dv`` (MLA)."""
    return torch.cat([k, v], dim=-1)


def ring_attention(q, k, v, shard: RankShard, group: dist.ProcessGroup, image_attention: str,
                   scale: float, kernel: AttentionKernel, window: int = 0):
    """Ring CP attention (inputs already validated by :func:`vlmcp.attention.cp_attention`).

    Returns:
        ``out (N, H, D)`` and ``lse (N, H)``.
    """
    return _RingAttention.apply(q, k, v, ring_schedule(shard, image_attention, window), group, scale,
                                kernel)
