"""``--truncate``: a conversation longer than ``seq_len`` cut at ``seq_len``, never inside an image or video.

Planning (:func:`plan_cut`) finds the cut on the conversation's planned tokens (headers only,
:func:`~vlmcp.data.hf.encode.planned_tokens`): at ``seq_len``, or, where that falls inside
an image's run of tokens, at the run's start; with videos, after the last video token or
else before the first (a video's frame groups are one unit). Images and videos after the
cut are dropped whole, from the tokens and from the processor's pixels
(:func:`cut_sample`, at training), so the two always match::

    seq_len = 10:  t t t [i i i i] t t [i i i] t t   ->   t t t [i i i i] t t     (cut at 9, one image kept)

A conversation that cannot be cut stays too long and is skipped, named and counted as
before, with why: nothing trained before the cut, images and videos in one conversation,
or a processor whose pixels vlmcp does not know how to drop an image from (Qwen2-VL,
Qwen2.5-VL and Qwen3-VL's ``*_grid_thw`` layout and LLaVA's one ``pixel_values`` row per
image are known; a cut that keeps every image works for any model).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import torch

from vlmcp.data.hf.schema import Conversation

__all__ = ["Cut", "cut_sample", "plan_cut"]

_DROPS_MEDIA = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor", "LlavaProcessor")
"""Processors whose pixels :func:`cut_sample` can drop trailing images (and videos) from."""


class Cut(NamedTuple):
    """Where a conversation is cut: its first ``tokens`` tokens, ``images`` images, ``videos`` videos."""

    tokens: int
    images: int
    videos: int


def _media_ids(processor) -> set[int]:
    tokenizer = processor.tokenizer
    ids = set()
    for name in ("image_token_id", "video_token_id", "start_image_token_id", "end_image_token_id"):
        value = getattr(processor, name, None)
        if isinstance(value, int):
            ids.add(value)
    for name in ("image_token", "video_token"):
        token = getattr(processor, name, None)
        if isinstance(token, str):
            value = tokenizer.convert_tokens_to_ids(token)
            if isinstance(value, int) and value != tokenizer.unk_token_id:
                ids.add(value)
    return ids


def _runs(ids: list[int], media: set[int]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, token in enumerate([*ids, None]):
        if token in media and start is None:
            start = i
        elif token not in media and start is not None:
            runs.append((start, i))
            start = None
    return runs


def plan_cut(processor, conv: Conversation, ids: list[int], trained: list[bool], seq_len: int) -> Cut | str:
    """Where to cut ``conv`` (planned ``ids`` and ``trained`` flags, longer than ``seq_len``), or why
    it cannot be cut (see the module docstring)."""
    if conv.images and conv.videos:
        return "--truncate does not cut a conversation with both images and videos"
    runs = _runs(ids, _media_ids(processor))
    cut, images, videos = seq_len, len(conv.images), len(conv.videos)
    if conv.videos and runs:
        if cut < runs[-1][1]:
            cut, videos = min(cut, runs[0][0]), 0
    elif conv.images:
        if len(runs) != len(conv.images):
            return (f"--truncate cannot tell its {len(conv.images)} image(s) apart in the tokens "
                    f"({len(runs)} runs)")
        for start, end in runs:
            if start < cut < end:
                cut = start
        images = sum(end <= cut for _, end in runs)
    if not any(trained[:cut]):
        return f"nothing trains in its first {cut} tokens (--truncate)"
    drops = (images, videos) != (len(conv.images), len(conv.videos))
    if drops and type(processor).__name__ not in _DROPS_MEDIA:
        return (f"--truncate would drop an image or video, which vlmcp does not do for "
                f"{type(processor).__name__}")
    return Cut(tokens=cut, images=images, videos=videos)


def _keep(pixels: dict, kind: str, keep: int, total: int, where: str) -> dict:
    if keep == total:
        return pixels
    values = "pixel_values" if kind == "image" else "pixel_values_videos"
    grid = f"{kind}_grid_thw"
    extra = ("second_per_grid_ts",) if kind == "video" else ()
    out = dict(pixels)
    if grid in pixels:
        patches = int(pixels[grid][:keep].prod(-1).sum())
        out[values], out[grid] = pixels[values][:patches], pixels[grid][:keep]
        for key in extra:
            if key in pixels:
                out[key] = pixels[key][:keep]
        keys = (values, grid, *extra)
    elif kind == "image" and values in pixels and len(pixels[values]) == total:
        out[values] = pixels[values][:keep]
        keys = (values,)
    else:
        raise ValueError(f"{where}: --truncate cannot drop {kind}s from the processor's {sorted(pixels)}")
    if keep == 0:
        for key in keys:
            out.pop(key, None)
    return out


def cut_sample(sample, cut: Cut, conv: Conversation):
    """The :class:`~vlmcp.data.hf.encode.EncodedSample` ``sample`` of ``conv`` cut as ``cut`` says."""
    pixels = _keep(sample.pixels, "image", cut.images, len(conv.images), conv.where)
    pixels = _keep(pixels, "video", cut.videos, len(conv.videos), conv.where)
    n = cut.tokens

    def head(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[:n]

    return replace(sample, input_ids=sample.input_ids[:n], labels=sample.labels[:n], pixels=pixels,
                   mm_token_type_ids=head(sample.mm_token_type_ids),
                   token_type_ids=head(sample.token_type_ids))
