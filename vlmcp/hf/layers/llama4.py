"""Llama 4's attention under CP: NoPE layers' temperature tuning at the true positions; chunked layers.

Note [vlmcp HF Llama 4 attention]
---------------------------------
``Llama4TextAttention`` is softmax attention through transformers' attention interface, with two
position rules of its own (transformers 5.24):

* **NoPE layers** (``no_rope_layers[i] == 0``: no rotary) with ``attn_temperature_tuning`` scale each
  query by ``log1p(floor((p + 1) / floor_scale)) * attn_scale + 1``, where HF takes ``p`` from
  ``torch.arange`` over the *local* sequence. Under CP that would be this rank's slot index, not the
  token's position: :func:`cp_forward` takes ``p`` from the plan instead (the token's offset in its
  sample, what the model computes on that sample alone), so the scale is the single-process one.
* **Chunked layers** (``layer_types[i] == "chunked_attention"``, the RoPE layers) let a token see only
  the keys of its own ``attention_chunk_size`` block of positions. vlmcp's plan has no chunk mask,
  but a sample no longer than one chunk lies in one block, where chunked attention *is* causal
  attention. So a row is exact when every sample is at most ``attention_chunk_size`` tokens (8192 in
  the released checkpoints; many such samples may be packed into one long CP row), and a longer
  sample is refused by name: by the adapter's ``position_ids`` on the global row (before any
  collective), and again here at run time.

The rest of the forward is HF's (rotary on RoPE layers, the L2 q/k norm, GQA K/V handed to vlmcp's
attention unexpanded).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from vlmcp.hf import attention as hf_attention
from vlmcp.hf.layers.install import cp_context, install_forward, register_classes

__all__ = ["CLASSES", "check_chunks", "cp_forward", "prepare", "register"]

_MARK = "_vlmcp_cp_llama4_attention"


def check_chunks(config, lengths: list[int], where: str) -> None:
    """Refuse samples longer than ``config.attention_chunk_size`` where a layer is chunked.

    Args:
        config: the text config (``layer_types``, ``attention_chunk_size``).
        lengths: the row's sample lengths.
        where: what is checked, for the message.
    """
    types_ = getattr(config, "layer_types", None) or []
    chunked = [i for i, t in enumerate(types_) if t == "chunked_attention"]
    chunk = getattr(config, "attention_chunk_size", None)
    if not chunked or chunk is None:
        return
    long = [(s, n) for s, n in enumerate(lengths) if n > chunk]
    if long:
        s, n = long[0]
        raise ValueError(
            f"{where}: sample {s} has {n} tokens, more than Llama 4's attention_chunk_size={chunk}; its "
            f"chunked_attention layers {chunked[:4]}{' ...' if len(chunked) > 4 else ''} let a token see "
            "only its own chunk of positions, a mask vlmcp's CP plan does not express (exact only for "
            f"samples of at most {chunk} tokens: split or drop the {len(long)} longer sample(s); "
            "Note [vlmcp HF Llama 4 attention])")


def _sample_offsets(shard) -> torch.Tensor:
    """``LongTensor[N]``: each local slot's offset in its sample (0 at padding)."""
    pos = shard.positions
    starts = shard.sample_starts.to(pos.device)[shard.sample_ids.to(pos.device)]
    return torch.where(pos >= 0, pos - starts, torch.zeros_like(pos))


def _sample_lengths(shard) -> list[int]:
    starts = shard.sample_starts.tolist()
    ends = starts[1:] + [int(shard.seq_len)]
    return [b - a for a, b in zip(starts, ends, strict=True)]


def cp_forward(self: nn.Module, hidden_states: torch.Tensor, position_embeddings, attention_mask=None,
               cache=None, **kwargs):
    """``Llama4TextAttention.forward`` of this rank's slots: ``(1, N, d) -> ((1, N, d), None)``."""
    ctx = cp_context(self, hidden_states, cache, kwargs)
    m = sys.modules[type(self).__module__]
    if self.config.layer_types[self.layer_idx] == "chunked_attention":
        check_chunks(self.config, _sample_lengths(ctx.shard), f"Llama 4 layer {self.layer_idx}")
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query_states = self.q_proj(hidden_states).view(hidden_shape)
    key_states = self.k_proj(hidden_states).view(*input_shape, -1, self.head_dim)
    value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    if self.use_rope:
        query_states, key_states = m.apply_rotary_emb(query_states, key_states,
                                                      position_embeddings.to(query_states.device))
    if hasattr(self, "qk_norm"):
        query_states = self.qk_norm(query_states)
        key_states = self.qk_norm(key_states)
    if self.attn_temperature_tuning and not self.use_rope:
        positions = _sample_offsets(ctx.shard).to(hidden_states.device)  # not the local arange
        scales = torch.log1p(torch.floor((positions.float() + 1.0) / self.floor_scale)) * self.attn_scale
        scales = scales + 1.0
        query_states = (query_states * scales.view(1, -1, 1, 1).to(query_states.dtype)).to(query_states.dtype)
    attn_output, _ = hf_attention.vlmcp_attention_forward(
        self, query_states.transpose(1, 2), key_states.transpose(1, 2), value_states, None,
        dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling, **kwargs)
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    return self.o_proj(attn_output), None


def prepare(module: nn.Module) -> None:
    """Run ``module`` (a ``Llama4TextAttention``) under CP from now on (idempotent)."""
    hf_attention.mark(module)
    install_forward(module, cp_forward, _MARK, ("q_proj", "k_proj", "v_proj", "o_proj", "use_rope"),
                    "transformers' Llama4TextAttention")


CLASSES = (("transformers.models.llama4.modeling_llama4", "Llama4TextAttention"),)
"""The attention classes :func:`cp_forward` runs: (transformers module, class name)."""


def register() -> None:
    """Declare :data:`CLASSES` to the token-mixer registry (loaded transformers modules only)."""
    register_classes(CLASSES, prepare)
