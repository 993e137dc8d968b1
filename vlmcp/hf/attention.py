"""vlmcp's attention behind Hugging Face's attention interface, for the language model only.

Note [vlmcp HF attention: registered for the LLM, shard passed with the inputs]
-------------------------------------------------------------------------------
transformers 5.x dispatches every attention module through
``ALL_ATTENTION_FUNCTIONS[module.config._attn_implementation]``. :func:`register`
adds the name ``"vlmcp"``; :func:`vlmcp.hf.parallelize` sets it on the *text* sub-config
only, so the ViT's attention (Qwen2.5-VL's windowed blocks included) keeps its own
implementation, and marks each language-model attention module, so a call from any
other module is an error rather than a silent ring over ViT patches::

    HF attention module ──(B=1, H, N, D) q, (1, Hk, N, D) k/v, GQA not expanded──>
        vlmcp_attention_forward ──(N, H, D)──> vlmcp.cp_attention ──> (1, N, H, D) back to HF

The mask comes from the plan, never from HF: ``"vlmcp"`` is deliberately absent from
``masking_utils``' mask registry, so ``create_causal_mask`` returns ``None`` without
looking at ``attention_mask`` or ``position_ids`` (no packed-sequence detection on
sharded, non-monotone positions).

Which tokens this rank holds travels *with the batch*: :func:`vlmcp.hf.shard_inputs`
puts a :class:`CPContext` (shard, group, backend) into ``model_inputs["vlmcp_cp"]``,
and HF forwards unknown keyword arguments from the top-level ``forward`` down to every
attention call. Nothing is stored on the model between calls, so a batch can never run
with another batch's (or another group's) layout; a model called without the context
raises. The vision adapters strip the key before the ViT runs.

:func:`mark` also guards the other direction at run time: a marked module whose forward
returns without having called :func:`vlmcp_attention_forward` (it computed attention some
other way, on this rank's shard only) raises, so the structural audit of
:mod:`vlmcp.hf.layers.audit` (Note [vlmcp HF token mixers]) cannot be fooled silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.attention import cp_attention
from vlmcp.layout import RankShard

__all__ = ["ATTN_NAME", "CONTEXT_KEY", "IMAGE_ATTENTION_ATTR", "CPContext", "mark", "register",
           "vlmcp_attention_forward"]

ATTN_NAME = "vlmcp"
"""The ``_attn_implementation`` name of vlmcp's attention."""
CONTEXT_KEY = "vlmcp_cp"
"""The ``model(**inputs)`` keyword that carries the :class:`CPContext`."""
IMAGE_ATTENTION_ATTR = "_vlmcp_image_attention"
"""A module attribute that overrides the adapter's ``image_attention`` for that layer (Gemma 4: its
full-attention layers are causal over images, its sliding layers bidirectional); set by the adapter."""
_MARK = "_vlmcp_cp_attention"
_REACHED = "_vlmcp_cp_attention_reached"


@dataclass(frozen=True, eq=False)
class CPContext:
    """What the attention of one forward needs besides q, k, v (built by ``shard_inputs``)."""

    shard: RankShard
    """This rank's part of the row."""
    group: dist.ProcessGroup | None
    """The CP group (None: one process)."""
    backend: Literal["ring", "ulysses"]
    """``cp_attention``'s backend, fixed by ``parallelize``."""
    dummy_vision: bool = False
    """The row has no image and the pixel inputs are one blank image (Note [vlmcp HF vision placement])."""
    token_types: torch.Tensor | None = None
    """``Int8Tensor[L]`` of the global row: 0 text, 1 image, 2 video (the vision wrapper's selection of
    the feature rows this rank merges)."""
    image_attention: Literal["causal", "bidirectional"] = "causal"
    """``cp_attention``'s ``image_attention``: the adapter's (Gemma 3: each image sees itself both
    ways; the images are the plan's ``image_ids``)."""

    def __repr__(self) -> str:
        return f"CPContext({self.shard!r}, backend={self.backend!r})"


def vlmcp_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """HF attention-interface function: exact CP attention of this rank's tokens.

    Args:
        module: the calling attention module (must be marked by ``parallelize``).
        query: ``(1, H, N, D)``, N = this rank's slots.
        key, value: ``(1, Hk, N, D)``, ``H % Hk == 0`` (GQA, not expanded).
        attention_mask: ignored (None for this implementation; the plan is the mask).
        dropout: must be 0 (the parity promise has no dropout).
        scaling: softmax scale (HF passes ``module.scaling``).
        sliding_window: the layer's window W (Gemma 3's ``sliding_attention`` layers): a query sees a
            key fewer than W positions before it, as transformers' sliding mask; None: no window.
            Must be the calling module's ``sliding_window`` (what :mod:`vlmcp.hf.layers.audit` audited).
        **kwargs: must hold ``vlmcp_cp``, the :class:`CPContext`; a ``softcap`` (Gemma 2's attention
            logit soft-capping) is refused; the rest is ignored. The images'
            attention is the context's, unless the module sets :data:`IMAGE_ATTENTION_ATTR`.

    Returns:
        ``(out (1, N, H, D), None)``: HF's layout, no attention weights.
    """
    ctx = kwargs.get(CONTEXT_KEY)
    if not getattr(module, _MARK, False):
        raise RuntimeError(
            f"vlmcp attention was called from {type(module).__name__}, which vlmcp.hf.parallelize did not "
            "register: only the language model's attention runs under CP")
    setattr(module, _REACHED, True)
    if not isinstance(ctx, CPContext):
        raise RuntimeError(
            "this model's language model uses vlmcp attention but the call carries no CP layout: call "
            "model(**vlmcp.hf.shard_inputs(model, inputs, cp_group, ...).model_inputs)")
    if kwargs.get("softcap") is not None:
        raise NotImplementedError(
            f"{type(module).__name__} asks for attention logit soft-capping (softcap={kwargs['softcap']}), "
            "which vlmcp's attention does not apply: refused rather than computed without it")
    if dropout:
        raise ValueError(f"vlmcp attention has no dropout, got attention dropout {dropout} (set "
                         "config.text_config.attention_dropout = 0 or call model.eval())")
    if sliding_window != getattr(module, "sliding_window", None):
        raise RuntimeError(
            f"{type(module).__name__} called vlmcp attention with sliding_window={sliding_window} but its "
            f"sliding_window attribute is {getattr(module, 'sliding_window', None)}: vlmcp audited the "
            "attribute (Note [vlmcp HF token mixers]), so the layer's window is not what vlmcp checked")
    if query.dim() != 4 or query.shape[0] != 1:
        raise ValueError(f"vlmcp attention takes one row (batch 1), got query of shape {tuple(query.shape)}")
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (N, heads, D)
    image_attention = getattr(module, IMAGE_ATTENTION_ATTR, None) or ctx.image_attention
    out = cp_attention(q, k, v, ctx.shard, ctx.group, backend=ctx.backend,
                       image_attention=image_attention, softmax_scale=scaling,
                       sliding_window=sliding_window)
    return out.unsqueeze(0), None


def register() -> None:
    """Register ``"vlmcp"`` in transformers' attention interface (idempotent; no mask function)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, vlmcp_attention_forward)


def _before_forward(module: nn.Module, args) -> None:
    setattr(module, _REACHED, False)


def _after_forward(module: nn.Module, args, output) -> None:
    if not getattr(module, _REACHED, True):
        raise RuntimeError(
            f"{type(module).__name__}.forward returned without calling vlmcp attention: it does not compute "
            "attention through transformers' ALL_ATTENTION_FUNCTIONS, so under CP each rank would attend to "
            "its own shard only; vlmcp cannot run this model")


def mark(module: nn.Module) -> None:
    """Mark a language-model attention module as vlmcp attention's caller (idempotent).

    Its forward must then call :func:`vlmcp_attention_forward` (checked on every call by
    a forward pre-hook and hook).
    """
    if getattr(module, _MARK, False):
        return
    setattr(module, _MARK, True)
    module.register_forward_pre_hook(_before_forward)
    module.register_forward_hook(_after_forward)
