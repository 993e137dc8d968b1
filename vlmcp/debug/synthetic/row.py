"""Synthetic processor rows for Hugging Face VLMs (tests and ``vlmcp verify --model``).

A sample is a list of segments: an int ``n`` is n random text tokens, a tuple of ints is one
image in its adapter's terms (Qwen-VL: its patch grid ``(t, h, w)``; LLaVA: any tuple, images
have a fixed size; InternVL ``(tiles,)``...), and ``("video", t, h, w)`` (or ``("video", t, h, w,
seconds)``: Qwen2.5-VL's ``second_per_grid_ts``, default 1.0) is one video of ``t`` temporal
patch groups. What an image or a video becomes (pixels, placeholders, markers, timestamps) is the
family's to say, as the model's processor writes them: the functions registered for its model type
(:mod:`vlmcp.debug.synthetic.registry`).
:func:`synthetic_row` returns what a processor would, for the samples packed into one row, plus
HF-convention labels and ``cu_seqlens``::

    synthetic_row(model, [[5, (1, 4, 4), 9], [12], [("video", 3, 4, 4), 3, (1, 4, 4), 6]])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vlmcp.debug.synthetic.registry import synthetic_images, synthetic_video
from vlmcp.hf.adapters import HFAdapter, adapter_for

__all__ = ["synthetic_row"]

Segment = int | tuple


@dataclass
class _Row:
    """The row being written: tokens, their kinds (0 text, 1 image, 2 video), targets, and media."""

    ids: list[int] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)
    target: list[bool] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    images: list[dict] = field(default_factory=list)
    videos: list[dict] = field(default_factory=list)

    def put(self, tokens: Sequence[int], kind: int, target: bool = False) -> None:
        self.ids.extend(tokens)
        self.kinds.extend([kind] * len(tokens))
        self.target.extend([target] * len(tokens))


def _put_sample(row: _Row, adapter: HFAdapter, model, sample: Sequence[Segment], generator: torch.Generator,
                text, markers: bool) -> None:
    """One sample's segments, in order: text as targets, images and videos as their processor writes them."""
    start = len(row.ids)
    images = [s for s in sample if not isinstance(s, int) and not isinstance(s[0], str)]
    image_ids: list[list[int]] = []
    if images:
        pixels, image_ids = synthetic_images(adapter, model, images, generator, markers=markers)
        row.images.append(pixels)
    image_id = adapter.image_token_id(model.config)
    for seg in sample:
        if isinstance(seg, int):
            row.put(text(seg), 0, target=True)
        elif isinstance(seg[0], str):
            if seg[0] != "video" or not adapter.takes_videos:
                raise ValueError(f"synthetic_row: segment {seg!r}: ('video', t, h, w) needs a model that "
                                 f"takes videos, got {adapter.name}")
            pixels, runs = synthetic_video(adapter, model, seg[1:], generator, text)
            row.videos.append(pixels)
            for tokens, kind in runs:
                row.put(tokens, kind)
        else:  # the image's placeholders and the markers around them
            for token in image_ids.pop(0):
                row.put([token], int(token == image_id))
    row.lengths.append(len(row.ids) - start)


def _inputs(row: _Row, adapter: HFAdapter, dtype: torch.dtype) -> dict[str, Any]:
    """``model(**inputs)``' keys of the packed row."""
    input_ids = torch.tensor([row.ids], dtype=torch.long)
    inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    timing = set(adapter.video_keys) - set(adapter.video_pixel_keys)  # second_per_grid_ts keeps its dtype
    for media in (adapter.concat_images(row.images), adapter.concat_videos(row.videos)):
        inputs.update({k: v.to(dtype) if v.is_floating_point() and k not in timing else v
                       for k, v in media.items()})
    if "mm_token_type_ids" in adapter.consumed_keys:  # Qwen-VL: 1 image, 2 video
        inputs["mm_token_type_ids"] = torch.tensor([row.kinds], dtype=torch.int32)
    if "token_type_ids" in adapter.consumed_keys:  # Gemma 3: 1 at image tokens (bidirectional blocks)
        inputs["token_type_ids"] = (torch.tensor([row.kinds]) == 1).long()
    return inputs


def synthetic_row(
    model,
    samples: Sequence[Sequence[Segment]],
    *,
    seed: int = 0,
    markers: bool = True,
    dtype: torch.dtype | None = None,
) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """Processor-style inputs of ``samples`` packed into one row.

    Args:
        model: the HF model (its config gives token ids and image shapes).
        samples: per sample, its segments (see the module docstring).
        seed: random text tokens and pixels.
        markers: Qwen-VL only, wrap each image in ``vision_start`` / ``vision_end`` tokens
            as the chat template does (videos always get their processor's markers).
        dtype: pixel dtype (default: the model's).

    Returns:
        ``(inputs, labels, cu_seqlens)``: ``inputs`` holds ``input_ids (1, L)``,
        ``attention_mask`` and, with images, the adapter's per-image inputs (Qwen-VL:
        ``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids``), with videos its per-video
        inputs; ``labels (1, L)`` is ``input_ids`` with -100 at every image, video, marker and
        timestamp token; ``cu_seqlens`` is ``IntTensor[S+1]``.
    """
    adapter = adapter_for(model)
    generator = torch.Generator().manual_seed(seed)
    vocab = min(int(model.config.text_config.vocab_size), 100)

    def text(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=generator).tolist()

    row = _Row()
    for sample in samples:
        _put_sample(row, adapter, model, sample, generator, text, markers)
    inputs = _inputs(row, adapter, dtype or next(model.parameters()).dtype)
    labels = inputs["input_ids"].masked_fill(~torch.tensor([row.target]), -100)
    cu = torch.zeros(len(row.lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(row.lengths), 0)
    return inputs, labels, cu
