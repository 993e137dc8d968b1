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
queries, which makes the block's gradients exact parts of the total.

Kernels: ``flash_cpu`` (PyTorch's flash kernel for CPU, which returns the
log-sum-exp), ``math`` (pure torch, any device: the reference), ``sdpa`` (CUDA,
PyTorch's memory-efficient kernel, which returns the log-sum-exp) and ``flash_attn``
(CUDA, the flash-attn package's varlen kernel, fp16/bf16). :func:`select_kernel`
picks from the tensors' device.
"""

from __future__ import annotations

import importlib.util
import inspect
import math

import torch

from vlmcp.attention.masks import Block, MaskKind, dense_mask
from vlmcp.attention.merge import accumulator_dtype

__all__ = ["KERNELS", "AttentionKernel", "select_kernel"]


class AttentionKernel:
    """The interface every local kernel implements (see the module docstring)."""

    name = "abstract"

    def forward(self, q, k, v, block: Block, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def backward(self, dout, q, k, v, out, lse, block: Block, scale: float):
        raise NotImplementedError


def _seen(block: Block, lq: int, lk: int, device) -> torch.Tensor:
    if block.kind is MaskKind.FULL:
        return torch.ones(lq, lk, dtype=torch.bool, device=device)
    if block.kind is MaskKind.CAUSAL:
        return torch.ones(lq, lk, dtype=torch.bool, device=device).tril()
    return dense_mask(block, lq, lk, device=device)


def _safe_lse(dout, lse):
    """Rows with lse = -inf saw no key anywhere: give the kernel 0 there and no gradient."""
    dead = torch.isneginf(lse)
    if bool(dead.any()):
        return dout.masked_fill(dead.unsqueeze(-1), 0), lse.masked_fill(dead, 0.0)
    return dout, lse


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
        dout, lse = _safe_lse(dout, lse)
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


class CpuFlashKernel(AttentionKernel):
    """``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward (native GQA).

    Note: for a row whose mask hides every key it returns ``out = 0`` and
    ``lse = 0`` (torch 2.13), which a merge would count as weight ``exp(0)``; such
    rows are set to ``lse = -inf`` here. It also crashes on a zero-length query
    (callers never pass empty blocks).
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
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q[None], k[None], v[None], 0.0, block.kind is MaskKind.CAUSAL, attn_mask=bias, scale=scale)
        out, lse = out[0], lse[0].to(accumulator_dtype(q.dtype))
        if dead is not None and bool(dead.any()):
            lse = lse.masked_fill(dead, float("-inf"))
            out = out.masked_fill(dead[:, None], 0)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, block, scale):
        bias, _ = self._mask(block, q, k.shape[1])
        dout, lse = _safe_lse(dout, lse)
        kl = torch.float64 if q.dtype == torch.float64 else torch.float32
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout[None], q[None], k[None], v[None], out[None], lse.to(kl)[None], 0.0,
            block.kind is MaskKind.CAUSAL, attn_mask=bias, scale=scale)
        return dq[0], dk[0], dv[0]


class CudaSdpaKernel(AttentionKernel):
    """CUDA: ``aten._scaled_dot_product_efficient_attention`` (returns the log-sum-exp).

    Not exercised on CPU-only machines (tests marked ``gpu``). GQA is expanded here.
    """

    name = "sdpa"
    _ALIGN = 32  # the kernel pads its lse to a multiple of 32 queries

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
            q[None], k.repeat_interleave(g, 0)[None], v.repeat_interleave(g, 0)[None], bias, True,
            0.0, block.kind is MaskKind.CAUSAL, scale=scale)
        out, lse = out[0], lse[0, :, : q.shape[1]].to(accumulator_dtype(q.dtype))
        if dead is not None and bool(dead.any()):
            lse, out = lse.masked_fill(dead, float("-inf")), out.masked_fill(dead[:, None], 0)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, block, scale):
        g, hk = q.shape[0] // k.shape[0], k.shape[0]
        bias, _ = self._bias(block, q, k.shape[1])
        dout, lse = _safe_lse(dout, lse)
        lq = q.shape[1]
        padded = lse.new_zeros(q.shape[0], math.ceil(lq / self._ALIGN) * self._ALIGN).float()
        padded[:, :lq] = lse
        zero = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            dout[None].contiguous(), q[None], k.repeat_interleave(g, 0)[None],
            v.repeat_interleave(g, 0)[None], bias, out[None], padded[None], zero, zero, 0.0,
            [True, True, True, False], block.kind is MaskKind.CAUSAL, scale=scale)
        dk = dk[0].view(hk, g, *dk.shape[2:]).sum(1)
        dv = dv[0].view(hk, g, *dv.shape[2:]).sum(1)
        return dq[0], dk, dv


class FlashAttnKernel(AttentionKernel):
    """CUDA: flash-attn (>= 2.7) ``_flash_attn_varlen_forward/backward``, fp16/bf16, native GQA.

    flash-attn aligns causal masks bottom-right, so only square ``CAUSAL`` blocks and
    ``FULL`` blocks with ``head_dim % 8 == 0`` run here; the rest use :class:`CudaSdpaKernel`.
    """

    name = "flash_attn"

    def __init__(self):
        from flash_attn import flash_attn_interface as fa  # noqa: PLC0415 - optional extra

        self._fa = fa
        self._fallback = CudaSdpaKernel()

    @staticmethod
    def available() -> bool:
        """flash-attn is installed with the >= 2.7 internal API (``window_size_left``)."""
        if importlib.util.find_spec("flash_attn") is None:
            return False
        try:
            from flash_attn import flash_attn_interface as fa  # noqa: PLC0415 - optional extra
        except ImportError:
            return False
        fwd = getattr(fa, "_flash_attn_varlen_forward", None)
        return fwd is not None and "window_size_left" in inspect.signature(fwd).parameters

    def _ours(self, q, k, block):
        square = block.kind is MaskKind.CAUSAL and q.shape[1] == k.shape[1]
        return ((block.kind is MaskKind.FULL or square) and q.dtype in (torch.float16, torch.bfloat16)
                and q.shape[-1] % 8 == 0)

    @staticmethod
    def _cu(n, device):
        return torch.tensor([0, n], dtype=torch.int32, device=device)

    def forward(self, q, k, v, block, scale):
        if not self._ours(q, k, block):
            return self._fallback.forward(q, k, v, block, scale)
        lq, lk = q.shape[1], k.shape[1]
        out, lse, _, _ = self._fa._flash_attn_varlen_forward(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), self._cu(lq, q.device),
            self._cu(lk, q.device), lq, lk, 0.0, scale, block.kind is MaskKind.CAUSAL)
        return out.transpose(0, 1), lse.float()

    def backward(self, dout, q, k, v, out, lse, block, scale):
        if not self._ours(q, k, block):
            return self._fallback.backward(dout, q, k, v, out, lse, block, scale)
        dout, lse = _safe_lse(dout, lse)
        t = [x.transpose(0, 1).contiguous() for x in (dout, q, k, v, out)]
        dq, dk, dv = (torch.empty_like(x) for x in t[1:4])
        lq, lk = q.shape[1], k.shape[1]
        self._fa._flash_attn_varlen_backward(
            *t, lse.float().contiguous(), dq, dk, dv, self._cu(lq, q.device), self._cu(lk, q.device),
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
            ``None`` picks: CPU -> ``flash_cpu``; CUDA -> ``flash_attn`` when installed and
            the dtype is fp16/bf16 (flash-attn >= 2.7), else ``sdpa``; anything else -> ``math``.

    Raises:
        ValueError: unknown name, or a kernel that cannot run on ``device``.
    """
    dev = torch.device(device).type
    if name is None:
        if dev == "cpu":
            name = "flash_cpu"
        elif dev == "cuda":
            fa = dtype in (torch.float16, torch.bfloat16) and FlashAttnKernel.available()
            name = "flash_attn" if fa else "sdpa"
        else:
            name = "math"
    if name not in KERNELS:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)} or None, got {name!r}")
    if (name == "flash_cpu" and dev != "cpu") or (name in ("sdpa", "flash_attn") and dev != "cuda"):
        raise ValueError(f"kernel {name!r} cannot run on device type {dev!r}")
    return KERNELS[name]()
