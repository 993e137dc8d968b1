"""Gemma 3: a SigLIP ``model.vision_tower`` and ``model.multi_modal_projector``; bidirectional images.

Inputs: ``pixel_values (n, 3, S, S)``, one fixed-size image per row, each giving
``mm_tokens_per_image`` LLM tokens (the projector average-pools the ViT's patch grid to
``sqrt(mm_tokens_per_image)`` per side, RMS-normalizes and multiplies by
``mm_input_projection_weight``), and ``token_type_ids (1, L)``: 1 at the image tokens.
The processor writes each image as ``<start_of_image>``, the image tokens, ``<end_of_image>``
(the markers are text), so every image is its own run of image tokens.

Attention (transformers 5.24, ``create_masks_for_vision_model``): the tokens of one run of
``token_type_ids == 1`` see each other both ways (``image_attention="bidirectional"``, the
images being the plan's ``image_ids``); ``sliding_attention`` layers also cut keys W or
more positions before the query (the layer's ``sliding_window``, passed to
``cp_attention``). ``token_type_ids`` is consumed: ``shard_inputs`` checks it against the
image tokens and the plan is the mask. Positions are 1-D.

Vision modes: ``replicate``, ``allreduce_hook``, ``broadcast`` and ``scatter``. Not
``hidden_shard``: the projector ends in a matmul with a bare parameter, not an
``nn.Linear`` whose output columns vlmcp can split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vlmcp.hf.adapters.base import HFAdapter, blank_image, fixed_size_images, select_rows

__all__ = ["GEMMA3", "Gemma3Adapter"]


@dataclass(frozen=True, kw_only=True)
class Gemma3Adapter(HFAdapter):
    """Gemma 3 (one fixed-size image per ``pixel_values`` row, bidirectional within each image)."""

    consumed_keys: tuple[str, ...] = ("attention_mask", "token_type_ids")
    vision_modules: tuple[str, ...] = ("model.vision_tower", "model.multi_modal_projector")
    # Only the features' dtype and device are read from it (broadcast, scatter): the projector's last
    # step is ``@ mm_input_projection_weight``, so there is no Linear to name and no hidden_shard.
    projector_last: str | None = "model.multi_modal_projector.mm_soft_emb_norm"
    image_attention: Literal["causal", "bidirectional"] = "bidirectional"
    features_per_image: bool = False  # pooler_output is one (images, tokens, D) tensor; HF calls .to on it

    @property
    def vision_modes(self) -> tuple[str, ...]:
        return ("replicate", "allreduce_hook", "broadcast", "scatter")

    def image_tokens(self, model, pixels):
        pv = fixed_size_images(pixels, model.config, "Gemma 3")
        return [int(model.config.mm_tokens_per_image)] * pv.shape[0]

    def select_images(self, pixels, index):
        return select_rows(pixels, index)

    def dummy_images(self, model):
        side = model.config.vision_config.image_size
        weight = model.model.multi_modal_projector.mm_input_projection_weight
        return blank_image(model.config, weight, side, side)

GEMMA3 = Gemma3Adapter(name="gemma3", model_types=("gemma3",))
