"""GLM-4.1V: a Qwen-VL-style ViT (``model.visual``) with a gated-MLP projector.

Inputs, token counts and image selection are Qwen2-VL's (``qwen2_vl.py``): patch rows
of all images in ``pixel_values`` with ``image_grid_thw``, ``t*h*w / merge**2`` LLM
tokens per image. The ViT ends in a strided convolution (``downsample``) and
``merger`` (``proj`` -> norm -> gated MLP), whose last Linear is ``merger.down_proj``.
Positions: M-RoPE ``(3, L)`` from the model's own ``get_rope_index`` per sample (GLM's
text model rotates half of each head, interleaving the T/H/W sections);
``(3, 1, N)`` into the text model, without the text row.

Videos: ``pixel_values_videos`` / ``video_grid_thw`` as Qwen2-VL's, but every frame group
is written ``<|begin_of_image|>`` + image placeholders + ``<|end_of_image|>`` + its
timestamp, inside ``<|begin_of_video|> ... <|end_of_video|>``: video tokens *are* image
tokens, told apart only by ``mm_token_type_ids`` (2), which a row with videos must carry.
``get_video_features`` runs each frame group as a ``(1, h, w)`` grid (the ViT attends within
it), so frame groups are ``scatter``'s ViT units here too. transformers' own forward fills
images and videos at the same placeholder, so it cannot take both in one row (it raises
"Image features and image tokens do not match"): ``shard_inputs`` refuses such a row up front.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmcp.hf.adapters.qwen2_vl import QwenVLAdapter

__all__ = ["GLM4V", "Glm4vAdapter"]


@dataclass(frozen=True, kw_only=True)
class Glm4vAdapter(QwenVLAdapter):
    """GLM-4.1V: images, or videos (not both in one row)."""

    projector_last: str | None = "model.visual.merger.down_proj"
    mixes_images_and_videos: bool = False

    def video_token_id(self, config) -> int:
        return self.image_token_id(config)  # frames are written with the image placeholder

    def token_types(self, config, input_ids, mm_token_type_ids, videos):
        placeholder = input_ids == self.image_token_id(config)
        if mm_token_type_ids is None:
            if videos:
                raise ValueError("GLM-4.1V writes video frames with the image placeholder: a row with videos "
                                 "needs mm_token_type_ids (2 at video tokens) to tell them from images")
            return placeholder.int()
        bad = placeholder & (mm_token_type_ids != 1) & (mm_token_type_ids != 2)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"mm_token_type_ids must be 1 (image) or 2 (video) at every image placeholder; "
                             f"position {i} has {int(mm_token_type_ids[i])}")
        return torch.where(placeholder, mm_token_type_ids.int(), 0)


GLM4V = Glm4vAdapter(name="glm4v", model_types=("glm4v",))
