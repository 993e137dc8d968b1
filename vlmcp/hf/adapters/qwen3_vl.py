"""Qwen3-VL and Qwen3-VL-MoE: a Qwen-VL ViT with deepstack (``model.visual``).

Inputs, token counts and image selection are Qwen2-VL's (``qwen2_vl.py``). The
projector's last Linear is ``merger.linear_fc2``. Deepstack: the ViT's hidden states
after each block of ``vision_config.deepstack_visual_indexes`` go through their own
merger (``deepstack_merger_list[i]``, last Linear ``linear_fc2``) and are added at the
image tokens after LLM layer ``i`` (``visual_pos_masks``); ``get_image_features``
returns them as ``deepstack_features``, one per level, split per image. Under CP every
level follows the main features' vision mode and placement (Note [vlmcp HF vision
placement]). Positions: interleaved M-RoPE ``(3, L)`` from the model's own
``get_rope_index`` per sample; ``(3, 1, N)`` into the text model, without the text row
(no HF mask: the mask is the plan's).

Videos: Qwen2-VL's inputs, but the processor writes every frame group as its own run,
``<t seconds>`` (text) + vision start + video placeholders + vision end, and
``get_rope_index`` splits ``video_grid_thw`` into ``(1, h, w)`` grids to match: positions from
the model's own rope index on the global row keep the timestamps where they are.
``get_video_features`` is ``get_image_features`` on the video inputs (deepstack included);
the ViT attends within each frame group (per-``t`` ``cu_seqlens``, position interpolation
repeated per ``t``), so frame groups are ``scatter``'s ViT units.

Qwen3-VL-MoE with ``output_router_logits``: its forward adds ``router_aux_loss_coef`` times the
router's load-balancing loss; :meth:`Qwen3VLAdapter.auxiliary_loss` adds each rank's share of
the whole row's (Note [vlmcp HF MoE auxiliary loss under CP]).
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmcp.hf.adapters.qwen2_vl import QwenVLAdapter
from vlmcp.hf.moe_aux import router_aux_loss

__all__ = ["QWEN3_VL", "Qwen3VLAdapter"]


@dataclass(frozen=True, kw_only=True)
class Qwen3VLAdapter(QwenVLAdapter):
    """Qwen3-VL / Qwen3-VL-MoE: images and videos (timestamps between frame groups)."""

    projector_last: str | None = "model.visual.merger.linear_fc2"
    deepstack_output: str | None = "deepstack_features"

    def deepstack_projectors(self, model):
        levels = len(model.config.vision_config.deepstack_visual_indexes)
        return tuple(f"model.visual.deepstack_merger_list.{i}.linear_fc2" for i in range(levels))

    def auxiliary_loss(self, model, output, weights, group):
        return router_aux_loss(model, output, weights, group, ("num_experts",))


QWEN3_VL = Qwen3VLAdapter(name="qwen3_vl", model_types=("qwen3_vl", "qwen3_vl_moe"))
