"""The reference VLM: ViT + projector, merged into the image spans of each sample, LLM on top.

::

    images ──ViT+projector (placed on the CP group)──> image_embeds (I, hidden), on every rank
    input_ids[local] ──embed──> (N, hidden) ──merge──> x (N, hidden) ──LLM (cp_attention)──> logits

With ``group=None`` and a plan of ``cp_size=1`` it is an ordinary single-process
model: the reference the tests and ``vlmcp verify`` compare CP against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.layout import RankShard
from vlmcp.loss import CPLoss
from vlmcp.models.llm import DecoderLLM, LLMConfig
from vlmcp.models.merge import merge_embeddings
from vlmcp.vision import VisionConfig, VisionEncoder, check_images_match

__all__ = ["VLM", "VLMConfig"]


@dataclass(frozen=True, kw_only=True)
class VLMConfig:
    """A reference VLM: the LLM's shape and the vision encoder's (its ``out_dim`` is the LLM width)."""

    llm: LLMConfig
    """Decoder LLM shape."""
    vision: VisionConfig = field(default=None)  # type: ignore[assignment]
    """ViT + projector shape; default: a small ViT with ``out_dim = llm.hidden``."""

    def __post_init__(self):
        if self.vision is None:
            object.__setattr__(self, "vision", VisionConfig(out_dim=self.llm.hidden))
        if self.vision.out_dim != self.llm.hidden:
            raise ValueError(f"vision out_dim={self.vision.out_dim} must equal the LLM hidden size "
                             f"{self.llm.hidden}: image embeddings enter the LLM as tokens")


class VLM(nn.Module):
    """``forward(input_ids, position_ids, images, shard, group)`` -> local logits ``(N, vocab)``."""

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.cfg = cfg
        self.vision = VisionEncoder(cfg.vision)
        self.llm = DecoderLLM(cfg.llm)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        images: list[torch.Tensor],
        shard: RankShard,
        group: dist.ProcessGroup | None,
        backend: str | Callable = "ring",
        image_attention: str = "causal",
        labels: torch.Tensor | None = None,
    ) -> torch.Tensor | CPLoss:
        """Logits of this rank's tokens (with ``labels``: their loss, never the logits).

        Args:
            input_ids: ``(N,)`` local token ids (``shard.shard(row_ids)``).
            position_ids: ``(N,)`` local RoPE positions, computed on the global row.
            images: ``(3, H, W)`` images, one per image span of the plan, in row order;
                the same on every rank of the CP group.
            shard: this rank's :class:`RankShard`.
            group: the CP group (None: single process, ``shard.cp_size`` must be 1).
            backend: ``"ring"``, ``"ulysses"`` or a stand-in callable (see :class:`DecoderLLM`).
            image_attention: ``"causal"`` or ``"bidirectional"``.
            labels: ``(N,)`` local targets (``shard.shard_labels``): return this rank's
                :class:`~vlmcp.CPLoss` over ``group`` instead of logits, the LM head and the
                loss a chunk of tokens at a time (:func:`vlmcp.cp_linear_cross_entropy`).
        """
        if input_ids.shape != (shard.num_tokens,) or position_ids.shape != (shard.num_tokens,):
            raise ValueError(f"input_ids and position_ids must have shape ({shard.num_tokens},), got "
                             f"{tuple(input_ids.shape)} and {tuple(position_ids.shape)}")
        # Checked on every rank before the placement's first collective.
        check_images_match(images, shard.plan, self.cfg.vision.patch_size,
                           channels=self.cfg.vision.channels, embed_dim=self.vision.out_dim,
                           hidden_size=self.cfg.llm.hidden)
        image_embeds = self.vision(images)
        text_embeds = self.llm.embed(input_ids)
        x = merge_embeddings(text_embeds, image_embeds.to(text_embeds.dtype), shard)
        return self.llm(x, position_ids, shard, group, backend, image_attention, labels=labels)
