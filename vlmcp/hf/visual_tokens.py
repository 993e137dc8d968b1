"""Which tokens of a processor row are which images, videos and visual units (metadata only).

:func:`row_visuals` reads a row's placeholders (and ``mm_token_type_ids``), checks them
against the image and video inputs, assigns images and videos to samples, and numbers
the visual units for the plan. Every check reads only metadata, so a bad row raises the
same error on every rank before any collective.

Note [vlmcp HF videos: frame groups are visual units]
-----------------------------------------------------
A video of grid ``(t, h, w)`` gives ``t`` frame groups (temporal patch groups) of
``h*w / merge**2`` tokens each, in order. Qwen2-VL and Qwen2.5-VL write them as one run of
video placeholders; Qwen3-VL and GLM-4.1V as ``t`` runs with a timestamp (text) before or
after each. All four ViTs (transformers 5.24) attend within a frame group only (``cu_seqlens``
of ``h*w`` per ``t``; rotary, window and interpolated position indices repeat per ``t``),
so a frame group is the ViT's unit of work, and vlmcp makes it the unit everywhere::

    Qwen2-VL row:  [ t t | V0 V0 V0 V1 V1 V1 | t | I I | t t ]   video (t=2) then an image
    Qwen3-VL row:  [ t <0.5 s> V0 V0 V0 <1.5 s> V1 V1 V1 | t | I I | t t ]
    units:                 u0  u0  u0         u1  u1  u1      u2 u2

* layout: each unit is one "image" of the plan (``image_ids``): replicated or sharded,
  placed with its sample;
* ``scatter``: images stay whole, a video's frame groups are assigned one by one (balanced
  by cost), so one long video's ViT work spreads over the group;
* merge: HF's video merge fills the video placeholders in row order with
  ``get_video_features``' rows, and every rank's wrapper returns the rows of the video
  tokens it holds (Note [vlmcp HF vision placement]).

``mm_token_type_ids`` is 2 at video tokens (GLM-4.1V: the only way to tell its video frames,
written with the image placeholder, from images).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from vlmcp.hf.adapters import HFAdapter

__all__ = ["RowVisuals", "row_visuals"]


@dataclass(frozen=True, eq=False)
class RowVisuals:
    """The visual tokens of one (packed) row, checked against the image and video inputs."""

    types: torch.Tensor
    """``IntTensor[L]``: 0 text, 1 image, 2 video (``mm_token_type_ids``' values)."""
    image_tokens: list[int] | None
    """LLM tokens of each image (None: the adapter cannot tell)."""
    video_tokens: list[int]
    """LLM tokens of each video."""
    images_per_sample: list[list[int]]
    """Per sample, the images (in order) its image tokens take."""
    videos_per_sample: list[list[int]]
    """Per sample, the videos (in order) its video tokens take."""
    unit_ids: torch.Tensor | None
    """``LongTensor[L]``: each visual token's unit (an image, or a video's frame group), numbered
    in row order, -1 at text (the plan's ``image_ids``); None when the adapter cannot tell."""

    @property
    def visual(self) -> torch.Tensor:
        """``BoolTensor[L]``: image and video tokens."""
        return self.types > 0


def row_visuals(model: nn.Module, adapter: HFAdapter, ids: torch.Tensor,
                mm_token_type_ids: torch.Tensor | None, pixels: Mapping[str, torch.Tensor],
                videos: Mapping[str, torch.Tensor], cu: torch.Tensor) -> RowVisuals:
    """Describe and check the visual tokens of a row.

    Args:
        model: the top-level model.
        adapter: its adapter.
        ids: ``LongTensor[L]`` on the CPU.
        mm_token_type_ids: the processor's ``IntTensor[L]`` on the CPU, or None.
        pixels: the row's per-image inputs (empty: no image).
        videos: the row's per-video inputs (empty: no video).
        cu: validated ``LongTensor[S+1]`` sample boundaries.

    Raises:
        ValueError: ``mm_token_type_ids`` disagreeing with the placeholders, image or video
            tokens not matching the inputs (per row and per sample), a unit cut by other
            tokens, images and videos in one row of a model that cannot merge both.
    """
    has_pixels = bool(pixels) and adapter.pixel_keys[0] in pixels
    has_videos = bool(videos)
    types = adapter.token_types(model.config, ids, mm_token_type_ids, has_videos)
    is_image, is_video = types == 1, types == 2
    if not has_pixels and bool(is_image.any()):
        raise ValueError(f"image features and image tokens do not match: the row has {int(is_image.sum())} "
                         "image tokens but no pixel_values")
    if not has_videos and bool(is_video.any()):
        raise ValueError(f"video features and video tokens do not match: the row has {int(is_video.sum())} "
                         "video tokens but no pixel_values_videos")
    if not adapter.mixes_images_and_videos and has_pixels and has_videos:
        raise ValueError(f"{type(model).__name__} (vlmcp adapter {adapter.name!r}) fills images and videos "
                         "at the same placeholder token, so its own forward cannot take both in one row (it "
                         "raises 'Image features and image tokens do not match'): put images and videos in "
                         "different rows")
    tokens = adapter.image_tokens(model, pixels) if has_pixels else []
    if tokens is None:  # no metadata rule: Note [vlmcp HF long tail: image tokens from the row]
        tokens = adapter.row_image_tokens(model, pixels, is_image)
    n_images = (len(tokens) if tokens is not None else 1) if has_pixels else 0
    groups = _items_per_sample(tokens, is_image, cu, n_images)
    vtokens = adapter.video_tokens(model, videos) if has_videos else []
    vgroups = _items_per_sample(vtokens, is_video, cu, len(vtokens), "video")
    _check_token_types(types, mm_token_type_ids)  # after the counts: a lost placeholder says so first
    unit_ids = None
    if tokens is not None and bool((types > 0).any()):
        frames = [n for t, n in adapter.frame_groups(model, videos) for _ in range(t)] if has_videos else []
        unit_ids = _unit_ids(types, tokens, frames, split_images=adapter.image_attention == "causal")
    return RowVisuals(types=types, image_tokens=tokens, video_tokens=vtokens, images_per_sample=groups,
                      videos_per_sample=vgroups, unit_ids=unit_ids)


def _check_token_types(types: torch.Tensor, given: torch.Tensor | None) -> None:
    """``mm_token_type_ids`` must equal the row's types (0 text, 1 image, 2 video) exactly."""
    if given is None:
        return
    bad = (given != types).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        what = ("a text", "an image", "a video")[int(types[i])]
        raise ValueError(f"mm_token_type_ids must be 1 exactly at the image tokens, 2 at the video tokens "
                         f"and 0 elsewhere; position {i} has {int(given[i])} but is {what} token")


def _items_per_sample(tokens: list[int] | None, is_kind: torch.Tensor, cu: torch.Tensor,
                      n_items: int, what: str = "image") -> list[list[int]]:
    """Which items (images or videos, in order) each sample's ``what`` tokens take; raises on any mismatch."""
    counts = torch.zeros(cu.numel() - 1, dtype=torch.long).index_add_(
        0, torch.repeat_interleave(torch.arange(cu.numel() - 1), cu[1:] - cu[:-1]), is_kind.long().cpu())
    total = int(counts.sum())
    if tokens is None:  # the adapter cannot tell: HF's own merge check raises on a mismatch
        if n_items and cu.numel() > 2:
            raise ValueError(f"packing samples with {what}s needs an adapter that knows each "
                             f"{what}'s token count")
        return [list(range(n_items))]
    if sum(tokens) != total:
        raise ValueError(f"{what} features and {what} tokens do not match: the row has {total} {what} tokens "
                         f"but the {len(tokens)} {what}s give {sum(tokens)} ({tokens})")
    out, i = [], 0
    for s, n in enumerate(counts.tolist()):
        first, got = i, 0
        while got < n and i < len(tokens):
            got, i = got + tokens[i], i + 1
        if got != n:
            raise ValueError(f"{what} features and {what} tokens do not match: sample {s} has {n} {what} "
                             f"tokens but {what}s {first}..{i - 1} give {got} ({tokens[first:i]})")
        out.append(list(range(first, i)))
    return out


def _unit_ids(types: torch.Tensor, image_units: list[int], video_units: list[int],
              split_images: bool = False) -> torch.Tensor:
    """``LongTensor[L]``: each visual token's unit (an image, or one frame group of a video), numbered in
    row order, -1 at text; raises where a unit's placeholders are not one contiguous run.

    ``image_units`` / ``video_units``: tokens per unit in the order of the row's image / video tokens.
    ``split_images``: an image whose placeholders other tokens cut (Mistral3's ``[IMG_BREAK]`` after
    each row of patches) becomes one unit per run instead, as the plan's image runs are; only
    for causal image attention, where an image's identity decides nothing but the layout.
    """
    firsts, parts = [], []
    for kind, sizes, name in ((1, image_units, "image"), (2, video_units, "video frame group")):
        pos = torch.nonzero(types == kind).flatten()
        if not sizes:
            continue
        size = torch.as_tensor(sizes, dtype=torch.long)
        ends = torch.cumsum(size, 0)
        first, last = pos[ends - size], pos[ends - 1]
        unit = torch.bucketize(torch.arange(pos.numel()), ends, right=True)
        broken = torch.nonzero(last - first + 1 != size).flatten()
        if broken.numel() and kind == 1 and split_images:
            new = torch.ones(pos.numel(), dtype=torch.bool)  # a unit starts where the item or the run changes
            new[1:] = (unit[1:] != unit[:-1]) | (pos[1:] != pos[:-1] + 1)
            unit, first = torch.cumsum(new.long(), 0) - 1, pos[new]
        elif broken.numel():
            u = int(broken[0])
            raise ValueError(f"{name} {u}'s {sizes[u]} placeholder tokens (from position {int(first[u])}) "
                             f"are not one contiguous run: position {int(last[u])} is its last; a {name} "
                             "must not be cut by other tokens")
        firsts.append(first)
        parts.append((pos, unit))
    ids = torch.full_like(types, -1, dtype=torch.long)
    if not firsts:
        return ids
    rank = torch.argsort(torch.argsort(torch.cat(firsts)))  # every unit's place in row order
    offset = 0
    for (pos, unit), first in zip(parts, firsts, strict=True):
        ids[pos] = rank[offset + unit]
        offset += first.numel()
    return ids
