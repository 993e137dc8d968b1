"""Local attention kernels behind one small interface; all device and version handling.

A kernel computes one :class:`~vlmcp.attention.masks.Block` of attention and its
backward::

    forward(q, k, v, block, scale) -> (out, lse)
    backward(dout, q, k, v, out, lse, block, scale) -> (dq, dk, dv)

with head-major tensors: ``q, out, dout, dq: (H, Lq, D)``; ``k, v, dk, dv: (Hk, Lk, D)``
(GQA: ``H % Hk == 0``, query head h uses key head ``h // (H // Hk)``); ``lse: (H, Lq)`` in
the accumulator dtype (float32, float64 for float64 inputs). ``block.kind`` is ``FULL``,
``CAUSAL`` (top-left aligned) or ``MASKED`` (dense mask from the block's offsets).
A query that sees no key has ``out = 0`` and ``lse = -inf``. In ``backward``,
``out`` and ``lse`` are the *final* (merged over every block) values for these
queries, which makes the block's gradients exact parts of the total. The inputs may
be strided views (the ring passes ``(N, H, D)`` storage seen as ``(H, N, D)``).

A kernel that can batch (``batches(q)`` true: flash-attn on CUDA) also computes many
blocks in one call::

    forward_varlen(q, k, v, round, scale) -> (out, lse)
    backward_varlen(dout, q, k, v, out, lse, round, scale) -> (dq, dk, dv)

on packed row-major tensors (``q, out, dout, dq: (Tq, H, D)``; ``k, v, dk, dv: (Tk, Hk, D)``;
``lse: (H, Tq)`` float32), one varlen sequence per block of the :class:`VarlenRound`
(Note [vlmcp one kernel call per block] in :mod:`vlmcp.attention.blockwise`).

Kernels: ``flash_cpu`` (PyTorch's flash kernel for CPU, which returns the
log-sum-exp), ``math`` (pure torch, any device: the reference), ``sdpa`` (CUDA,
PyTorch's memory-efficient kernel, which returns the log-sum-exp) and ``flash_attn``
(CUDA, the flash-attn package's varlen kernel, fp16/bf16). :func:`select_kernel`
picks from the tensors' device and dtype (:func:`cuda_kernel_name` on CUDA).

Note [vlmcp CUDA kernel contracts]
----------------------------------
What the CUDA kernels need, read in the sources (PyTorch ``aten/src/ATen/native/
transformers/cuda``, flash-attn 2.6.3-2.8.3 ``flash_attn_interface.py`` and
``csrc/flash_attn/flash_api.cpp``), since nothing here runs them on a CPU machine::

    memory-efficient backward   _efficient_attention_backward passes only out.stride(0)
    reads `out` row-major       and out.stride(2) (batch, head); Params::o_strideM() is
                                head_dim_value * num_heads. fp16/bf16 kernels compute
                                delta = rowsum(dout * out) themselves (kKernelComputesDelta
                                = kIsHalf && ...), so `out` must be (L, H, D)-contiguous
                                or dQ/dK are wrong; fp32 gets delta from torch. `dout` is
                                made contiguous in (B, L, H, D) there: pass it so, no copy.
    its lse                     (B, H, ceil(L / 32) * 32), the forward pads it with +inf
                                ("to make the backward easier"); +inf gives p = 0 exactly.
    its dtypes                  DISPATCH_TYPES: "Only fp32, half & bf16": float64 -> math.
    flash-attn >= 2.7           _flash_attn_varlen_forward/backward are
                                torch.library.custom_op objects on torch >= 2.4: their
                                signature reads (*args, **kwargs), so the version is
                                checked, not the signature; 2.6.x returns 8 values and
                                takes window_size as a tuple (not supported here).
    flash-attn limits           fp16/bf16, head_dim % 8 == 0 and <= 256 (forward and
                                backward); sm8x or sm90 up to 2.7.2, cc_major >= 8 from
                                2.7.3; lse (H, total_q) float32; an empty key set gets
                                lse = +inf (like the memory-efficient kernel's padding).
    flash-attn varlen           q/k/v packed (total, H, D), last dim contiguous;
                                cu_seqlens_q/k int32 (B+1,) on the device, one k range
                                per q range; max_seqlen_q/k host ints >= every length
                                (they size the grid: computed once, on the host). Each
                                sequence is attended alone, so sequences must not
                                share query rows (each writes its own out/lse rows) but
                                may repeat key rows (gathered: dK/dV come back per
                                copy and are index_add-ed). causal=True is aligned
                                bottom-right: only square CAUSAL blocks are batched
                                as causal, where it equals vlmcp's top-left causal.

A row that saw no key (final ``lse = -inf``) is handed to every backward with
``dout = 0`` and ``lse = +inf``: both kernels then compute ``p = exp(s - lse) = 0``
whatever the scores; ``lse = 0`` would give ``exp(s)``, which overflows for large
scores (``inf * 0 = NaN``). None of this reads device data on the host: no ``bool()``,
``.item()`` or host-built device tensor in a per-block call (the CUDA check runs these
kernels under ``torch.cuda.set_sync_debug_mode("error")``).
"""

from __future__ import annotations

import functools
import math
import re
from typing import NamedTuple

import torch

from vlmcp.attention.masks import Block, MaskKind, dense_mask
from vlmcp.attention.merge import accumulator_dtype

__all__ = ["KERNELS", "AttentionKernel", "VarlenRound", "cuda_kernel_name", "flash_attn_runs_on",
           "flash_attn_supports", "flash_attn_version", "select_kernel"]

FLASH_ATTN_MIN_VERSION = (2, 7)
"""The internal varlen API this module calls (``window_size_left/right``, four return values)."""
FLASH_ATTN_MAX_HEAD_DIM = 256
_HALF = (torch.float16, torch.bfloat16)


class AttentionKernel:
    """The interface every local kernel implements (see the module docstring)."""

    name = "abstract"

    def forward(self, q, k, v, block: Block, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def backward(self, dout, q, k, v, out, lse, block: Block, scale: float):
        raise NotImplementedError

    def batches(self, q: torch.Tensor) -> bool:
        """Whether :meth:`forward_varlen` / :meth:`backward_varlen` run blocks of ``q``'s
        dtype and head_dim (a host-side check, no device read). Default: no, one call per block."""
        return False

    def forward_varlen(self, q, k, v, rnd: VarlenRound, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """One call for the blocks of ``rnd``: packed ``q (Tq, H, D)``, ``k, v (Tk, Hk, D)``
        (contiguous) -> ``out (Tq, H, D)`` in q's dtype and ``lse (H, Tq)`` float32."""
        raise NotImplementedError

    def backward_varlen(self, dout, q, k, v, out, lse, rnd: VarlenRound, scale: float):
        """The gradients of :meth:`forward_varlen`: packed ``dq (Tq, H, D)``, ``dk, dv (Tk, Hk, D)``.

        ``out``, ``dout``: ``(Tq, H, D)``; ``lse``: ``(H, Tq)``, the final values (as in
        :meth:`backward`)."""
        raise NotImplementedError


class VarlenRound(NamedTuple):
    """Blocks that one varlen call computes: sequence i is block i's query rows against its keys.

    No two blocks of a round share a query row (so one merge per row), all have the
    same kind: ``causal`` (square ``CAUSAL`` blocks, where flash-attn's bottom-right
    alignment is vlmcp's top-left) or full. Built on the host once per block list and
    copied to each device once (:func:`vlmcp.attention.blockwise.varlen_plan`).

    Attributes:
        causal: the kernel's causal flag.
        q_index, k_index: ``LongTensor[Tq]`` / ``[Tk]``, the storage rows packed, block by block.
        cu_q, cu_k: ``IntTensor[B+1]``, the packed sequences' boundaries.
        max_q, max_k: host ints, the longest query / key range.
        q_span, k_span: ``(start, stop)`` when ``q_index`` / ``k_index`` is that one
            contiguous range (then rows are sliced, not gathered and scattered), else None.
    """

    causal: bool
    q_index: torch.Tensor
    k_index: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    q_span: tuple[int, int] | None = None
    k_span: tuple[int, int] | None = None

    def to(self, device) -> VarlenRound:
        names = ("q_index", "k_index", "cu_q", "cu_k")
        return self._replace(**{n: getattr(self, n).to(device) for n in names})


def _seen(block: Block, lq: int, lk: int, device) -> torch.Tensor:
    if block.kind is MaskKind.FULL:
        return torch.ones(lq, lk, dtype=torch.bool, device=device)
    if block.kind is MaskKind.CAUSAL:
        return torch.ones(lq, lk, dtype=torch.bool, device=device).tril()
    return dense_mask(block, lq, lk, device=device)


def _backward_rows(dout, lse):
    """Rows with lse = -inf saw no key anywhere: ``dout = 0`` and ``lse = +inf`` there.

    See Note [vlmcp CUDA kernel contracts]. Unconditional ``masked_fill``: checking
    first (``bool(dead.any())``) would be a host-device sync per block on CUDA.
    """
    dead = torch.isneginf(lse)
    return dout.masked_fill(dead.unsqueeze(-1), 0), lse.masked_fill(dead, float("inf"))


def _expand_heads(x: torch.Tensor, g: int) -> torch.Tensor:
    """``(Hk, L, D)`` -> ``(Hk * g, L, D)``, head h of the result is head ``h // g`` (GQA).

    ``expand`` + ``reshape`` (one copy): ``repeat_interleave(int)`` builds an index tensor
    on the device and gathers with it.
    """
    return x if g == 1 else x[:, None].expand(x.shape[0], g, *x.shape[1:]).reshape(-1, *x.shape[1:])


def _rows_major(x: torch.Tensor) -> torch.Tensor:
    """``(H, L, D)`` with ``(L, H, D)``-contiguous memory (no copy when it already is)."""
    return x.transpose(0, 1).contiguous().transpose(0, 1)


class MathKernel(AttentionKernel):
    """Pure torch in the accumulator dtype, any device. The reference; O(Lq * Lk) memory."""

    name = "math"

    def _probs(self, q, k, block, scale):
        acc = accumulator_dtype(q.dtype)
        g = q.shape[0] // k.shape[0]
        kk = k.to(acc).repeat_interleave(g, 0)
        s = torch.matmul(q.to(acc), kk.transpose(-1, -2)) * scale
        seen = _seen(block, q.shape[1], k.shape[1], q.device)
        s = s.masked_fill(~seen, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0.0).unsqueeze(-1))
        return p, lse, kk, g

    def forward(self, q, k, v, block, scale):
        p, lse, _, g = self._probs(q, k, block, scale)
        out = torch.matmul(p, v.to(p.dtype).repeat_interleave(g, 0))
        return out.to(q.dtype), lse

    def backward(self, dout, q, k, v, out, lse, block, scale):
        acc = accumulator_dtype(q.dtype)
        dout, lse = _backward_rows(dout, lse)
        g = q.shape[0] // k.shape[0]
        kk, vv = k.to(acc).repeat_interleave(g, 0), v.to(acc).repeat_interleave(g, 0)
        s = torch.matmul(q.to(acc), kk.transpose(-1, -2)) * scale
        seen = _seen(block, q.shape[1], k.shape[1], q.device)
        p = torch.exp(s - lse.to(acc).unsqueeze(-1)).masked_fill(~seen, 0.0)
        do = dout.to(acc)
        delta = (do * out.to(acc)).sum(-1, keepdim=True)
        ds = p * (torch.matmul(do, vv.transpose(-1, -2)) - delta)
        dq = torch.matmul(ds, kk) * scale
        dk = torch.matmul(ds.transpose(-1, -2), q.to(acc)) * scale
        dv = torch.matmul(p.transpose(-1, -2), do)
        hk = k.shape[0]
        dk = dk.view(hk, g, *dk.shape[1:]).sum(1)
        dv = dv.view(hk, g, *dv.shape[1:]).sum(1)
        return dq, dk, dv


def _pad_head_dim(x: torch.Tensor, d: int) -> torch.Tensor:
    """``x (..., D0)`` zero-padded to ``(..., d)`` (no copy when ``D0 == d``)."""
    return x if x.shape[-1] == d else torch.nn.functional.pad(x, (0, d - x.shape[-1]))


def _same_head_dim(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """q, k, v zero-padded to one head dim ``max(D, Dv)``: exact for attention (MLA, ``Dv != D``)."""
    d = max(q.shape[-1], v.shape[-1])
    return _pad_head_dim(q, d), _pad_head_dim(k, d), _pad_head_dim(v, d)


class CpuFlashKernel(AttentionKernel):
    """``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward (native GQA).

    Note: for a row whose mask hides every key it returns ``out = 0`` and
    ``lse = 0`` (torch 2.13), which a merge would count as weight ``exp(0)``; such
    rows are set to ``lse = -inf`` here. Its float32/bf16 kernels also return
    ``out = 0``, ``lse = 0`` for a query row holding a NaN (without a mask; float64
    and masked calls give NaN), which would hide bad data: such rows are set to NaN,
    as one process computes them. It also crashes on a zero-length query (callers
    never pass empty blocks), and it needs one head dim for Q, K and V: for MLA
    (``Dv != D``) the narrower side is zero-padded (:func:`_same_head_dim`), which is
    exact (zero columns add nothing to ``q . k`` or to ``rowsum(dout * out)``; the
    padded outputs and gradients are sliced off) and keeps the flash kernel's speed.
    """

    name = "flash_cpu"

    @staticmethod
    def _mask(block, q, lk):
        if block.kind is not MaskKind.MASKED:
            return None, None
        seen = dense_mask(block, q.shape[1], lk, device=q.device)
        bias = torch.zeros(seen.shape, dtype=q.dtype, device=q.device).masked_fill(~seen, float("-inf"))
        return bias, ~seen.any(-1)

    def forward(self, q, k, v, block, scale):
        bias, dead = self._mask(block, q, k.shape[1])
        dv = v.shape[-1]
        q, k, v = _same_head_dim(q, k, v)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q[None], k[None], v[None], 0.0, block.kind is MaskKind.CAUSAL, attn_mask=bias, scale=scale)
        out, lse = out[0, ..., :dv], lse[0].to(accumulator_dtype(q.dtype))
        nan = torch.isnan(q).any(-1)  # (H, Lq); see the class docstring
        lse, out = lse.masked_fill(nan, float("nan")), out.masked_fill(nan[..., None], float("nan"))
        if dead is not None:  # a row that sees no key is 0 whatever its query holds
            lse = lse.masked_fill(dead, float("-inf"))
            out = out.masked_fill(dead[:, None], 0)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, block, scale):
        bias, _ = self._mask(block, q, k.shape[1])
        dout, lse = _backward_rows(dout, lse)
        kl = torch.float64 if q.dtype == torch.float64 else torch.float32
        d, d_v = q.shape[-1], v.shape[-1]
        q, k, v = _same_head_dim(q, k, v)
        dout, out = (_pad_head_dim(x, v.shape[-1]) for x in (dout, out))
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout[None], q[None], k[None], v[None], out[None], lse.to(kl)[None], 0.0,
            block.kind is MaskKind.CAUSAL, attn_mask=bias, scale=scale)
        return dq[0, ..., :d], dk[0, ..., :d], dv[0, ..., :d_v]


class CudaSdpaKernel(AttentionKernel):
    """CUDA: ``aten._scaled_dot_product_efficient_attention`` (returns the log-sum-exp).

    fp32, fp16 and bf16 (float64 goes to :class:`MathKernel`). GQA is expanded here and
    dK/dV are summed over each group in float32. Layouts, lse padding and dead rows
    follow Note [vlmcp CUDA kernel contracts]. Tested on CPU against stand-ins of the
    two aten ops (``tests/test_cuda_review.py``), on a GPU against :class:`MathKernel`.
    """

    name = "sdpa"
    _ALIGN = 32  # kAlignLSE: the kernel's lse holds ceil(Lq / 32) * 32 queries per head

    @staticmethod
    def _bias(block, q, lk):
        if block.kind is not MaskKind.MASKED:
            return None, None
        seen = dense_mask(block, q.shape[1], lk, device=q.device)
        # The backward rejects a bias whose row stride is not a multiple of its alignment
        # ("attn_bias is not correctly aligned (strideM)"), so rows live in a buffer
        # padded to 16 elements (what SDPA's pad_bias does) and the bias is a slice of
        # it. The fill must be in place: an out-of-place op on the slice would return a
        # compact (Lq, Lk) tensor and drop the padding.
        padded = torch.zeros(q.shape[1], math.ceil(lk / 16) * 16, dtype=q.dtype, device=q.device)
        padded[:, :lk].masked_fill_(~seen, float("-inf"))
        bias = padded[:, :lk]  # stride (ceil(lk / 16) * 16, 1)
        return bias[None, None].expand(1, q.shape[0], -1, -1), ~seen.any(-1)

    def forward(self, q, k, v, block, scale):
        g = q.shape[0] // k.shape[0]
        bias, dead = self._bias(block, q, k.shape[1])
        out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
            q[None], _expand_heads(k, g)[None], _expand_heads(v, g)[None], bias, True,
            0.0, block.kind is MaskKind.CAUSAL, scale=scale)
        out, lse = out[0], lse[0, :, : q.shape[1]].to(accumulator_dtype(q.dtype))
        if dead is not None:
            lse, out = lse.masked_fill(dead, float("-inf")), out.masked_fill(dead[:, None], 0)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, block, scale):
        g, hk = q.shape[0] // k.shape[0], k.shape[0]
        bias, _ = self._bias(block, q, k.shape[1])
        dout, lse = _backward_rows(dout, lse)
        lq = q.shape[1]
        padded = lse.new_full((q.shape[0], math.ceil(lq / self._ALIGN) * self._ALIGN), float("inf"),
                              dtype=torch.float32)
        padded[:, :lq] = lse
        zero = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            _rows_major(dout)[None], q[None], _expand_heads(k, g)[None], _expand_heads(v, g)[None], bias,
            _rows_major(out)[None], padded[None], zero, zero, 0.0,
            [True, True, True, False], block.kind is MaskKind.CAUSAL, scale=scale)
        if g > 1:  # one rounding of the group's sum, not one per partial sum
            dk = dk[0].unflatten(0, (hk, g)).sum(1, dtype=torch.float32)
            dv = dv[0].unflatten(0, (hk, g)).sum(1, dtype=torch.float32)
            return dq[0], dk, dv
        return dq[0], dk[0], dv[0]


def _parse_version(text: str) -> tuple[int, ...]:
    """``"2.7.4.post1"`` -> ``(2, 7, 4)``: the leading dotted integers."""
    match = re.match(r"\d+(\.\d+)*", text.strip())
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


@functools.cache
def flash_attn_version() -> tuple[int, ...] | None:
    """The installed flash-attn's version, or None when it is missing or does not import."""
    try:
        import flash_attn  # noqa: PLC0415 - optional extra
    except (ImportError, OSError, RuntimeError):  # missing, or built against another torch
        return None
    return _parse_version(str(getattr(flash_attn, "__version__", "")))


def flash_attn_runs_on(capability: tuple[int, int] | None, version: tuple[int, ...] | None) -> bool:
    """Whether flash-attn ``version`` (>= 2.7) runs on a GPU of ``capability`` at all."""
    if version is None or version < FLASH_ATTN_MIN_VERSION or capability is None:
        return False
    # flash_api.cpp: up to 2.7.2 `is_sm8x || is_sm90` (major 8, or exactly 9.0);
    # from 2.7.3 `cc_major >= 8`
    if version >= (2, 7, 3):
        return capability[0] >= 8
    return capability[0] == 8 or tuple(capability) == (9, 0)


def flash_attn_supports(dtype: torch.dtype, head_dim: int, capability: tuple[int, int] | None,
                        version: tuple[int, ...] | None) -> bool:
    """Whether flash-attn ``version`` runs ``dtype`` with ``head_dim`` on a GPU of ``capability``.

    A pure function of its arguments (Note [vlmcp CUDA kernel contracts]).

    Args:
        dtype: the q/k/v dtype (fp16 or bf16 only).
        head_dim: ``D`` (a multiple of 8, at most 256).
        capability: ``torch.cuda.get_device_capability()``, e.g. ``(8, 0)``; None: unknown.
        version: :func:`flash_attn_version`; None: not installed. Below 2.7: never.
    """
    return (dtype in _HALF and head_dim % 8 == 0 and 0 < head_dim <= FLASH_ATTN_MAX_HEAD_DIM
            and flash_attn_runs_on(capability, version))


def cuda_kernel_name(dtype: torch.dtype, capability: tuple[int, int] | None,
                     version: tuple[int, ...] | None) -> str:
    """The kernel :func:`select_kernel` picks on CUDA (a pure function).

    float64 -> ``"math"`` (the memory-efficient kernel has no float64); fp16/bf16 ->
    ``"flash_attn"`` when flash-attn ``version`` >= 2.7 supports the GPU (head_dim is
    checked per call, with ``"sdpa"`` as the fallback); everything else -> ``"sdpa"``.
    """
    if dtype == torch.float64:
        return "math"
    if dtype in _HALF and flash_attn_runs_on(capability, version):
        return "flash_attn"
    return "sdpa"


@functools.cache
def _capability_of(index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))


def _capability(device: torch.device) -> tuple[int, int]:
    """The compute capability of a CUDA device (cached: no driver call per block)."""
    return _capability_of(torch.cuda.current_device() if device.index is None else device.index)


def _cu_seqlens(n: int, device) -> torch.Tensor:
    """``IntTensor [0, n]`` built on ``device`` by a kernel: no host-to-device copy, no sync."""
    return torch.arange(0, 2 * n, n, dtype=torch.int32, device=device)


class FlashAttnKernel(AttentionKernel):
    """CUDA: flash-attn (>= 2.7) ``_flash_attn_varlen_forward/backward``, fp16/bf16, native GQA.

    flash-attn aligns causal masks bottom-right, so only square ``CAUSAL`` blocks and
    ``FULL`` blocks run here, and only where :func:`flash_attn_supports` says so
    (head_dim <= 256 and a multiple of 8, sm80+); the rest use :class:`CudaSdpaKernel`
    (float64: :class:`MathKernel`).

    Raises:
        RuntimeError: flash-attn is missing or older than 2.7 (checked here, once).
    """

    name = "flash_attn"

    def __init__(self):
        version = flash_attn_version()
        if version is None or version < FLASH_ATTN_MIN_VERSION:
            found = "not installed" if version is None else ".".join(map(str, version))
            raise RuntimeError(f"kernel 'flash_attn' needs flash-attn >= 2.7 (found: {found}); "
                               "use kernel='sdpa' or None")
        from flash_attn import flash_attn_interface as fa  # noqa: PLC0415 - optional extra

        self._fa, self._version = fa, version
        self._sdpa, self._math = CudaSdpaKernel(), MathKernel()

    @staticmethod
    def available() -> bool:
        """flash-attn >= 2.7 is installed (by version: the functions' signatures read
        ``(*args, **kwargs)`` under ``torch.library.custom_op``)."""
        version = flash_attn_version()
        return version is not None and version >= FLASH_ATTN_MIN_VERSION

    def _fallback(self, q) -> AttentionKernel | None:
        """For a full or square causal block: None when flash-attn supports q, else who does."""
        if q.dtype == torch.float64:
            return self._math
        return None if flash_attn_supports(q.dtype, q.shape[-1], _capability(q.device), self._version) \
            else self._sdpa

    def _delegate(self, q, k, v, block) -> AttentionKernel | None:
        """None when flash-attn computes this block, else the kernel that does."""
        square = block.kind is MaskKind.CAUSAL and q.shape[1] == k.shape[1]
        # flash-attn 2 needs V's head dim equal to Q/K's; MLA (Dv != D) goes to the SDPA kernel
        if (block.kind is not MaskKind.FULL and not square) or v.shape[-1] != q.shape[-1]:
            return self._math if q.dtype == torch.float64 else self._sdpa
        return self._fallback(q)

    def forward(self, q, k, v, block, scale):
        other = self._delegate(q, k, v, block)
        if other is not None:
            return other.forward(q, k, v, block, scale)
        lq, lk = q.shape[1], k.shape[1]
        out, lse, _, _ = self._fa._flash_attn_varlen_forward(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), _cu_seqlens(lq, q.device),
            _cu_seqlens(lk, q.device), lq, lk, 0.0, scale, block.kind is MaskKind.CAUSAL)
        return out.transpose(0, 1), lse.float()

    def batches(self, q):
        """Full and square causal blocks go to one varlen call per round where flash-attn runs q."""
        return self._fallback(q) is None

    def forward_varlen(self, q, k, v, rnd, scale):
        q, k, v = (x.contiguous() for x in (q, k, v))  # no copy for the ring's (N, H, D) storage
        out, lse, _, _ = self._fa._flash_attn_varlen_forward(
            q, k, v, rnd.cu_q, rnd.cu_k, rnd.max_q, rnd.max_k, 0.0, scale, rnd.causal)
        return out, lse.float()

    def backward_varlen(self, dout, q, k, v, out, lse, rnd, scale):
        dead = torch.isneginf(lse)  # see _backward_rows; (H, Tq) against (Tq, H, D)
        dout = dout.masked_fill(dead.t().unsqueeze(-1), 0).contiguous()
        lse = lse.float().masked_fill(dead, float("inf")).contiguous()
        q, k, v = (x.contiguous() for x in (q, k, v))
        dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
        self._fa._flash_attn_varlen_backward(
            dout, q, k, v, out.contiguous(), lse, dq, dk, dv, rnd.cu_q, rnd.cu_k, rnd.max_q, rnd.max_k,
            0.0, scale, rnd.causal, -1, -1, 0.0, None, False)
        return dq, dk, dv

    def backward(self, dout, q, k, v, out, lse, block, scale):
        other = self._delegate(q, k, v, block)
        if other is not None:
            return other.backward(dout, q, k, v, out, lse, block, scale)
        dout, lse = _backward_rows(dout, lse)
        t = [x.transpose(0, 1).contiguous() for x in (dout, q, k, v, out)]
        dq, dk, dv = (torch.empty_like(x) for x in t[1:4])
        lq, lk = q.shape[1], k.shape[1]
        self._fa._flash_attn_varlen_backward(
            *t, lse.float().contiguous(), dq, dk, dv, _cu_seqlens(lq, q.device), _cu_seqlens(lk, q.device),
            lq, lk, 0.0, scale, block.kind is MaskKind.CAUSAL, -1, -1, 0.0, None, False)
        return dq.transpose(0, 1), dk.transpose(0, 1), dv.transpose(0, 1)


KERNELS = {"math": MathKernel, "flash_cpu": CpuFlashKernel, "sdpa": CudaSdpaKernel,
           "flash_attn": FlashAttnKernel}


def select_kernel(device: torch.device | str, dtype: torch.dtype, name: str | None = None) -> AttentionKernel:
    """The kernel for tensors on ``device`` of ``dtype``.

    Args:
        device: where q, k, v live.
        dtype: their dtype.
        name: force a kernel (``"math"``, ``"flash_cpu"``, ``"sdpa"``, ``"flash_attn"``);
            ``None`` picks: CPU -> ``flash_cpu``; CUDA -> :func:`cuda_kernel_name`
            (float64 -> ``math``; fp16/bf16 -> ``flash_attn`` when flash-attn >= 2.7
            supports the GPU; else ``sdpa``); anything else -> ``math``.

    Raises:
        ValueError: unknown name, a kernel that cannot run on ``device``, or ``sdpa``
            with float64.
        RuntimeError: ``flash_attn`` forced without flash-attn >= 2.7.
    """
    dev = torch.device(device)
    if name is None:
        if dev.type == "cpu":
            name = "flash_cpu"
        elif dev.type == "cuda":
            version = flash_attn_version() if dtype in _HALF else None
            name = cuda_kernel_name(dtype, _capability(dev) if version else None, version)
        else:
            name = "math"
    if name not in KERNELS:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)} or None, got {name!r}")
    if (name == "flash_cpu" and dev.type != "cpu") or (name in ("sdpa", "flash_attn") and dev.type != "cuda"):
        raise ValueError(f"kernel {name!r} cannot run on device type {dev.type!r}")
    if name == "sdpa" and dtype == torch.float64:
        raise ValueError("kernel 'sdpa' (memory-efficient attention) supports fp32, fp16 and bf16, "
                         "not torch.float64; use kernel='math' or None")
    return KERNELS[name]()
