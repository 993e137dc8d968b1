"""Run a list of blocks through a kernel, merging partial results; single-process varlen attention.

:func:`blocks_forward` / :func:`blocks_backward` are the compute half of every CP
schedule (the ring calls them once per step, Ulysses once on its gathered row).
:func:`varlen_attention` is packed-row attention in one process, built from the
same blocks: it is what CP attention must reproduce, at kernel speed.

Note [vlmcp one kernel call per block]
--------------------------------------
A row of S short samples costs about 2S kernel calls (and S merges) per ring step.
Batching a step's equal-shape blocks into one ``(B, H, L, D)`` call is exact, but on
the CPU it does not pay (torch 2.13, one thread, 8 heads of 64, float32, measured on
64 samples of 128 tokens at P = 2, rank 0's blocks, B = 64)::

    fixed cost of one call          forward 30-70 us, merge 70-85 us, backward 70-150 us
                                    = 18-33 ms of 180-225 ms per rank and layer (the ceiling)
    batched kernel alone            forward 1.0-1.4x faster, backward 1.6-2.1x SLOWER
    batched step, gathers included  forward 0.5-1.0x, backward 0.5-1.2x (B = 2, 8, 64)
    whole fwd+bwd, two ranks        431-886 ms per-block, 779-1767 ms batched (2 runs)

Packed rows of real data also have few blocks of equal shape, and a block-diagonal
dense mask would compute every cross-sample pair. So on the CPU each block is its own
call. What pays there is calling less: ``plan_cp(..., sample_placement="whole"|"auto")``
puts short samples whole on one rank (Note [vlmcp whole-sample placement]), so a rank
makes one causal call per sample it owns, about S/P, and no ring step or merge touches
them; ``vlmcp bench attention --samples N --sample-placement auto`` measures it.

On CUDA with flash-attn (``kernel.batches(q)``: fp16/bf16, head_dim <= 256 and % 8,
sm80+, flash-attn >= 2.7) blocks of any shape batch without padding: one
``flash_attn_varlen_func``-style call (``_flash_attn_varlen_forward/backward``) takes
every block as one packed sequence. :class:`VarlenPlan` splits a step's blocks into::

    rounds   FULL blocks and square CAUSAL blocks, coloured greedily by query start
             into rounds of one kind whose query ranges are disjoint (interval
             colouring: the fewest rounds, the most blocks of that kind any query row
             has). One call per round, causal=True for causal rounds; flash-attn's
             bottom-right causal equals vlmcp's top-left one only on square blocks.
    rest     MASKED and non-square CAUSAL blocks: one call each, as before
             (FlashAttnKernel sends them to SDPA / math).

A zigzag ring step is then one call per direction (causal step 0: every sample is one
square causal block; steps >= 1 are full blocks with disjoint query runs), two at step
0 under bidirectional images (the full blocks, then the causal ones); tested on the
stand-ins in ``tests/test_varlen_batching.py``. Per round: a slice (a view) when the
round's query (key) ranges tile one contiguous range, e.g. one long sample's causal
block, so a single-block round costs what one block's call did; else ``index_select``
packs the q/k/v rows (and, backward, dout/out rows and the lse columns), the round's (out, lse)
is merged into gathered accumulator rows with the fp32 :func:`merge_` and written back
with ``index_copy_`` (rows are disjoint inside a round; merging into untouched rows,
``out = 0`` and ``lse = -inf``, is an exact copy); dQ/dK/dV are added with
``index_add_`` into the fp32/64 accumulators (key rows repeat across blocks: on CUDA
the order of those adds is not fixed unless ``torch.use_deterministic_algorithms``).
dK/dV are rounded to the input dtype once per block, as in the per-block path, so
batched and per-block results agree (bitwise on the CPU stand-ins). The index
tensors and ``cu_seqlens`` are built on the host once per block list (the ring caches
one plan per step on its :class:`~vlmcp.attention.ring.RingSchedule`; ``_BlockwiseAttention``,
Ulysses and :func:`varlen_attention` use an LRU cache keyed by the blocks) and copied
to each device once, so a layer makes no host-device copy or sync. Without
flash-attn (fp32, head_dim > 256, older GPUs or flash-attn) the SDPA kernel keeps one
call per block: that is the fallback. The batched path has not yet run on a GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from vlmcp.attention.kernels import AttentionKernel, VarlenRound, select_kernel
from vlmcp.attention.masks import Block, MaskKind, segments, self_blocks
from vlmcp.attention.merge import accumulator_dtype, merge_
from vlmcp.layout.images import row_images
from vlmcp.layout.validate import check_cu_seqlens, check_is_image

__all__ = ["VarlenPlan", "blocks_backward", "blocks_forward", "blockwise_attention", "varlen_attention",
           "varlen_plan"]


class VarlenPlan:
    """A block list split for batching kernels: varlen rounds, and the blocks left per-block.

    ``FULL`` blocks and square ``CAUSAL`` blocks are coloured greedily, by query start,
    into rounds of one kind whose query ranges are disjoint (interval colouring, so the
    fewest rounds: the most key blocks any query row has of that kind). ``MASKED`` and
    non-square ``CAUSAL`` blocks stay in :attr:`rest`. Host metadata is built once;
    :meth:`on` copies the index tensors to a device once (no host-device copy per call).

    Attributes:
        rounds: the :class:`VarlenRound` s (CPU tensors), full rounds first.
        rest: the blocks computed one call each.
        rows: ``LongTensor``, every query row some round writes (marks ``touched``).
    """

    def __init__(self, blocks: Sequence[Block]):
        groups: dict[bool, list[list[Block]]] = {False: [], True: []}
        ends: dict[bool, list[int]] = {False: [], True: []}
        self.rest: tuple[Block, ...] = tuple(
            b for b in blocks if not (b.kind is MaskKind.FULL or _square_causal(b)))
        for b in sorted((b for b in blocks if b.kind is MaskKind.FULL or _square_causal(b)),
                        key=lambda b: (b.q_start, b.k_start)):
            causal = b.kind is MaskKind.CAUSAL
            free = next((i for i, e in enumerate(ends[causal]) if e <= b.q_start), None)
            if free is None:
                groups[causal].append([b])
                ends[causal].append(b.q_end)
            else:
                groups[causal][free].append(b)
                ends[causal][free] = b.q_end
        self.rounds = tuple(_round(causal, g) for causal in (False, True) for g in groups[causal])
        self.rows = torch.cat([torch.zeros(0, dtype=torch.long), *(r.q_index for r in self.rounds)])
        self._on: dict = {}

    def on(self, device: torch.device) -> tuple[VarlenRound, ...]:
        """:attr:`rounds` with their tensors on ``device`` (copied once per device)."""
        rounds = self._on.get(device)
        if rounds is None:
            rounds = self._on[device] = tuple(r.to(device) for r in self.rounds)
        return rounds


def _square_causal(b: Block) -> bool:
    return b.kind is MaskKind.CAUSAL and b.q_end - b.q_start == b.k_end - b.k_start


def _span(ranges: list[tuple[int, int]]) -> tuple[int, int] | None:
    """``(start, stop)`` when the ranges, in order, tile one contiguous range."""
    tiles = all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    return (ranges[0][0], ranges[-1][1]) if tiles else None


def _round(causal: bool, blocks: list[Block]) -> VarlenRound:
    lq = [b.q_end - b.q_start for b in blocks]
    lk = [b.k_end - b.k_start for b in blocks]
    return VarlenRound(
        causal,
        torch.cat([torch.arange(b.q_start, b.q_end) for b in blocks]),
        torch.cat([torch.arange(b.k_start, b.k_end) for b in blocks]),
        torch.tensor([0, *lq], dtype=torch.int64).cumsum(0).to(torch.int32),
        torch.tensor([0, *lk], dtype=torch.int64).cumsum(0).to(torch.int32),
        max(lq), max(lk),
        _span([(b.q_start, b.q_end) for b in blocks]), _span([(b.k_start, b.k_end) for b in blocks]))


def _rows(x: torch.Tensor, index: torch.Tensor, span: tuple[int, int] | None) -> torch.Tensor:
    """Rows of ``x (N, ...)``: a slice (a view, no copy) for a contiguous span, else a gather."""
    return x[span[0]:span[1]] if span is not None else x.index_select(0, index)


def _add_rows(acc: torch.Tensor, index: torch.Tensor, span: tuple[int, int] | None, x: torch.Tensor) -> None:
    """``acc[rows] += x`` (rows may repeat when gathered: ``index_add_``)."""
    if span is not None:
        acc[span[0]:span[1]] += x
    else:
        acc.index_add_(0, index, x.to(acc.dtype))


@functools.lru_cache(maxsize=256)
def _cached_plan(blocks: tuple[Block, ...]) -> VarlenPlan:
    return VarlenPlan(blocks)


def varlen_plan(blocks: Sequence[Block]) -> VarlenPlan:
    """The :class:`VarlenPlan` of ``blocks``, cached by value (schedules reuse their block lists)."""
    return _cached_plan(tuple(blocks))


def _batches(kernel: AttentionKernel, q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the blocks go to ``kernel``'s varlen calls: flash-attn's varlen kernel needs one
    head dim for Q/K and V, so MLA (``Dv != D``) runs per block (the SDPA kernel)."""
    return kernel.batches(q) and v.shape[-1] == q.shape[-1]


def _per_block_forward(kernel, q, k, v, blocks, scale, out, lse, touched):
    for b in blocks:
        qs, qe, ks, ke = b.q_start, b.q_end, b.k_start, b.k_end
        bo, bl = kernel.forward(q[:, qs:qe], k[:, ks:ke], v[:, ks:ke], b, scale)
        if bool(touched[qs:qe].any()):  # untouched rows (0, -inf) merge as a copy
            merge_(out[:, qs:qe], lse[:, qs:qe], bo, bl)
        else:
            out[:, qs:qe] = bo
            lse[:, qs:qe] = bl
        touched[qs:qe] = True  # also after a merge: a block may reach past the touched rows


def blocks_forward(kernel: AttentionKernel, q, k, v, blocks: Sequence[Block], scale: float,
                   out: torch.Tensor, lse: torch.Tensor, touched: torch.Tensor,
                   plan: VarlenPlan | None = None) -> None:
    """Compute ``blocks`` and merge them into the accumulators, in place.

    One kernel call per block, or, where ``kernel.batches(q)`` (flash-attn on CUDA), one
    varlen call per round of :class:`VarlenPlan`: Note [vlmcp one kernel call per block].

    Args:
        kernel: the local kernel.
        q: ``(H, Nq, D)``; k, v: ``(Hk, Nk, D)``. Block indices address dim 1.
        blocks: non-empty blocks (see :mod:`vlmcp.attention.masks`).
        scale: softmax scale.
        out: ``(H, Nq, D)`` accumulator (float32/64), zero where nothing was seen.
        lse: ``(H, Nq)`` accumulator, ``-inf`` where nothing was seen.
        touched: ``BoolTensor[Nq]`` (CPU), rows already written; rows of a block that
            nobody wrote yet are copied instead of merged. Updated in place.
        plan: ``varlen_plan(blocks)`` when the caller caches it (the ring's schedule).
    """
    if not blocks or not _batches(kernel, q, v):
        _per_block_forward(kernel, q, k, v, blocks, scale, out, lse, touched)
        return
    plan = varlen_plan(blocks) if plan is None else plan
    _per_block_forward(kernel, q, k, v, plan.rest, scale, out, lse, touched)
    qr, kr, vr = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # (N, H, D) views
    for rnd in plan.on(q.device):
        ki, ks = rnd.k_index, rnd.k_span
        bo, bl = kernel.forward_varlen(_rows(qr, rnd.q_index, rnd.q_span), _rows(kr, ki, ks),
                                       _rows(vr, ki, ks), rnd, scale)
        # rows are disjoint within a round; merging into untouched rows (0, -inf) is a copy
        if rnd.q_span is not None:
            a, b = rnd.q_span
            merge_(out[:, a:b], lse[:, a:b], bo.transpose(0, 1), bl)
            continue
        o, l_ = out.index_select(1, rnd.q_index), lse.index_select(1, rnd.q_index)
        merge_(o, l_, bo.transpose(0, 1), bl)
        out.index_copy_(1, rnd.q_index, o)
        lse.index_copy_(1, rnd.q_index, l_)
    touched[plan.rows] = True


def blocks_backward(kernel: AttentionKernel, dout, q, k, v, out, lse, blocks: Sequence[Block],
                    scale: float, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                    plan: VarlenPlan | None = None) -> None:
    """Accumulate the gradients of ``blocks`` into ``dq``, ``dk``, ``dv`` (in place).

    Batched like :func:`blocks_forward`; each round's dQ/dK/dV are added with
    ``index_add_`` into the float32/64 accumulators (dK/dV rows repeat across blocks).

    Args:
        dout, out: ``(H, Nq, D)`` in the input dtype; ``out`` is the final output.
        lse: ``(H, Nq)`` final log-sum-exp (accumulator dtype).
        q: ``(H, Nq, D)``; k, v: ``(Hk, Nk, D)``.
        dq: ``(H, Nq, D)``; dk, dv: ``(Hk, Nk, D)`` accumulators (float32/64).
        plan: as for :func:`blocks_forward`.
    """
    rest = blocks
    if blocks and _batches(kernel, q, v):
        plan = varlen_plan(blocks) if plan is None else plan
        rest = plan.rest
        rows = [x.transpose(0, 1) for x in (dout, q, k, v, out)]  # (N, H, D) views
        dqr, dkr, dvr = dq.transpose(0, 1), dk.transpose(0, 1), dv.transpose(0, 1)
        for rnd in plan.on(q.device):
            qi, ki, qs, ks = rnd.q_index, rnd.k_index, rnd.q_span, rnd.k_span
            do_, q_, k_, v_, o_ = (_rows(x, i, sp) for x, i, sp in
                                   zip(rows, (qi, qi, ki, ki, qi), (qs, qs, ks, ks, qs), strict=True))
            lse_ = lse[:, qs[0]:qs[1]] if qs is not None else lse.index_select(1, qi)
            gq, gk, gv = kernel.backward_varlen(do_, q_, k_, v_, o_, lse_, rnd, scale)
            _add_rows(dqr, qi, qs, gq)
            _add_rows(dkr, ki, ks, gk)
            _add_rows(dvr, ki, ks, gv)
    for b in rest:
        qs, qe, ks, ke = b.q_start, b.q_end, b.k_start, b.k_end
        gq, gk, gv = kernel.backward(dout[:, qs:qe], q[:, qs:qe], k[:, ks:ke], v[:, ks:ke],
                                     out[:, qs:qe], lse[:, qs:qe], b, scale)
        dq[:, qs:qe] += gq
        dk[:, ks:ke] += gk
        dv[:, ks:ke] += gv


class _BlockwiseAttention(torch.autograd.Function):
    """Attention of one process over a block list.

    Forward: ``q (N, H, D), k, v (M, Hk, D) -> out (N, H, D), lse (N, H)``; rows in no
    block get ``out = 0``, ``lse = -inf``. Backward: ``dout (N, H, D) -> dq (N, H, D),
    dk, dv (M, Hk, D)`` through the kernel's backward with the final out/lse;
    lse is not differentiable.
    """

    @staticmethod
    def forward(ctx, q, k, v, blocks, scale, kernel):
        acc = accumulator_dtype(q.dtype)
        qh, kh, vh = (x.transpose(0, 1).contiguous() for x in (q, k, v))
        out = qh.new_zeros((*qh.shape[:2], vh.shape[2]), dtype=acc)  # MLA: V's head dim
        lse = qh.new_full(qh.shape[:2], float("-inf"), dtype=acc)
        touched = torch.zeros(qh.shape[1], dtype=torch.bool)
        blocks_forward(kernel, qh, kh, vh, blocks, scale, out, lse, touched)
        out = out.to(q.dtype)
        ctx.save_for_backward(qh, kh, vh, out, lse)
        ctx.blocks, ctx.scale, ctx.kernel = blocks, scale, kernel
        lse_t = lse.transpose(0, 1)
        ctx.mark_non_differentiable(lse_t)
        return out.transpose(0, 1), lse_t

    @staticmethod
    def backward(ctx, dout, _dlse):
        qh, kh, vh, out, lse = ctx.saved_tensors
        acc = lse.dtype
        dq, dk, dv = (x.new_zeros(x.shape, dtype=acc) for x in (qh, kh, vh))
        douth = dout.transpose(0, 1).contiguous().to(qh.dtype)
        blocks_backward(ctx.kernel, douth, qh, kh, vh, out, lse, ctx.blocks, ctx.scale, dq, dk, dv)
        return (dq.to(qh.dtype).transpose(0, 1), dk.to(kh.dtype).transpose(0, 1),
                dv.to(vh.dtype).transpose(0, 1), None, None, None)


def blockwise_attention(q, k, v, blocks: Sequence[Block], scale: float, kernel: AttentionKernel):
    """Differentiable attention of ``q (N, H, D)`` over ``k, v (M, Hk, D)`` restricted to ``blocks``.

    Returns:
        ``out (N, H, D)`` in q's dtype and ``lse (N, H)`` (float32/64, not differentiable).
    """
    return _BlockwiseAttention.apply(q, k, v, list(blocks), scale, kernel)


def varlen_attention(q, k, v, cu_seqlens, is_image=None, image_attention: str = "causal",
                     softmax_scale: float | None = None, kernel: str | None = None, image_ids=None):
    """Single-process attention over a packed row, at kernel speed (a few blocks per sample).

    Args:
        q: ``(L, H, D)``; k, v: ``(L, Hk, D)``.
        cu_seqlens: ``IntTensor[S+1]`` sample boundaries.
        is_image: ``BoolTensor[L]``, image tokens anywhere in their samples (None: none);
            only bidirectional image attention reads it.
        image_attention: ``"causal"`` or ``"bidirectional"`` (the tokens of each image
            see each other).
        softmax_scale: default ``head_dim ** -0.5``.
        kernel: force a kernel by name (see :func:`~vlmcp.attention.kernels.select_kernel`).
        image_ids: as for :func:`vlmcp.plan_cp` (None: each image-token run is one image).

    Returns:
        ``out (L, H, D)`` and ``lse (L, H)``.
    """
    if image_attention not in ("causal", "bidirectional"):
        raise ValueError(f"image_attention must be 'causal' or 'bidirectional', got {image_attention!r}")
    L = q.shape[0]
    cu_t = check_cu_seqlens(cu_seqlens, L)
    cu = cu_t.tolist()
    spans = []
    if image_attention == "bidirectional" and is_image is not None:
        check_is_image(is_image)
        row = row_images(is_image.detach().cpu(), cu_t, image_ids)
        spans = [(s, a, b) for s, (a, b) in zip(row.samples.tolist(), row.spans.tolist(), strict=True)]
    segs = segments(len(cu) - 1, cu[:-1], [b - a for a, b in zip(cu[:-1], cu[1:], strict=True)], spans)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    return blockwise_attention(q, k, v, self_blocks(segs), scale,
                               select_kernel(q.device, q.dtype, kernel))
