"""Nemotron-H's Mamba-2 layers under CP: a replacement forward that reads the layout from the batch.

Note [vlmcp HF Mamba-2]
-----------------------
``NemotronHBlock`` calls its ``mixer`` with ``**kwargs`` of the top-level call, so the
:class:`~vlmcp.hf.attention.CPContext` under ``vlmcp_cp`` reaches every Mamba-2 mixer as it
reaches attention (Note [vlmcp HF Gated DeltaNet]). :func:`prepare` replaces one module's
``forward`` (on the instance) by :func:`cp_forward`: transformers' forward without a cache,
its two token-mixing steps swapped for their CP versions::

    hidden (1, N, d) -> in_proj -> gate z | xBC | dt
    xBC  -> causal_conv1d_cp (halo from the same sample's predecessor segments, zero at sample
            starts and padding; Note [vlmcp causal conv1d halo]) -> act -> x, B, C
    dt   -> softplus(dt + dt_bias), clamped to time_step_limit;  A = -exp(A_log)
    x, dt, A, B, C -> ssd_cp (Note [vlmcp SSD under CP: the segment schedule]) + D x
         -> gated RMSNorm(z) -> out_proj -> (1, N, d)

Per-token steps need nothing: every rank runs them on its own slots, replicated image slots
included (their gradients are shares). Under ``attention="ulysses"``, when P divides both the
heads and the groups, conv and scan take the all-to-all road instead
(:func:`vlmcp.mixers.mamba2_ulysses`, Note [vlmcp Mamba-2 under Ulysses]); otherwise the state
passing, exact under either backend. A call without the context raises.

Dtypes follow transformers' torch path: the decay, the time steps and the scan in float32 at
least (transformers adds ``dt_bias`` and applies softplus in the model dtype, then scans in
float32; here the time steps are float32 from the start, which only differs below float32),
the scan's output through the gated norm, cast to the model dtype before ``out_proj``. The
local scan is the torch kernel (:func:`vlmcp.mixers.chunk_ssd`); ``mamba_ssm``'s fused
kernels are not used under CP.

:func:`register` declares the class to :mod:`vlmcp.hf.layers.audit` (``parallelize`` calls it
before its token-mixer audit); other Mamba classes stay refused by name.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from vlmcp.attention.merge import accumulator_dtype
from vlmcp.hf.layers.install import cp_context, install_forward, register_classes
from vlmcp.mixers import causal_conv1d_cp, mamba2_ulysses, ssd_cp
from vlmcp.mixers.ssd_ulysses import takes_ulysses

__all__ = ["CLASSES", "cp_forward", "prepare", "register"]

_MARK = "_vlmcp_cp_mamba2"


def cp_forward(self: nn.Module, hidden_states: torch.Tensor, cache=None, attention_mask=None, **kwargs):
    """``NemotronHMamba2Mixer.forward`` of this rank's slots over the whole row (Note above).

    Args:
        hidden_states: ``(1, N, hidden)``, N = this rank's slots.
        cache: must be None (no generation cache under CP).
        attention_mask: ignored (None under vlmcp: the plan is the mask).
        **kwargs: must hold ``vlmcp_cp``, the :class:`CPContext`.

    Returns:
        ``(1, N, hidden)``.
    """
    ctx = cp_context(self, hidden_states, cache, kwargs)
    h = hidden_states[0]
    N, dtype = h.shape[0], h.dtype
    H, Pd, G, Ns = self.num_heads, self.head_dim, self.n_groups, self.ssm_state_size
    gate, xbc, dt = self.in_proj(h).split([self.intermediate_size, self.conv_dim, H], dim=-1)
    acc = accumulator_dtype(dtype)
    A = -torch.exp(self.A_log.to(acc))
    lo, hi = self.time_step_limit
    dt = F.softplus(dt.to(acc) + self.dt_bias.to(acc)).clamp(min=lo, max=hi)
    P = 1 if ctx.group is None else dist.get_world_size(ctx.group)
    if ctx.backend == "ulysses" and takes_ulysses(H, G, P):
        y = mamba2_ulysses(xbc, self.conv1d.weight, self.conv1d.bias, dt, A, self.D, ctx.shard, ctx.group,
                           heads=H, head_dim=Pd, groups=G, state_dim=Ns, activation=self.act,
                           chunk_size=self.chunk_size)
    else:
        xbc = self.act(causal_conv1d_cp(xbc, self.conv1d.weight, self.conv1d.bias, ctx.shard, ctx.group))
        x, B, C = torch.split(xbc, [self.intermediate_size, G * Ns, G * Ns], dim=-1)
        x = x.reshape(N, H, Pd)
        y = ssd_cp(x, dt, A, B.reshape(N, G, Ns), C.reshape(N, G, Ns), ctx.shard, ctx.group,
                   chunk_size=self.chunk_size)
        y = y + self.D[:, None].to(y.dtype) * x.to(y.dtype)
    y = self.norm(y.reshape(N, -1), gate)
    return self.out_proj(y.to(dtype)).unsqueeze(0)


def prepare(module: nn.Module) -> None:
    """Run ``module`` (a ``NemotronHMamba2Mixer``) under CP from now on (idempotent)."""
    needs = ("in_proj", "conv1d", "act", "norm", "out_proj", "A_log", "dt_bias", "D", "time_step_limit",
             "num_heads", "head_dim", "n_groups", "ssm_state_size", "intermediate_size", "conv_dim",
             "chunk_size")
    install_forward(module, cp_forward, _MARK, needs, "transformers' NemotronHMamba2Mixer")


CLASSES = (("transformers.models.nemotron_h.modeling_nemotron_h", "NemotronHMamba2Mixer"),)
"""The Mamba-2 classes :func:`cp_forward` runs: (transformers module, class name)."""


def register() -> None:
    """Declare :data:`CLASSES` to the token-mixer registry (:mod:`vlmcp.hf.layers.audit`).

    Only classes whose transformers module is loaded already, so registering imports nothing;
    a class registered already keeps its registration.
    """
    register_classes(CLASSES, prepare)
