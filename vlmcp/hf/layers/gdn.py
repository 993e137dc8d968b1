"""Qwen3.5's Gated DeltaNet layers under CP: a replacement forward that reads the layout from the batch.

Note [vlmcp HF Gated DeltaNet]
------------------------------
``Qwen3_5DecoderLayer`` calls its ``linear_attn`` with ``**kwargs`` of the top-level
call, so the :class:`~vlmcp.hf.attention.CPContext` that :func:`vlmcp.hf.shard_inputs`
puts under ``vlmcp_cp`` reaches every Gated DeltaNet as it reaches every attention call.
:func:`prepare` replaces one module's ``forward`` (on the instance) by
:func:`cp_forward`, which is transformers' forward without a cache, with the two
token-mixing steps swapped for their CP versions::

    hidden (1, N, d) -> in_proj_qkv -> causal_conv1d_cp (halo from the predecessor
    segments, Note [vlmcp causal conv1d halo]) -> act -> q, k, v
                     -> in_proj_a/b -> g (log decay, >= float32), beta
    q, k, v, g, beta -> gated_delta_rule_cp (Note [vlmcp gated delta rule under CP: the
                        segment schedule]) -> gated RMSNorm(z) -> out_proj -> (1, N, d)

Per-token steps (projections, norm, gate) need nothing: every rank runs them on its own
slots, replicated image slots included (their gradients are shares). Under
``attention="ulysses"``, when P divides both the key and the value heads, the conv and
the recurrence take the all-to-all road instead (:func:`vlmcp.mixers.gated_deltanet_ulysses`,
Note [vlmcp Gated DeltaNet under Ulysses]): head shards holding the whole row, no
redundant work, bytes that grow with L; otherwise (heads not divisible) the state passing
above, which is exact under either backend. A call without the context raises.

The local kernel is :func:`prepare`'s ``kernel`` (default ``"auto"``: fla's Triton kernel
on CUDA when flash-linear-attention is installed, the torch kernel otherwise; Note [vlmcp
gated delta rule: the kernel choice]).

:func:`register` declares the classes to :mod:`vlmcp.hf.layers.audit`, so ``parallelize``
prepares every instance (it calls :func:`register` before its token-mixer audit).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from vlmcp.hf.layers.install import cp_context, install_forward, register_classes
from vlmcp.mixers import causal_conv1d_cp, gated_delta_rule_cp, gated_deltanet_ulysses
from vlmcp.mixers.delta_rule import KERNELS, accumulator_dtype

__all__ = ["CLASSES", "cp_forward", "prepare", "register"]

_MARK = "_vlmcp_cp_gdn"
_KERNEL = "_vlmcp_gdn_kernel"


def _act(name: str):
    from transformers.activations import ACT2FN

    return ACT2FN[name]


def cp_forward(self: nn.Module, hidden_states: torch.Tensor, cache=None, attention_mask=None, **kwargs):
    """``Qwen3_5GatedDeltaNet.forward`` of this rank's slots over the whole row (Note above).

    Args:
        hidden_states: ``(1, N, hidden)``, N = this rank's slots.
        cache: must be None (no generation cache under CP).
        attention_mask: ignored (None under vlmcp: the plan is the mask).
        **kwargs: must hold ``vlmcp_cp``, the :class:`CPContext`.

    Returns:
        ``(1, N, hidden)``; zero at padding slots.
    """
    ctx = cp_context(self, hidden_states, cache, kwargs)
    x = hidden_states[0]
    N = x.shape[0]
    mixed = self.in_proj_qkv(x)
    beta = self.in_proj_b(x).sigmoid()
    acc = accumulator_dtype(x.dtype)  # transformers: float32 (``.float()``); float64 stays float64
    g = -self.A_log.to(acc).exp() * F.softplus(self.in_proj_a(x).to(acc) + self.dt_bias)
    kernel = getattr(self, _KERNEL, "auto")
    P = 1 if ctx.group is None else dist.get_world_size(ctx.group)
    if ctx.backend == "ulysses" and P > 1 and self.num_k_heads % P == 0 and self.num_v_heads % P == 0:
        out = gated_deltanet_ulysses(mixed, self.conv1d.weight, self.conv1d.bias, g, beta, ctx.shard,
                                     ctx.group, key_heads=self.num_k_heads, key_dim=self.head_k_dim,
                                     value_heads=self.num_v_heads, value_dim=self.head_v_dim,
                                     activation=_act(self.activation), kernel=kernel)
    else:
        mixed = causal_conv1d_cp(mixed, self.conv1d.weight, self.conv1d.bias, ctx.shard, ctx.group)
        q, k, v = torch.split(_act(self.activation)(mixed), [self.key_dim, self.key_dim, self.value_dim], -1)
        out = gated_delta_rule_cp(q.reshape(N, -1, self.head_k_dim), k.reshape(N, -1, self.head_k_dim),
                                  v.reshape(N, -1, self.head_v_dim), g, beta, ctx.shard, ctx.group,
                                  use_qk_l2norm=True, kernel=kernel)
    z = self.in_proj_z(x)
    out = self.norm(out.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(out.reshape(N, -1)).unsqueeze(0)


def prepare(module: nn.Module, *, kernel: str = "auto") -> None:
    """Run ``module`` (a ``Qwen3_5GatedDeltaNet`` or Qwen3.5-MoE's) under CP from now on (idempotent).

    ``kernel``: the local gated delta rule kernel, ``"auto"``, ``"torch"`` or ``"fla"``
    (Note [vlmcp gated delta rule: the kernel choice]); a second call sets it again.
    """
    if kernel not in KERNELS:
        raise ValueError(f"gated delta rule kernel must be one of {KERNELS}, got {kernel!r}")
    setattr(module, _KERNEL, kernel)
    needs = ("in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "conv1d", "norm", "out_proj", "A_log",
             "dt_bias")
    install_forward(module, cp_forward, _MARK, needs, "transformers' Qwen3_5GatedDeltaNet")


CLASSES = (("transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5GatedDeltaNet"),
           ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeGatedDeltaNet"))
"""The Gated DeltaNet classes :func:`cp_forward` runs: (transformers module, class name)."""


def register() -> None:
    """Declare the Gated DeltaNet classes to the token-mixer registry (:mod:`vlmcp.hf.layers.audit`).

    Only classes whose transformers module is loaded already (a model of that class can
    exist only then), so registering imports nothing; ``parallelize`` calls it before its audit.
    A class registered already keeps its registration.
    """
    register_classes(CLASSES, prepare)
