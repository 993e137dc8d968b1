"""Tiled and native-resolution images: InternVL, LLaVA-NeXT / LLaVA-OneVision (and its videos),
Idefics3 / SmolVLM, Mistral3 (and Mistral 4 under it).

Token ids as :mod:`vlmcp.debug.tiny.anyres`'s configs have them: 121 and 122 are each family's
markers (InternVL's ``<img>`` / ``</img>``, Idefics3's ``<fake_token_around_image>`` /
``<global-img>``, Mistral3's ``[IMG_BREAK]`` / ``[IMG_END]``).
"""

from __future__ import annotations

import torch

from vlmcp.debug.synthetic.registry import register_images, register_video

__all__ = ["idefics3_images", "internvl_images", "llava_next_images", "mistral3_images", "onevision_video"]

_FAKE, _GLOBAL = 121, 122  # Idefics3: <fake_token_around_image>, <global-img>
_BREAK, _END = 121, 122  # Mistral3: [IMG_BREAK], [IMG_END]


def _pair(x) -> tuple[int, int]:
    return (int(x[0]), int(x[1])) if isinstance(x, (list, tuple)) else (int(x), int(x))


@register_images("internvl")
def internvl_images(adapter, model, images, generator, *, markers=True):
    """Each image ``(tiles,)``: that many random tiles of the configured size, ``<img>`` 121 and
    ``</img>`` 122 around the image's placeholder run."""
    vc = model.config.vision_config
    h, w = _pair(vc.image_size)
    per = adapter.image_tokens(model, {"pixel_values": torch.zeros(1, vc.num_channels, h, w)})[0]  # a tile's
    tiles = [int(seg[0]) for seg in images]
    pv = torch.randn(sum(tiles), vc.num_channels, h, w, generator=generator, dtype=torch.float64)
    ids = [[121] + [adapter.image_token_id(model.config)] * (per * n) + [122] for n in tiles]
    return {"pixel_values": pv}, ids


@register_images("llava_next", "llava_onevision")
def llava_next_images(adapter, model, images, generator, *, markers=True):
    """Each image ``(height, width)``: its original size in eighths of a tile (pixels for an
    8-pixel tile); random tiles, as many as the model takes. A OneVision sample with several
    images sends them untiled (``batch_num_images``), as its processor does."""
    config, vc = model.config, model.config.vision_config
    eighth = vc.image_size / 8
    sizes = torch.tensor([[max(1, round(int(x) * eighth)) for x in seg] for seg in images],
                         dtype=torch.long)
    pixels = {"image_sizes": sizes}
    if adapter.onevision:
        pixels["batch_num_images"] = torch.tensor([len(images)], dtype=torch.long)
    tiled = [not adapter.onevision or len(images) == 1] * len(images)
    n = [adapter.tiles(config, s, t) for s, t in zip(sizes, tiled, strict=True)]
    tile = (vc.num_channels, vc.image_size, vc.image_size)
    pv = torch.zeros(len(images), max(n), *tile, dtype=torch.float64)
    for i, k in enumerate(n):
        pv[i, :k] = torch.randn(k, *tile, generator=generator, dtype=torch.float64)
    pixels["pixel_values"] = pv
    image_id = adapter.image_token_id(config)
    ids = [[image_id] * adapter.tokens_of(config, s, t) for s, t in zip(sizes, tiled, strict=True)]
    return pixels, ids


@register_video("llava_onevision")
def onevision_video(adapter, model, video, generator, text):
    """``(frames, ...)``: random frames of the tile size; ``frames * ceil(side / 2)^2 + 1`` video
    tokens (a whole video is one run)."""
    vc = model.config.vision_config
    frames = int(video[0])
    pv = torch.randn(1, frames, vc.num_channels, vc.image_size, vc.image_size, generator=generator,
                     dtype=torch.float64)
    pixels = {"pixel_values_videos": pv}
    tokens = adapter.video_tokens(model, pixels)[0]
    return pixels, [([adapter.video_token_id(model.config)] * tokens, 2)]


@register_images("idefics3", "smolvlm")
def idefics3_images(adapter, model, images, generator, *, markers=True):
    """Each image ``(rows, cols)``: rows x cols random crops and the global image (only the global
    image for ``(1, 1)``), whose real pixels keep the aspect ratio (the rest padding, masked).
    Tokens: ``<fake_token_around_image>`` (121) before each tile, ``<global-img>`` (122) before
    the global one, 121 after the image."""
    config, vc = model.config, model.config.vision_config
    s, patch = int(vc.image_size), int(vc.patch_size)
    per = adapter.image_tokens(model, {"pixel_values": torch.ones(1, 1, 1, s, s)})[0]
    image_id = adapter.image_token_id(config)
    tiles, masks, ids = [], [], []
    for rows, cols in ((int(r), int(c)) for r, c in images):
        n = rows * cols if rows * cols > 1 else 0
        mask = torch.ones(n + 1, s, s, dtype=torch.bool)
        h, w = s * min(rows, cols) // max(rows, cols) // patch * patch or patch, s
        if rows > cols:
            h, w = w, h
        mask[n] = False
        mask[n, :h, :w] = True
        tiles.append(torch.randn(n + 1, vc.num_channels, s, s, generator=generator, dtype=torch.float64)
                     * mask[:, None])
        masks.append(mask)
        one = [t for _ in range(n) for t in [_FAKE] + [image_id] * per]
        ids.append(one + [_FAKE, _GLOBAL] + [image_id] * per + [_FAKE])
    pixels = {"pixel_values": torch.cat(tiles)[None], "pixel_attention_mask": torch.cat(masks)[None]}
    return pixels, ids


@register_images("mistral3")
def mistral3_images(adapter, model, images, generator, *, markers=True):
    """Each image ``(rows, cols)`` in LLM tokens (``rows * patch * merge`` pixels high): random
    pixels, padded to the sample's largest; tokens row by row, ``[IMG_BREAK]`` (121) after each
    row but the last, ``[IMG_END]`` (122) after it."""
    config, vc = model.config, model.config.vision_config
    u = int(vc.patch_size) * int(config.spatial_merge_size)  # pixels per side of one LLM token
    sizes = torch.tensor([[int(r) * u, int(c) * u] for r, c in images], dtype=torch.long)
    pv = torch.zeros(len(images), vc.num_channels, int(sizes[:, 0].max()), int(sizes[:, 1].max()),
                     dtype=torch.float64)
    image_id = adapter.image_token_id(config)
    ids = []
    for i, (h, w) in enumerate(sizes.tolist()):
        pv[i, :, :h, :w] = torch.randn(vc.num_channels, h, w, generator=generator, dtype=torch.float64)
        rows = [[image_id] * (w // u) + [_BREAK] for _ in range(h // u)]
        rows[-1][-1] = _END
        ids.append([t for row in rows for t in row])
    return {"pixel_values": pv, "image_sizes": sizes}, ids
