"""This rank's experts on the rows dispatched to it: a grouped matmul on CUDA, else a matmul pair per expert.

The rows arrive expert-major (``counts[e]`` rows for local expert e, in order; Note [vlmcp expert
parallel: dispatch and combine]) and each runs through its expert with unit weight: the router's
weight is applied on the sender. Both kernels compute, per expert, HF's own steps: the first
projection, the class's gate (``_apply_gate``: MiniMax's clamped SwiGLU) or activation
(Nemotron-H's ungated ``act(up)``), the down projection.

* :func:`grouped_experts`: ``torch._grouped_mm`` (one kernel per projection for all experts), on
  CUDA for bfloat16 with every row stride 16-byte aligned (the kernel's contract).
* :func:`looped_experts`: ``F.linear`` (or ``@`` for Llama 4's ``(E, in, out)`` layout) per expert
  with rows; every dtype and device, float64 included (the parity tests' path).

:func:`local_experts` picks one. With no row at all it runs expert 0 on one zero row and returns
none of it: the weights and the received rows stay in the graph (zero gradients), so the backward
all-to-all and FSDP's reduce-scatter run on this rank as on the others.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from vlmcp.hf.moe.registry import ExpertsSpec

__all__ = ["grouped_experts", "grouped_mm_available", "local_experts", "looped_experts"]

_GROUPED_DTYPES = (torch.bfloat16,)


def _gate(module: nn.Module, spec: ExpertsSpec, h: torch.Tensor) -> torch.Tensor:
    if not spec.gated:
        return module.act_fn(h)
    apply_gate = getattr(module, "_apply_gate", None)
    if apply_gate is not None:  # transformers' decorated classes (the default: act(gate) * up)
        return apply_gate(h)
    gate, up = h.chunk(2, dim=-1)
    return module.act_fn(gate) * up


def _project(x: torch.Tensor, w: torch.Tensor, transposed: bool) -> torch.Tensor:
    return x @ w if transposed else F.linear(x, w)


def looped_experts(module: nn.Module, spec: ExpertsSpec, x: torch.Tensor,
                   counts: Sequence[int]) -> torch.Tensor:
    """``(R, H_in)`` expert-major rows -> ``(R, H_out)``, one matmul pair per expert with rows."""
    up, down = getattr(module, spec.up), module.down_proj
    out, start = [], 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        h = _gate(module, spec, _project(x[start:start + n], up[e], spec.transposed))
        out.append(_project(h, down[e], spec.transposed))
        start += n
    return torch.cat(out, 0)


def grouped_mm_available(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Whether :func:`grouped_experts` can run: CUDA, ``torch._grouped_mm``, bfloat16, aligned strides."""
    if not (x.is_cuda and hasattr(torch, "_grouped_mm") and x.dtype in _GROUPED_DTYPES):
        return False
    if torch.cuda.get_device_capability(x.device) < (8, 0):
        return False
    size = x.element_size()
    return all(w.dtype == x.dtype and w.shape[-1] * size % 16 == 0 and w.shape[-2] * size % 16 == 0
               for w in weights) and x.shape[-1] * size % 16 == 0


def grouped_experts(module: nn.Module, spec: ExpertsSpec, x: torch.Tensor,
                    counts: Sequence[int]) -> torch.Tensor:
    """:func:`looped_experts` as two ``torch._grouped_mm`` calls over all local experts (CUDA)."""
    up, down = getattr(module, spec.up), module.down_proj
    offs = torch.tensor(counts, device=x.device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    # _grouped_mm multiplies each group's rows by an (in, out) matrix; HF stores (out, in)
    w_up = up if spec.transposed else up.transpose(-2, -1)
    w_down = down if spec.transposed else down.transpose(-2, -1)
    h = _gate(module, spec, torch._grouped_mm(x, w_up, offs=offs))
    return torch._grouped_mm(h, w_down, offs=offs)


def local_experts(module: nn.Module, spec: ExpertsSpec, x: torch.Tensor, counts: Sequence[int],
                  kernel: str = "auto") -> torch.Tensor:
    """Run this rank's experts on their rows.

    Args:
        module: the routed-experts module (its local weights ``(El, ...)``).
        spec: its :class:`~vlmcp.hf.moe.registry.ExpertsSpec`.
        x: ``(R, H_in)`` rows, expert-major.
        counts: rows per local expert, ``sum == R``.
        kernel: ``"auto"`` (grouped where :func:`grouped_mm_available`, else the loop), ``"grouped"``
            or ``"loop"``.

    Returns:
        ``(R, H_out)``: each row through its expert, unweighted.
    """
    if kernel not in ("auto", "grouped", "loop"):
        raise ValueError(f"kernel must be 'auto', 'grouped' or 'loop', got {kernel!r}")
    counts = [int(c) for c in counts]
    if sum(counts) != x.shape[0]:
        raise ValueError(f"{x.shape[0]} rows for expert counts {counts}")
    empty = x.shape[0] == 0
    if empty:  # keep the weights and the received rows in the graph
        x = x.sum(0, keepdim=True)
        counts = [1] + [0] * (len(counts) - 1)
    up = getattr(module, spec.up)
    grouped = kernel == "grouped" or (kernel == "auto" and grouped_mm_available(x, up, module.down_proj))
    y = (grouped_experts if grouped else looped_experts)(module, spec, x, counts)
    return y[:0] if empty else y
