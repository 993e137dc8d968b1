"""Qwen3.5's float32 islands, lifted for float64 parity (the reference and the CP model alike).

transformers' Qwen3.5 computes several steps in float32 whatever the model dtype: the
zero-centred ``Qwen3_5RMSNorm`` (``x.float()``), the gated norm of the Gated DeltaNet
output, the decay ``g`` (``A_log.float()``, ``a.float()``), both gated-delta-rule
kernels (``.to(torch.float32)``) and the ViT rotary embedding. In a float64 model each
rounds the gradient to float32; a replicated token's gradient then arrives in P shares,
each rounded on its own, and CP and one process differ by ~1e-8 relative: float32
noise, not a CP error (as :func:`vlmcp.hf.debug.parity.float64_norms` explains for RMSNorm).
:func:`float64_qwen3_5` keeps those steps in the input dtype, for the duration only.

:func:`in_dtype` runs one of transformers' functions unchanged except that its
``torch.float32`` reads as another dtype (its code object, with ``torch`` looked up in
a namespace where ``float32`` is that dtype); the kernels' tests use it too.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from collections.abc import Callable

import torch
from torch.nn import functional as F

__all__ = ["float64_qwen3_5", "in_dtype"]


class _TorchWithFloat32As(types.ModuleType):
    def __init__(self, dtype: torch.dtype):
        super().__init__("torch")
        self.float32 = dtype

    def __getattr__(self, name):
        return getattr(torch, name)


def in_dtype(fn: Callable, dtype: torch.dtype) -> Callable:
    """``fn`` (decorators unwrapped) with every ``torch.float32`` it names read as ``dtype``."""
    raw = inspect.unwrap(fn)
    namespace = dict(raw.__globals__)
    namespace["torch"] = _TorchWithFloat32As(dtype)
    out = types.FunctionType(raw.__code__, namespace, raw.__name__, raw.__defaults__, raw.__closure__)
    out.__kwdefaults__ = raw.__kwdefaults__
    return out


def _zero_centred_norm(self, x):
    """``Qwen3_5RMSNorm.forward`` in the input dtype."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


def _gated_norm(self, hidden_states, gate):
    """``Qwen3_5RMSNormGated.forward`` in the input dtype."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon)) * F.silu(gate)


def _gdn_forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
    """``Qwen3_5GatedDeltaNet.forward`` of a whole sequence, ``g`` and the kernel in the input dtype.

    A cache is left untouched: the reference's single forward never reads it back.
    """
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    if cache is not None and cache.get_seq_length() > 0:
        raise NotImplementedError("the float64 reference runs one whole forward, not cached decoding")
    hidden_states = m.apply_mask_to_padding_states(hidden_states, attention_mask)
    batch, seq_len, _ = hidden_states.shape
    mixed = m.causal_conv1d_fn(self.in_proj_qkv(hidden_states).transpose(1, 2), self.conv1d.weight.squeeze(1),
                               self.conv1d.bias, activation=self.activation).transpose(1, 2)
    q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    q = q.reshape(batch, seq_len, -1, self.head_k_dim)
    k = k.reshape(batch, seq_len, -1, self.head_k_dim)
    v = v.reshape(batch, seq_len, -1, self.head_v_dim)
    z = self.in_proj_z(hidden_states).reshape(batch, seq_len, -1, self.head_v_dim)
    beta = self.in_proj_b(hidden_states).sigmoid()
    g = -self.A_log.exp() * F.softplus(self.in_proj_a(hidden_states) + self.dt_bias)
    kernel = in_dtype(m.torch_chunk_gated_delta_rule, hidden_states.dtype)
    out, _ = kernel(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=False,
                    use_qk_l2norm_in_kernel=True)
    out = self.norm(out.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(out.reshape(batch, seq_len, -1))


def _rotary_vision(q, k, cos, sin):
    from transformers.models.qwen3_5.modeling_qwen3_5 import rotate_half

    cos, sin = cos.unsqueeze(-2).to(q.dtype), sin.unsqueeze(-2).to(q.dtype)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


@contextlib.contextmanager
def float64_qwen3_5(dtype: torch.dtype = torch.float64):
    """While active (and ``dtype`` is float64), Qwen3.5's float32 islands keep the input dtype.

    Patches, class-wide: ``Qwen3_5RMSNorm``, ``Qwen3_5RMSNormGated`` and
    ``Qwen3_5GatedDeltaNet`` forwards (a module whose forward vlmcp replaced on the
    instance keeps vlmcp's), and the module's ``apply_rotary_pos_emb_vision``; nothing
    while transformers' Qwen3.5 module is not loaded (no Qwen3.5 model exists then).
    :func:`vlmcp.hf.debug.parity.float64_exact` enters it.
    """
    m = sys.modules.get("transformers.models.qwen3_5.modeling_qwen3_5")
    if dtype != torch.float64 or m is None:
        yield
        return

    patches = [(m.Qwen3_5RMSNorm, "forward", _zero_centred_norm),
               (m.Qwen3_5RMSNormGated, "forward", _gated_norm),
               (m.Qwen3_5GatedDeltaNet, "forward", _gdn_forward),
               (m, "apply_rotary_pos_emb_vision", _rotary_vision)]
    saved = [getattr(owner, name) for owner, name, _ in patches]
    try:
        for owner, name, fn in patches:
            setattr(owner, name, fn)
        yield
    finally:
        for (owner, name, _), fn in zip(patches, saved, strict=True):
            setattr(owner, name, fn)
