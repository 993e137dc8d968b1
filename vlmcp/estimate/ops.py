"""The bytes each op of a VLM block saves for backward, per token: the estimate's vocabulary.

Note [vlmcp memory estimate: saved bytes per token]
---------------------------------------------------
Megatron-LM's theoretical memory report (``megatron/training/theoretical_memory_usage.py``,
``compute_activation_memory``, after Korthikanti et al. 2022, Table 2) writes a transformer's
activations as ``seq x hidden x (bytes per token per layer) x layers``, plus the embedding's
input and the output layer and loss, and its weights as a byte count per parameter. vlmcp keeps
that shape but counts what *these* kernels save, tensor by tensor, as
:class:`~vlmcp.debug.meters.saved_tensors.SavedTensorMeter` sees it (each storage once; ``b`` the
dtype's bytes, ``h`` the width, ``nh``/``kv`` query and K/V heads of ``d``, ``f`` the MLP width)::

    RMSNorm + the linear after it   4h (fp32 copy of x) + 4 (rsqrt) + b*h (x*rsqrt in b)
                                    + b*h (weight * ..., the linear's input)
    LayerNorm + the linear after    b*h (x) + 8 (mean, rstd in fp32) + b*h (output)
    vlmcp attention                 q, k, v, out in b, lse in fp32: b*(2*nh*d + 2*kv*d) + 4*nh
    q/k RMSNorm (Qwen3)             (4 + b)*(nh + kv)*d + 4*(nh + kv)  (the normed q/k is rotated,
                                    and a rotation saves only cos and sin)
    SwiGLU MLP                      4*b*f  (gate, silu(gate), up, their product); gated GELU too
    GELU (tanh or erf) MLP          2*b*f  (fc1's output, the GELU's);  quick_gelu: 3*b*f
    Gemma's RMSNorm, x * (1 + w)    4h (fp32 x) + 4 + 4h (fp32 normed) [+ b*h, the linear's input,
                                    when one follows]; its q/k norms 8*(nh + kv)*d + 4*(nh + kv)

No dropout, no attention matrix (vlmcp's kernels keep the log-sum-exp, flash-style), no
Megatron ``18 + 4f/h`` with its bf16 masks: those are for Megatron's own kernels. Under
activation checkpointing (HF's, non-reentrant) a block saves only its input, ``b*h`` per token,
and backward recomputes one block at a time (its full set, a transient). The towers (ViTs and
their mergers) are written the same way per ViT token. The recipes: :mod:`vlmcp.estimate.text`
(decoder layers) and :mod:`vlmcp.estimate.towers` (vision towers); an architecture whose blocks
are not written there is refused by name.
"""

from __future__ import annotations

__all__ = ["ACC", "gemma_rms", "layer_norm", "rms"]

ACC = 4  # bytes of the fp32 statistics and copies the norms and the attention keep


def rms(width: int, b: int) -> int:
    """Llama-style RMSNorm and the linear after it (the norm's output is the linear's input)."""
    return ACC * width + ACC + 2 * b * width


def layer_norm(width: int, b: int) -> int:
    """``nn.LayerNorm`` and the linear after it."""
    return 2 * b * width + 8




def gemma_rms(width: int, b: int, linear: bool) -> int:
    """Gemma's RMSNorm (float32 inside, ``x * (1 + w)``); ``linear``: a linear reads its output."""
    return 2 * ACC * width + ACC + (b * width if linear else 0)
