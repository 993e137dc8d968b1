"""MiniMax-M3-VL: a Qwen2.5-VL-style patch ViT (``model.vision_tower``), a two-stage projector, an MoE LM.

Inputs: ``pixel_values`` holds the patch rows of all images in order (image i has ``t*h*w`` rows of
``image_grid_thw[i]``, each row ``channels * temporal_patch * patch**2`` values, as Qwen-VL's); the ViT
attends within each image and its 3-D rotary depends on the image's own grid, so images are
independent ViT units. ``multi_modal_projector`` maps every patch to the text width
(``linear_1`` -> GELU -> ``linear_2``), then fuses each ``merge x merge`` group into one token
(``merge_linear_1`` -> GELU -> ``merge_linear_2``, the last ``nn.Linear``): ``t*h*w / merge**2``
LLM tokens per image, read from ``image_grid_thw``. Positions are 1-D.

The language model (``MiniMaxM3VLTextModel``): attention with per-head Gemma-style q/k norms and
partial rotary through ``ALL_ATTENTION_FUNCTIONS``; layers of type ``"minimax_m3_sparse"`` add a
block-sparse indexer (top-k key blocks per query), which vlmcp refuses by name (Note [vlmcp HF token
mixers]: its dense attention is not what that layer computes). MLPs: dense or MoE (a sigmoid router
with a score-correction bias, routed and shared experts), per token. With ``output_router_logits``
the forward adds ``router_aux_loss_coef`` times the load-balancing loss of the softmax of the router
logits: :meth:`MiniMaxM3VLAdapter.auxiliary_loss` adds each rank's share (Note [vlmcp HF MoE auxiliary
loss under CP]). Videos (``pixel_values_videos``) are not taken by this adapter (refused by name).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmcp.hf.adapters.qwen2_vl import QwenVLAdapter
from vlmcp.hf.moe_aux import router_aux_loss

__all__ = ["MINIMAX_M3_VL", "MiniMaxM3VLAdapter"]


@dataclass(frozen=True, kw_only=True)
class MiniMaxM3VLAdapter(QwenVLAdapter):
    """MiniMax-M3-VL images (Qwen-VL patch rows + ``image_grid_thw``), 1-D positions."""

    consumed_keys: tuple[str, ...] = ("attention_mask",)
    video_keys: tuple[str, ...] = ()
    video_pixel_keys: tuple[str, ...] = ()
    vision_modules: tuple[str, ...] = ("model.vision_tower", "model.multi_modal_projector")
    projector_last: str | None = "model.multi_modal_projector.merge_linear_2"

    def _row_width(self, model) -> int:
        vc = model.config.vision_config
        return int(vc.num_channels * vc.temporal_patch_size * vc.patch_size ** 2)

    def dummy_images(self, model):
        m = self._merge(model)
        w = model.model.multi_modal_projector.linear_1.weight
        return {"pixel_values": torch.zeros(m * m, self._row_width(model), dtype=w.dtype, device=w.device),
                "image_grid_thw": torch.tensor([[1, m, m]], device=w.device)}

    def position_ids(self, model, input_ids, token_type, pixels, videos=None):
        return torch.arange(input_ids.numel(), device=input_ids.device).unsqueeze(0)

    def model_position_ids(self, local):
        return local

    def auxiliary_loss(self, model, output, weights, group):
        return router_aux_loss(model, output, weights, group, ("num_local_experts",))


MINIMAX_M3_VL = MiniMaxM3VLAdapter(name="minimax_m3_vl", model_types=("minimax_m3_vl",))
