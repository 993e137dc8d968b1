"""The reference decoder-only LLM: RMSNorm, RoPE, GQA attention through CP, SwiGLU.

Every token-wise layer (norms, projections, MLP) runs on the rank's local tokens
unchanged; only attention needs the rest of the row, and it goes through
:func:`vlmcp.attention.cp_attention`. With a CP group of one the model is an
ordinary single-process model, which is how the tests build their reference.

Padding slots (``shard.positions == -1``) enter as zero embeddings; attention
gives them zero output and nothing here adds a bias, so they stay zero and carry
no gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from vlmcp.attention import cp_attention
from vlmcp.layout import RankShard
from vlmcp.loss import CPLoss, cp_linear_cross_entropy

__all__ = ["DecoderLLM", "LLMConfig"]


@dataclass(frozen=True, kw_only=True)
class LLMConfig:
    """Shape of the reference LLM."""

    vocab_size: int
    """Number of token ids."""
    hidden: int = 64
    """Model width (also the width image embeddings must have)."""
    layers: int = 2
    """Decoder blocks."""
    heads: int = 4
    """Query heads."""
    kv_heads: int = 2
    """Key/value heads (GQA); must divide ``heads``."""
    mlp_hidden: int = 128
    """SwiGLU inner width."""
    rope_theta: float = 10000.0
    """RoPE base."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon."""

    def __post_init__(self):
        for name in ("vocab_size", "hidden", "layers", "heads", "kv_heads", "mlp_hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"LLMConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ValueError(f"LLMConfig.hidden={self.hidden} is not divisible by heads={self.heads}")
        if (self.hidden // self.heads) % 2:
            raise ValueError(f"head_dim={self.hidden // self.heads} must be even for RoPE")
        if self.heads % self.kv_heads:
            raise ValueError(f"LLMConfig.heads={self.heads} is not divisible by kv_heads={self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in at least fp32: bf16 mean-of-squares loses the small rows.
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """``(cos, sin)`` of shape ``(N, 1, head_dim)`` for the tokens' positions (once per forward)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=position_ids.device,
                                            dtype=torch.float64) / head_dim)
    freqs = position_ids.to(torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)[:, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (N, heads, head_dim) by precomputed ``cos``/``sin`` (rotate-half form)."""
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class CPSelfAttention(nn.Module):
    def __init__(self, cfg: LLMConfig):
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False)

    def forward(self, x, rope, shard, group, backend, image_attention):
        n, c = x.shape[0], self.cfg
        q = apply_rope(self.q_proj(x).view(n, c.heads, c.head_dim), *rope)
        k = apply_rope(self.k_proj(x).view(n, c.kv_heads, c.head_dim), *rope)
        v = self.v_proj(x).view(n, c.kv_heads, c.head_dim)
        if callable(backend):  # a stand-in attention, e.g. vlmcp compare's no-exchange baseline
            out = backend(q, k, v, shard, group, image_attention)
        else:
            out = cp_attention(q, k, v, shard, group, backend=backend, image_attention=image_attention)
        return self.o_proj(out.reshape(n, c.heads * c.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, cfg: LLMConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.hidden, cfg.mlp_hidden, bias=False)
        self.up = nn.Linear(cfg.hidden, cfg.mlp_hidden, bias=False)
        self.down = nn.Linear(cfg.mlp_hidden, cfg.hidden, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class DecoderBlock(nn.Module):
    def __init__(self, cfg: LLMConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.attn = CPSelfAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, rope, shard, group, backend, image_attention):
        x = x + self.attn(self.attn_norm(x), rope, shard, group, backend, image_attention)
        return x + self.mlp(self.mlp_norm(x))


class DecoderLLM(nn.Module):
    """Decoder-only LM over a rank's local tokens.

    ``forward(inputs_embeds, position_ids, shard, group)`` maps the local embeddings
    ``(N, hidden)`` (already merged with image embeddings) to logits ``(N, vocab)``; with
    ``labels`` it returns the rank's loss instead, the head computed inside the forward a
    chunk of tokens at a time (:func:`vlmcp.cp_linear_cross_entropy`: never the logits).
    """

    def __init__(self, cfg: LLMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.Tensor,
        shard: RankShard,
        group: dist.ProcessGroup | None,
        backend: str | Callable = "ring",
        image_attention: str = "causal",
        labels: torch.Tensor | None = None,
    ) -> torch.Tensor | CPLoss:
        """Args: inputs_embeds (N, hidden); position_ids (N,) local RoPE positions;
        backend: ``"ring"``, ``"ulysses"``, or a callable
        ``(q, k, v, shard, group, image_attention) -> out`` standing in for
        :func:`cp_attention` (``vlmcp compare`` uses one for the naive baseline);
        labels: (N,) targets (``-100``: none), or None.

        Returns: logits (N, vocab_size); with ``labels``, the :class:`~vlmcp.CPLoss` of this
        rank's tokens over ``group``. Inside the forward, so that DDP sees it as the output.
        """
        x = inputs_embeds
        rope = rope_cos_sin(position_ids, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for block in self.blocks:
            x = block(x, rope, shard, group, backend, image_attention)
        if labels is not None:
            return cp_linear_cross_entropy(self.norm(x), self.lm_head.weight, labels, group,
                                           bias=self.lm_head.bias)
        return self.lm_head(self.norm(x))
