"""LLaVA-NeXT and LLaVA-OneVision: any-resolution images as a base tile plus a grid of tiles.

Inputs: ``pixel_values`` holds every image's tiles, ``(images, max_tiles, 3, S, S)`` padded
(or ``(tiles, 3, S, S)`` concatenated); ``image_sizes (images, 2)`` the original height
and width; LLaVA-OneVision's ``batch_num_images`` the image count of each sample (a
sample with several images sends each as its base tile only). ``get_image_features``
runs the ViT on every tile, projects, and packs each image (Note [vlmcp anyres tokens]);
its ``image_newline`` is a parameter of the base model in the features' width, so it is
a vision parameter (``vision_params``): the mode's gradient rule, and ``hidden_shard``
keeps this rank's columns of it as it does of the projector's last Linear ``linear_2``.

Note [vlmcp anyres tokens]
--------------------------
What one image gives the LLM, from its metadata alone, as ``pack_image_features`` and the
processor compute it (``side = image_size // patch_size``; CLS dropped by ``"default"``)::

    one image of a multi-image sample (OneVision):   side*side + 1          base tile, newline
    otherwise: grid (gh, gw) = best pinpoint of image_sizes / image_size
        base tile                                     side*side
        grid features  (gh*side) x (gw*side), unpadded to the original aspect ratio: h x w
        OneVision anyres_max_N: r = sqrt(h*w / (N*side^2)); r > 1.1: h, w = h // r, w // r
        one image_newline per row                     h * (w + 1)

The unit vlmcp splits and places (``image_tokens``, ``select_images``) is what the ViT call
can take on its own: one image, or all images of a multi-image sample together (their
``batch_num_images`` entry; one of them alone would be tiled). Positions are 1-D.

LLaVA-OneVision videos: ``pixel_values_videos (videos, frames, 3, S, S)``, every video of a
row with the same frame count (one tensor). ``get_video_features`` runs every frame through
the ViT and projector, pools each frame's ``side x side`` features 2x2 (bilinear, to
``ceil(side / 2)`` per side) and appends one ``image_newline`` per video: ``frames *
ceil(side / 2)^2 + 1`` ``<video>`` tokens, returned as one ``(videos, tokens, D)`` tensor the
forward flattens (``video_features_batched``). The newline is appended per call, so a video's
frames cannot be split between calls: a whole video is one ViT unit (``frame_groups`` gives
it one group), and ``scatter`` balances whole videos.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vlmcp.hf.adapters.base import HFAdapter, padded_cat

__all__ = ["LLAVA_NEXT", "LLAVA_ONEVISION", "LlavaNextAdapter"]


@dataclass(frozen=True, kw_only=True)
class LlavaNextAdapter(HFAdapter):
    """LLaVA-NeXT (``anyres_max`` None) and LLaVA-OneVision (``batch_num_images``, ``anyres_max``)."""

    pixel_keys: tuple[str, ...] = ("pixel_values", "image_sizes")
    video_keys: tuple[str, ...] = ("pixel_values_videos", "image_sizes_videos")
    vision_modules: tuple[str, ...] = ("model.vision_tower", "model.multi_modal_projector")
    vision_params: tuple[str, ...] = ("model.image_newline",)
    projector_last: str | None = "model.multi_modal_projector.linear_2"
    onevision: bool = False
    """LLaVA-OneVision: ``batch_num_images`` and the ``vision_aspect_ratio`` shrink."""

    def _tiled(self, pixels) -> list[bool]:
        """Per image: does the ViT call tile it (else: base tile only)."""
        sizes = pixels["image_sizes"]
        counts = pixels.get("batch_num_images")
        if counts is None:
            return [True] * len(sizes)
        counts = [int(n) for n in counts]
        if sum(counts) != len(sizes):
            raise ValueError(f"batch_num_images {counts} counts {sum(counts)} images, image_sizes has "
                             f"{len(sizes)}")
        return [n == 1 for n in counts for _ in range(n)]

    def _units(self, pixels) -> list[list[int]]:
        """The images of each unit the ViT call takes on its own (module docstring), in order."""
        counts = pixels.get("batch_num_images")
        if counts is None:
            return [[i] for i in range(len(pixels["image_sizes"]))]
        out, i = [], 0
        for n in (int(n) for n in counts):
            if n == 1:
                out.append([i])
            elif n > 1:
                out.append(list(range(i, i + n)))
            i += n
        return out

    def _grid(self, config, size) -> tuple[int, int]:
        from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape

        return get_anyres_image_grid_shape([int(x) for x in size], config.image_grid_pinpoints,
                                           config.vision_config.image_size)

    def tiles(self, config, size, tiled: bool) -> int:
        """ViT tiles of one image: the base tile and its grid."""
        if not tiled:
            return 1
        gh, gw = self._grid(config, size)
        return 1 + gh * gw

    def tokens_of(self, config, size, tiled: bool) -> int:
        """LLM tokens of one image of ``size`` (height, width); Note [vlmcp anyres tokens]."""
        vc = config.vision_config
        side = vc.image_size // vc.patch_size
        if not tiled:
            return side * side + 1
        gh, gw = self._grid(config, size)
        h, w = gh * side, gw * side
        oh, ow = (int(x) for x in size)
        if ow / oh > w / h:  # unpad_image, as the model computes it
            pad = (h - int(round(oh * (w / ow), 7))) // 2
            h -= 2 * pad
        else:
            pad = (w - int(round(ow * (h / oh), 7))) // 2
            w -= 2 * pad
        if self.onevision:
            most = int(config.vision_aspect_ratio.removeprefix("anyres_max_"))
            ratio = math.sqrt(h * w / (most * side ** 2))
            if ratio > 1.1:
                h, w = int(h // ratio), int(w // ratio)
        return side * side + h * (w + 1)

    def _check(self, config, pixels) -> None:
        pv, sizes = pixels.get("pixel_values"), pixels.get("image_sizes")
        if pv is None or sizes is None:
            raise ValueError(f"{self.name} images need both pixel_values and image_sizes")
        sizes = torch.as_tensor(sizes)
        if pv.dim() != 5 or sizes.dim() != 2 or sizes.shape[1] != 2 or len(sizes) != pv.shape[0]:
            raise ValueError(f"{self.name}: pixel_values must be (images, tiles, 3, H, W) as the processor "
                             f"pads them, and image_sizes (images, 2); got {tuple(pv.shape)} and "
                             f"{tuple(sizes.shape)}")
        vc = config.vision_config
        if config.vision_feature_select_strategy == "full" and vc.model_type == "clip_vision_model":
            raise ValueError(f"{self.name} with vision_feature_select_strategy='full' keeps the CLIP CLS, "
                             "which the model cannot pack into its tile grid")
        need = max(self.tiles(config, s, t) for s, t in zip(sizes, self._tiled(pixels), strict=True))
        if pv.shape[1] < need:
            raise ValueError(f"{self.name}: pixel_values holds {pv.shape[1]} tiles per image but image_sizes "
                             f"{sizes.tolist()} need {need}")

    def image_tokens(self, model, pixels):
        self._check(model.config, pixels)
        per = [self.tokens_of(model.config, s, t) for s, t in zip(pixels["image_sizes"], self._tiled(pixels),
                                                                   strict=True)]
        return [sum(per[i] for i in unit) for unit in self._units(pixels)]

    def select_images(self, pixels, index):
        units = self._units(pixels) if pixels else []
        images = [i for u in index for i in units[u]]
        if not images:
            return {}
        pv, sizes = pixels["pixel_values"], pixels["image_sizes"]
        take = torch.as_tensor(images, dtype=torch.long)
        out = {"image_sizes": torch.as_tensor(sizes)[take]}
        out["pixel_values"] = pv[take.to(pv.device)]
        if "batch_num_images" in pixels:
            out["batch_num_images"] = torch.tensor([len(units[u]) for u in index], dtype=torch.long)
        return out

    def _video_frame_tokens(self, config) -> int:
        """LLM tokens of one video frame: its ``side x side`` features pooled to ``ceil(side / 2)`` a side."""
        vc = config.vision_config
        if config.vision_feature_select_strategy == "full" and vc.model_type == "clip_vision_model":
            raise ValueError(f"{self.name} videos with vision_feature_select_strategy='full' keep the CLIP "
                             "CLS, which the model's frame pooling cannot take")
        return math.ceil(vc.image_size // vc.patch_size / 2) ** 2

    def _videos(self, config, videos) -> torch.Tensor:
        pv = videos.get("pixel_values_videos")
        side = config.vision_config.image_size
        if pv is None or pv.dim() != 5 or tuple(pv.shape[-2:]) != (side, side):
            raise ValueError(f"{self.name} pixel_values_videos must be (videos, frames, 3, {side}, {side}), "
                             f"got {None if pv is None else tuple(pv.shape)}")
        return pv

    def video_tokens(self, model, videos):
        pv = self._videos(model.config, videos)
        return [pv.shape[1] * self._video_frame_tokens(model.config) + 1] * pv.shape[0]

    def select_videos(self, videos, index):
        pv = videos["pixel_values_videos"]
        return {"pixel_values_videos": pv[torch.as_tensor(index, dtype=torch.long).to(pv.device)]}

    def frame_groups(self, model, videos):
        return [(1, n) for n in self.video_tokens(model, videos)]  # a whole video: one call's newline

    def select_frames(self, videos, units):
        return self.select_videos(videos, [v for v, _ in units])

    def concat_images(self, parts):
        parts = [p for p in parts if p]
        if not parts:
            return {}
        out = {"pixel_values": padded_cat([p["pixel_values"] for p in parts], (-4,)),
               "image_sizes": torch.cat([p["image_sizes"] for p in parts])}
        if "batch_num_images" in parts[0]:
            out["batch_num_images"] = torch.cat([p["batch_num_images"] for p in parts])
        return out

    def dummy_images(self, model):
        vc = model.config.vision_config
        w = model.model.multi_modal_projector.linear_1.weight
        s = vc.image_size
        if self.onevision:  # two images of one sample: a base tile each, the cheapest call
            pixels = {"image_sizes": torch.tensor([[s, s], [s, s]]), "batch_num_images": torch.tensor([2])}
        else:
            pixels = {"image_sizes": torch.tensor([[s, s]])}
        n = max(self.tiles(model.config, (s, s), t) for t in self._tiled(pixels))
        images = len(pixels["image_sizes"])
        pixels["pixel_values"] = torch.zeros(images, n, vc.num_channels, s, s, dtype=w.dtype, device=w.device)
        return pixels

LLAVA_NEXT = LlavaNextAdapter(name="llava_next", model_types=("llava_next",))
LLAVA_ONEVISION = LlavaNextAdapter(name="llava_onevision", model_types=("llava_onevision",), onevision=True,
                                   pixel_keys=("pixel_values", "image_sizes", "batch_num_images"),
                                   video_keys=("pixel_values_videos",),
                                   video_pixel_keys=("pixel_values_videos",), video_features_batched=True)
