"""Qwen3.5 and Qwen3.5-MoE: Qwen3-VL's ViT without deepstack, and a hybrid language model.

The vision side is Qwen3-VL's (``qwen3_vl.py``, itself Qwen2-VL's inputs): ``pixel_values``
+ ``image_grid_thw``, ``t*h*w / merge**2`` LLM tokens per image, the projector's last
Linear ``model.visual.merger.linear_fc2``, interleaved M-RoPE ``(3, L)`` from the model's
own ``get_rope_index`` per sample; no deepstack levels. Videos are Qwen3-VL's too: the
processor is ``Qwen3VLProcessor``, which writes every frame group as ``<t seconds>`` (text) +
vision start + video placeholders + vision end, and the model's ``get_rope_index`` splits
``video_grid_thw`` into ``(1, h, w)`` grids to match; ``get_video_features`` is
``get_image_features`` on the video inputs, whose ViT attends within each frame group, so
frame groups are ``scatter``'s ViT units (Note [vlmcp HF videos: frame groups are visual units]).

The language model interleaves Gated DeltaNet layers (three in four) with gated softmax
attention: the attention goes through vlmcp attention like any other (its output gate and
partial rotary are per-token steps HF does around the call), the Gated DeltaNet through
:mod:`vlmcp.hf.layers.gdn`. Qwen3.5-MoE's decoder MLPs are sparse MoE blocks (a softmax
top-k router, experts, a gated shared expert): per token, nothing to parallelize.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmcp.hf.adapters.qwen3_vl import Qwen3VLAdapter

__all__ = ["QWEN3_5", "QWEN3_5_MOE", "Qwen3_5Adapter"]


@dataclass(frozen=True, kw_only=True)
class Qwen3_5Adapter(Qwen3VLAdapter):
    """Qwen3.5 / Qwen3.5-MoE: images and videos (timestamps between frame groups), no deepstack."""

    deepstack_output: str | None = None

    def deepstack_projectors(self, model):
        return ()


QWEN3_5 = Qwen3_5Adapter(name="qwen3_5", model_types=("qwen3_5",))
QWEN3_5_MOE = Qwen3_5Adapter(name="qwen3_5_moe", model_types=("qwen3_5_moe",))
