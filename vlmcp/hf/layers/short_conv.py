"""LFM2's short convolutions under CP: the same halo as Gated DeltaNet's, and no state.

``Lfm2ShortConv`` is ``out_proj(C * conv(B * x))`` with ``B, C, x = in_proj(h)`` and a
depthwise causal conv1d of kernel ``conv_L_cache`` (3): per-token steps around one
token-mixing step. :func:`cp_forward` swaps that step for :func:`vlmcp.mixers.causal_conv1d_cp`
(Note [vlmcp causal conv1d halo]); the layout comes from the ``vlmcp_cp`` keyword, as
for attention (Note [vlmcp HF Gated DeltaNet]). :func:`register` declares the class to
the token-mixer registry (``parallelize`` calls it before its audit).

LFM2-VL's images are not served yet (no adapter for ``pixel_attention_mask`` and
``spatial_shapes``: ``shard_inputs`` refuses them by name); its text rows run exactly.
"""

from __future__ import annotations

import torch
from torch import nn

from vlmcp.hf.layers.install import cp_context, install_forward, register_classes
from vlmcp.mixers import causal_conv1d_cp

__all__ = ["CLASSES", "cp_forward", "prepare", "register"]

_MARK = "_vlmcp_cp_short_conv"


def cp_forward(self: nn.Module, hidden_states: torch.Tensor, cache=None, attention_mask=None, **kwargs):
    """``Lfm2ShortConv.forward`` of this rank's slots over the whole row: ``(1, N, d) -> (1, N, d)``."""
    ctx = cp_context(self, hidden_states, cache, kwargs)
    b, c, x = self.in_proj(hidden_states[0]).chunk(3, dim=-1)
    y = c * causal_conv1d_cp(b * x, self.conv.weight, self.conv.bias, ctx.shard, ctx.group)
    return self.out_proj(y).unsqueeze(0)


def prepare(module: nn.Module) -> None:
    """Run ``module`` (an ``Lfm2ShortConv``) under CP from now on (idempotent)."""
    install_forward(module, cp_forward, _MARK, ("in_proj", "conv", "out_proj"), "transformers' Lfm2ShortConv")


CLASSES = (("transformers.models.lfm2.modeling_lfm2", "Lfm2ShortConv"),)
"""The short-convolution classes :func:`cp_forward` runs: (transformers module, class name)."""


def register() -> None:
    """Declare :data:`CLASSES` to the token-mixer registry (:mod:`vlmcp.hf.layers.audit`).

    Only classes whose transformers module is loaded already, so registering imports nothing;
    a class registered already keeps its registration.
    """
    register_classes(CLASSES, prepare)
