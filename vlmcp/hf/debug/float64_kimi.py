"""Kimi-K2.5's float32 islands, lifted for float64 parity (the reference and the CP model alike).

transformers' Kimi-K2.5 computes three steps in float32 whatever the model dtype: the
DeepSeek-V3 MoE router (``F.linear`` of ``hidden.type(torch.float32)``, then sigmoid and
group top-k), the ViT's ``apply_rotary_pos_emb_vision`` (``q.float()``) and the ViT's
``temporal_merge`` (a float32 ``index_add_`` of ``hidden.float()``). In a float64 model
each rounds the gradient to float32; a replicated token's gradient then arrives in P
shares, each rounded on its own, and CP and one process differ by ~1e-8 relative: float32
noise, not a CP error (as :func:`vlmcp.hf.debug.parity.float64_norms` explains for RMSNorm,
which also covers DeepSeek-V3's norms). :func:`float64_kimi_k25` keeps those steps in the
input dtype, for the duration only. The router's expert choice is a top-k of its scores,
as in float32; the tiny test models are far from ties.
"""

from __future__ import annotations

import contextlib
import sys

import torch

from vlmcp.hf.debug.float64_qwen3_5 import in_dtype

__all__ = ["float64_kimi_k25"]


def _rotary_vision(q, k, cos, sin):
    from transformers.models.kimi_k25.modeling_kimi_k25 import rotate_half

    cos, sin = cos.unsqueeze(-2).to(q.dtype), sin.unsqueeze(-2).to(q.dtype)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def _temporal_merge(self, hidden_states, grid_thw, kernel_height, kernel_width, kwargs=None):
    """``Kimi_K25VisionModel.temporal_merge`` in the input dtype."""
    from transformers.models.kimi_k25.modeling_kimi_k25 import get_vision_temporal_merge_index

    index, frame_weight, n = get_vision_temporal_merge_index(grid_thw, kernel_height, kernel_width,
                                                             kwargs=kwargs)
    kernel = kernel_height * kernel_width
    pooled = hidden_states.new_zeros(n * kernel, hidden_states.shape[-1])
    pooled.index_add_(0, index, hidden_states * frame_weight[:, None].to(hidden_states.dtype))
    return pooled.view(n, kernel, -1)


@contextlib.contextmanager
def float64_kimi_k25(dtype: torch.dtype = torch.float64):
    """While active (and ``dtype`` is float64), Kimi-K2.5's float32 islands keep the input dtype.

    Patches, class- and module-wide: ``DeepseekV3TopkRouter.forward`` (its ``torch.float32``
    read as ``dtype``), ``Kimi_K25VisionModel.temporal_merge`` and the Kimi module's
    ``apply_rotary_pos_emb_vision``; the router alone while Kimi's module is not loaded, nothing
    while neither is. :func:`vlmcp.hf.debug.parity.float64_exact` enters it.
    """
    ds = sys.modules.get("transformers.models.deepseek_v3.modeling_deepseek_v3")
    kimi = sys.modules.get("transformers.models.kimi_k25.modeling_kimi_k25")
    if dtype != torch.float64 or ds is None:
        yield
        return
    patches = [(ds.DeepseekV3TopkRouter, "forward", in_dtype(ds.DeepseekV3TopkRouter.forward, dtype))]
    if kimi is not None:
        patches += [(kimi.Kimi_K25VisionModel, "temporal_merge", _temporal_merge),
                    (kimi, "apply_rotary_pos_emb_vision", _rotary_vision)]
    saved = [getattr(owner, name) for owner, name, _ in patches]
    try:
        for owner, name, fn in patches:
            setattr(owner, name, fn)
        yield
    finally:
        for (owner, name, _), fn in zip(patches, saved, strict=True):
            setattr(owner, name, fn)
