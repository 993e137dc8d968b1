"""Gemma 4: a patch ViT (``model.vision_tower``), 2-D pooling, ``model.embed_vision``; bidirectional images.

Inputs: ``pixel_values (images, max_patches, 3 * patch**2)``, every image's patch rows padded to the
processor's ``max_patches``, and ``image_position_ids (images, max_patches, 2)``, each patch's (x, y)
in its image, ``(-1, -1)`` at padding. The ViT masks padding, adds 2-D position embeddings and
average-pools each ``k x k`` block of patches (``vision_config.pooling_kernel_size``); so an image gives
``(non-padding patches) / k**2`` LLM tokens, read from ``image_position_ids``, and images are independent
ViT units (``scatter``). ``embed_vision`` (a scale-free RMSNorm, then ``embedding_projection``, the last
``nn.Linear``: ``hidden_shard`` splits it) maps them to the text width.

Attention (transformers 5.24 ``create_masks_for_vision_model``, ``use_bidirectional_attention="vision"``):
on ``sliding_attention`` layers the tokens of one run of ``mm_token_type_ids == 1`` see each other both
ways (``image_attention="bidirectional"``: the runs are the plan's images) and keys ``W`` or more
positions back are cut (the layer's ``sliding_window``); ``full_attention`` layers are causal, images
included, unlike Gemma 3's: :meth:`Gemma4Adapter.prepare_model` marks those modules causal
(:data:`vlmcp.hf.attention.IMAGE_ATTENTION_ATTR`). ``mm_token_type_ids`` is consumed (checked
against the image tokens; the plan is the mask). Full-attention layers have their own head size
(``global_head_dim``) and rotary; per-layer embeddings (``per_layer_inputs`` from the token ids) are
per token. Positions are 1-D. Videos and audio are not taken by this adapter (refused by name).

With ``use_bidirectional_attention`` None (the config's default) every layer is causal, images
included (:meth:`Gemma4Adapter.prepare_model` marks them all); under ``"vision"`` a row with images
and no ``mm_token_type_ids`` is refused (transformers would make its images causal).

Refused: a text config with ``use_bidirectional_attention="all"`` (every token sees every other, not
causal; :meth:`Gemma4Adapter.prepare_model`) and one whose layers share K/V across layers
(``num_kv_shared_layers``: those layers have no K/V projection, and the token-mixer audit names them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from vlmcp.hf.adapters.base import HFAdapter, padded_cat, submodule
from vlmcp.hf.attention import IMAGE_ATTENTION_ATTR

__all__ = ["GEMMA4", "Gemma4Adapter"]


@dataclass(frozen=True, kw_only=True)
class Gemma4Adapter(HFAdapter):
    """Gemma 4 images: padded patch rows with their positions, pooled ``k x k``."""

    pixel_keys: tuple[str, ...] = ("pixel_values", "image_position_ids")
    consumed_keys: tuple[str, ...] = ("attention_mask", "mm_token_type_ids")
    video_keys: tuple[str, ...] = ()
    vision_modules: tuple[str, ...] = ("model.vision_tower", "model.embed_vision")
    projector_last: str | None = "model.embed_vision.embedding_projection"
    image_attention: Literal["causal", "bidirectional"] = "bidirectional"

    def prepare_model(self, model):
        text = model.config.text_config
        if getattr(text, "use_bidirectional_attention", None) == "all":
            raise ValueError("Gemma 4 with use_bidirectional_attention='all' (every token sees every other) "
                             "is refused: vlmcp's plan is causal outside images")
        if int(getattr(text, "num_kv_shared_layers", 0) or 0):
            raise ValueError(f"Gemma 4 with num_kv_shared_layers={text.num_kv_shared_layers} (later layers "
                             "reuse earlier layers' K/V) is refused: not checked under CP by vlmcp")
        # HF: image blocks are bidirectional on sliding layers only, and only under "vision" (the
        # config's default, None, keeps every layer causal, images included)
        bidirectional = getattr(text, "use_bidirectional_attention", None) == "vision"
        layers = submodule(model, self.language_model).layers
        for layer, kind in zip(layers, text.layer_types, strict=True):
            if kind == "full_attention" or not bidirectional:
                setattr(layer.self_attn, IMAGE_ATTENTION_ATTR, "causal")

    def check_row(self, model, keys, has_images):
        if (has_images and "mm_token_type_ids" not in keys
                and getattr(model.config.get_text_config(), "use_bidirectional_attention", None) == "vision"):
            raise ValueError("Gemma 4 rows with images need mm_token_type_ids (the processor's output): "
                             "without it transformers' forward makes images causal on every layer, while "
                             "use_bidirectional_attention='vision' asks for bidirectional image blocks; "
                             "pass the processor's mm_token_type_ids")

    def _k2(self, config) -> int:
        return int(config.vision_config.pooling_kernel_size) ** 2

    def image_tokens(self, model, pixels):
        pv, pos = pixels.get("pixel_values"), pixels.get("image_position_ids")
        if pv is None or pos is None or pv.dim() != 3 or pos.shape != (*pv.shape[:2], 2):
            raise ValueError("Gemma 4 images need pixel_values (images, patches, values) and "
                             "image_position_ids (images, patches, 2), got "
                             f"{None if pv is None else tuple(pv.shape)} and "
                             f"{None if pos is None else tuple(pos.shape)}")
        real = (torch.as_tensor(pos) != -1).all(-1).sum(-1)
        k2 = self._k2(model.config)
        if bool((real % k2).any()):
            raise ValueError(f"Gemma 4 images of {real.tolist()} patches: each must be a multiple of "
                             f"pooling_kernel_size**2 = {k2}")
        return (real // k2).tolist()

    def select_images(self, pixels, index):
        if not pixels:
            return {}
        take = torch.as_tensor(index, dtype=torch.long)
        return {k: pixels[k][take.to(pixels[k].device)] for k in self.pixel_keys}

    def concat_images(self, parts):
        parts = [p for p in parts if p]
        if not parts:
            return {}
        return {"pixel_values": padded_cat([p["pixel_values"] for p in parts], (-2,)),
                "image_position_ids": torch.cat([torch.nn.functional.pad(
                    p["image_position_ids"], (0, 0, 0, max(q["image_position_ids"].shape[1] for q in parts)
                                              - p["image_position_ids"].shape[1]), value=-1) for p in parts])}

    def blank_patches(self, config, sizes, dtype: torch.dtype) -> dict:
        """The per-image inputs of images of ``sizes`` (``(h, w)`` patches each) with zero pixels: patch
        rows padded to the largest image, their ``(x, y)`` positions, ``-1`` at the padding."""
        vc = config.vision_config
        width = 3 * int(vc.patch_size) ** 2
        most = max(h * w for h, w in sizes)
        pv = torch.zeros(len(sizes), most, width, dtype=dtype)
        pos = torch.full((len(sizes), most, 2), -1, dtype=torch.long)
        for i, (h, w) in enumerate(sizes):
            ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
            pos[i, :h * w] = torch.stack([xs.flatten(), ys.flatten()], -1)
        return {"pixel_values": pv, "image_position_ids": pos}

    def dummy_images(self, model):
        k = int(model.config.vision_config.pooling_kernel_size)
        w = model.model.embed_vision.embedding_projection.weight
        out = self.blank_patches(model.config, [(k, k)], w.dtype)
        return {key: v.to(w.device) for key, v in out.items()}

GEMMA4 = Gemma4Adapter(name="gemma4", model_types=("gemma4",), logit_softcap="final_logit_softcapping")
