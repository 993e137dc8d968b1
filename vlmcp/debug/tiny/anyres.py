"""Tiny any-resolution VLM configs: InternVL, LLaVA-OneVision/NeXT, SmolVLM/Idefics3, Mistral3.

The shared small GQA language model (:func:`~vlmcp.debug.tiny.common.text_config`), 8x8-pixel
image tiles in 2x2-pixel patches.
What each image gives the language model depends on its metadata, as in the real models:

=================  ========================================================================
``internvl``       every tile 16 patches, pixel-shuffled 2x2: 4 tokens per tile
``llava_onevision`` a base tile (16 tokens) + the anyres grid of 8x8 tiles (pinpoints up to
                   16x24 px), unpadded to the image's aspect ratio, shrunk to ``anyres_max_1``
                   (one tile's area), one newline per row; images of a multi-image sample:
                   base tile + one newline
``llava_next``     LLaVA-NeXT: a CLIP tower (CLS dropped), anyres grid, unpadded, newlines
``smolvlm``        every tile 16 patches, pixel-shuffled 2x2: 4 tokens
``idefics3``       the same, Idefics3's modules
``mistral3``       Pixtral at native size: one token per 4x4 px (2x2 patches merged), rows
                   ended by ``[IMG_BREAK]``, the image by ``[IMG_END]``
=================  ========================================================================

Token ids: vocabulary 128, image token 120 (LLaVA-OneVision: video 121; SmolVLM/Idefics3:
``<fake_token_around_image>`` 121, ``<global-img>`` 122; Mistral3: ``[IMG_BREAK]`` 121,
``[IMG_END]`` 122), pad 0.
"""

from __future__ import annotations

import functools
from typing import Any

from vlmcp.debug.tiny.common import IMAGE_TOKEN, text_config
from vlmcp.debug.tiny.registry import register_tiny

__all__ = ["ONEVISION_VIDEO_SAMPLES", "PINPOINTS", "SIDE"]

SIDE = 8
"""Pixels per side of a tile (and of a Pixtral merge unit's multiples)."""
PINPOINTS = [[8, 8], [8, 16], [16, 8], [16, 16], [8, 24], [24, 8]]
"""LLaVA-NeXT/OneVision anyres resolutions (height, width) in pixels: up to 2x2 or 1x3 tiles."""


def _vit(**extra: Any) -> dict[str, Any]:
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                  image_size=SIDE, patch_size=2, num_channels=3)
    vision.update(extra)
    return vision


def _anyres(arch: str, overrides: dict[str, Any]) -> Any:
    """The tiny config of ``arch``.

    ``overrides`` as :func:`vlmcp.debug.tiny.tiny_config` takes them (``text_config`` and
    ``vision_config`` update field by field, other keys are top-level).
    """
    import transformers

    text = text_config(**overrides.pop("text_config", {}))
    if arch == "internvl":
        cls = transformers.InternVLConfig
        text["model_type"] = "qwen2"
        vision = _vit(model_type="internvl_vision", use_mask_token=False, layer_scale_init_value=0.1)
        kw = dict(image_token_id=IMAGE_TOKEN, image_seq_length=4, downsample_ratio=0.5,
                  vision_feature_layer=-1, vision_feature_select_strategy="default")
    elif arch in ("llava_onevision", "llava_next"):
        onevision = arch == "llava_onevision"
        cls = transformers.LlavaOnevisionConfig if onevision else transformers.LlavaNextConfig
        text["model_type"] = "qwen2" if onevision else "llama"
        # OneVision: SigLIP (no CLS, "full"); NeXT: CLIP with its CLS dropped ("default")
        vision = (_vit(model_type="siglip_vision_model") if onevision
                  else _vit(model_type="clip_vision_model", projection_dim=16))
        kw = dict(image_token_index=IMAGE_TOKEN, image_grid_pinpoints=PINPOINTS, vision_feature_layer=-1,
                  vision_feature_select_strategy="full" if onevision else "default",
                  image_seq_length=16)
        if onevision:
            kw.update(video_token_index=IMAGE_TOKEN + 1, vision_aspect_ratio="anyres_max_1")
    elif arch in ("smolvlm", "idefics3"):
        cls = transformers.SmolVLMConfig if arch == "smolvlm" else transformers.Idefics3Config
        text["model_type"] = "llama"
        vision = _vit(model_type=f"{arch}_vision")
        kw = dict(image_token_id=IMAGE_TOKEN, scale_factor=2)
    elif arch == "mistral3":
        cls = transformers.Mistral3Config
        text.update(model_type="mistral", sliding_window=None)
        vision = _vit(model_type="pixtral", image_size=4 * SIDE, head_dim=8,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        kw = dict(image_token_index=IMAGE_TOKEN, spatial_merge_size=2, vision_feature_layer=-1,
                  multimodal_projector_bias=True)
    else:
        raise ValueError(f"no any-resolution tiny config for {arch!r}")
    vision.update(overrides.pop("vision_config", {}))
    kw.update(text_config=text, vision_config=vision, tie_word_embeddings=False)
    kw.update(overrides)
    return cls(**kw)


_SAMPLES = {
    "internvl": ((5, (2,), 9), (12,), (3, (1,), 4, (3,), 7)),
    "llava_onevision": ((5, (6, 20), 9), (12,), (3, (16, 5), 4, (8, 8), 7)),
    "smolvlm": ((5, (2, 1), 9), (12,), (3, (1, 1), 4, (1, 3), 7)),
    "mistral3": ((5, (2, 3), 9), (12,), (3, (4, 1), 4, (1, 2), 7)),
}
"""The verification row of each family (``vlmcp verify --model``, in the adapter's image tuples): an image
after a prompt, a text-only sample, two images with text between. InternVL ``(tiles,)``;
LLaVA-OneVision/NeXT ``(height, width)`` in eighths of a tile (a wide image shrunk by ``anyres_max``; a
two-image sample, untiled in OneVision); SmolVLM/Idefics3 ``(rows, cols)`` of crops (``(1, 1)``: the
global image alone); Mistral3 ``(rows, cols)`` of tokens. Keyed by ``config.model_type``."""
_SAMPLES["llava_next"] = _SAMPLES["llava_onevision"]
ONEVISION_VIDEO_SAMPLES = ((5, ("video", 3), 9), (12,), (3, (16, 5), 4, ("video", 3), 2, (8, 8), 7))
"""LLaVA-OneVision's ``vlmcp verify --video`` row: videos of 3 frames (every video of a row has the same
count), a text-only sample, two images (untiled: one sample's) around a video."""
_SAMPLES["idefics3"] = _SAMPLES["smolvlm"]

for _arch, _summary in (("internvl", "4 tokens per tile"), ("llava_onevision", "base tile + anyres grid"),
                        ("llava_next", "CLIP, anyres grid"), ("smolvlm", "global image + crops"),
                        ("idefics3", "global image + crops"), ("mistral3", "Pixtral at native size")):
    register_tiny(_arch, functools.partial(_anyres, _arch), samples=_SAMPLES[_arch], summary=_summary,
                  video_samples=ONEVISION_VIDEO_SAMPLES if _arch == "llava_onevision" else None)
