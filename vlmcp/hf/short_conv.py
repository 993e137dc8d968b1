"""LFM2's short convolutions under CP: the same halo as Gated DeltaNet's, and no state.

``Lfm2ShortConv`` is ``out_proj(C * conv(B * x))`` with ``B, C, x = in_proj(h)`` and a
depthwise causal conv1d of kernel ``conv_L_cache`` (3): per-token steps around one
token-mixing step. :func:`cp_forward` swaps that step for :func:`vlmcp.linear.causal_conv1d_cp`
(Note [vlmcp causal conv1d halo]); the layout comes from the ``vlmcp_cp`` keyword, as
for attention (Note [vlmcp HF Gated DeltaNet]). :func:`register` declares the classes to
the token-mixer registry; :func:`install` prepares a model by hand.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from vlmcp.hf.attention import CONTEXT_KEY, CPContext
from vlmcp.linear import causal_conv1d_cp

__all__ = ["cp_forward", "install", "prepare", "register"]

_MARK = "_vlmcp_cp_short_conv"


def cp_forward(self: nn.Module, hidden_states: torch.Tensor, cache=None, attention_mask=None, **kwargs):
    """``Lfm2ShortConv.forward`` of this rank's slots over the whole row: ``(1, N, d) -> (1, N, d)``."""
    ctx = kwargs.get(CONTEXT_KEY)
    if not isinstance(ctx, CPContext):
        raise RuntimeError(
            f"{type(self).__name__} runs under vlmcp CP but the call carries no CP layout: call "
            "model(**vlmcp.hf.shard_inputs(model, inputs, cp_group, ...).model_inputs)")
    if cache is not None:
        raise ValueError("vlmcp CP runs without a generation cache (shard_inputs sets use_cache=False)")
    if hidden_states.dim() != 3 or hidden_states.shape[0] != 1:
        raise ValueError(f"vlmcp CP takes one row (batch 1), got hidden states {tuple(hidden_states.shape)}")
    b, c, x = self.in_proj(hidden_states[0]).chunk(3, dim=-1)
    y = c * causal_conv1d_cp(b * x, self.conv.weight, self.conv.bias, ctx.shard, ctx.group)
    return self.out_proj(y).unsqueeze(0)


def prepare(module: nn.Module) -> None:
    """Run ``module`` (an ``Lfm2ShortConv``) under CP from now on (idempotent)."""
    if getattr(module, _MARK, False):
        return
    for name in ("in_proj", "conv", "out_proj"):
        if not hasattr(module, name):
            raise ValueError(f"{type(module).__name__} has no {name!r}: not the short-convolution layout "
                             "vlmcp runs under CP (transformers' Lfm2ShortConv)")
    module.forward = types.MethodType(cp_forward, module)
    setattr(module, _MARK, True)


def _classes() -> tuple[type[nn.Module], ...]:
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv
    from transformers.models.lfm2_moe.modeling_lfm2_moe import Lfm2MoeShortConv

    return Lfm2ShortConv, Lfm2MoeShortConv


def install(model: nn.Module) -> int:
    """Prepare every LFM2 short convolution of ``model``; how many."""
    classes = _classes()
    n = 0
    for m in model.modules():
        if isinstance(m, classes):
            prepare(m)
            n += 1
    return n


def register() -> None:
    """Declare the short-convolution classes to the token-mixer registry (:mod:`vlmcp.hf.mixers`)."""
    from vlmcp.hf.mixers import register_mixer

    for cls in _classes():
        register_mixer(cls, prepare)
