"""Synthetic processor rows for Hugging Face VLMs (tests and ``vlmcp verify --model``).

A sample is a list of segments: an int ``n`` is n random text tokens, a tuple of ints is
one image (Qwen-VL: its patch grid ``(t, h, w)``; LLaVA: any tuple, images have a fixed
size; an adapter with its own ``synthetic_images`` says what its tuples hold, e.g.
InternVL ``(tiles,)``), and ``("video", t, h, w)`` (or ``("video", t, h, w, seconds)``:
Qwen2.5-VL's ``second_per_grid_ts``, default 1.0) is one video of ``t`` temporal patch
groups, laid out as the model's processor writes it (:data:`VIDEO_LAYOUTS`).
:func:`synthetic_row` returns what a processor would, for the samples packed into one row,
plus HF-convention labels and ``cu_seqlens``::

    synthetic_row(model, [[5, (1, 4, 4), 9], [12], [("video", 3, 4, 4), 3, (1, 4, 4), 6]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vlmcp.hf.adapters import HFAdapter, adapter_for
from vlmcp.hf.adapters.llava import LLAVA

__all__ = ["VIDEO_LAYOUTS", "synthetic_row"]

Segment = int | tuple

VIDEO_LAYOUTS = {"qwen2_vl": "run", "qwen2_5_vl": "run+seconds", "qwen3_vl": "timestamps",
                 "qwen3_vl_moe": "timestamps", "glm4v": "glm"}
"""How each ``model_type``'s processor (transformers 5.24) writes a video of ``t`` frame groups of
``k`` tokens: ``run``: vision start, ``t*k`` video placeholders, vision end (``+seconds``: with
``second_per_grid_ts``); ``timestamps`` (Qwen3-VL): per group ``<x.x seconds>`` (3 text tokens
here), vision start, ``k`` placeholders, vision end; ``glm``: video start, per group image
start, ``k`` *image* placeholders, image end, the timestamp (1 text token), then video end."""
_TIMESTAMP_TOKENS = {"timestamps": 3, "glm": 1}


def _markers(config) -> tuple[list[int], list[int]]:
    start = getattr(config, "vision_start_token_id", None)  # GLM-4.1V names them image_start / image_end
    end = getattr(config, "vision_end_token_id", None)
    return ([config.image_start_token_id if start is None else start],
            [config.image_end_token_id if end is None else end])


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
        ``attention_mask`` and, with images, ``pixel_values`` (Qwen-VL also
        ``image_grid_thw`` and ``mm_token_type_ids``), with videos ``pixel_values_videos``
        and ``video_grid_thw`` (Qwen2.5-VL: ``second_per_grid_ts``); ``labels (1, L)`` is
        ``input_ids`` with -100 at image, video, marker and timestamp tokens;
        ``cu_seqlens`` is ``IntTensor[S+1]``.
    """
    adapter = adapter_for(model)
    config = model.config
    image_id = adapter.image_token_id(config)
    dtype = dtype or next(model.parameters()).dtype
    qwen = "image_grid_thw" in adapter.pixel_keys  # Qwen-VL-style patch rows (Qwen2/2.5/3-VL, GLM-4.1V)
    own = type(adapter).synthetic_images is not HFAdapter.synthetic_images  # the adapter builds its images
    g = torch.Generator().manual_seed(seed)
    vocab = min(int(config.text_config.vocab_size), 100)
    text = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    ids, types, no_loss, grids, pixels, lens, parts = [], [], [], [], [], [], []
    vgrids, vpixels, seconds = [], [], []

    def put(tokens: list[int], kind: int, loss: bool = False) -> None:
        ids.extend(tokens)
        types.extend([kind] * len(tokens))
        no_loss.extend([not loss] * len(tokens))

    for sample in samples:
        n0 = len(ids)
        images = [s for s in sample if not isinstance(s, int)]
        if own and images:
            part, image_ids = adapter.synthetic_images(model, images, g)
            parts.append(part)
        for seg in sample:
            if isinstance(seg, int):
                put(text(seg), 0, loss=True)
                continue
            vc = config.vision_config
            if isinstance(seg[0], str):
                if seg[0] != "video" or not adapter.takes_videos:
                    raise ValueError(f"synthetic_row: segment {seg!r}: ('video', t, h, w) needs a model that "
                                     f"takes videos, got {adapter.name}")
                t, h, w = (int(x) for x in seg[1:4])
                layout = VIDEO_LAYOUTS[config.model_type]
                k = h * w // vc.spatial_merge_size ** 2
                width = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
                vpixels.append(torch.randn(t * h * w, width, generator=g, dtype=torch.float64))
                vgrids.append([t, h, w])
                seconds.append(float(seg[4]) if len(seg) > 4 else 1.0)
                start, end = _markers(config)
                if layout.startswith("run"):
                    put(start, 0)
                    put([adapter.video_token_id(config)] * (t * k), 2)
                    put(end, 0)
                elif layout == "timestamps":
                    for _ in range(t):
                        put(text(_TIMESTAMP_TOKENS[layout]), 0)
                        put(start, 0)
                        put([adapter.video_token_id(config)] * k, 2)
                        put(end, 0)
                else:  # glm: frames written with the image placeholder, inside video start / end
                    put([config.video_start_token_id], 0)
                    for _ in range(t):
                        put(start, 0)
                        put([image_id] * k, 2)
                        put(end, 0)
                        put(text(_TIMESTAMP_TOKENS[layout]), 0)
                    put([config.video_end_token_id], 0)
                continue
            if own:  # the adapter's tokens for this image: its placeholders and any markers
                for token in image_ids.pop(0):
                    put([token], int(token == image_id))
                continue
            if qwen:
                t, h, w = (int(x) for x in seg)
                k = t * h * w // vc.spatial_merge_size ** 2
                width = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
                pixels.append(torch.randn(t * h * w, width, generator=g, dtype=torch.float64))
                grids.append([t, h, w])
                pre, post = _markers(config) if markers else ([], [])
            else:
                blank = torch.zeros(1, vc.num_channels, vc.image_size, vc.image_size)
                k = LLAVA.image_tokens(model, {"pixel_values": blank})[0]  # LLaVA-style configs
                pixels.append(torch.randn(1, vc.num_channels, vc.image_size, vc.image_size, generator=g,
                                          dtype=torch.float64))
                pre, post = [], []
            put(pre, 0)
            put([image_id] * k, 1)
            put(post, 0)
        lens.append(len(ids) - n0)
    input_ids = torch.tensor([ids], dtype=torch.long)
    inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    if parts:
        inputs.update({k: v.to(dtype) if v.is_floating_point() else v
                       for k, v in adapter.concat_images(parts).items()})
    if pixels:
        inputs["pixel_values"] = torch.cat(pixels).to(dtype)
        if qwen:
            inputs["image_grid_thw"] = torch.tensor(grids, dtype=torch.long)
    if vpixels:
        inputs["pixel_values_videos"] = torch.cat(vpixels).to(dtype)
        inputs["video_grid_thw"] = torch.tensor(vgrids, dtype=torch.long)
        if VIDEO_LAYOUTS[config.model_type].endswith("+seconds"):
            inputs["second_per_grid_ts"] = torch.tensor(seconds)
    if qwen:
        inputs["mm_token_type_ids"] = torch.tensor([types], dtype=torch.int32)
    if "token_type_ids" in adapter.consumed_keys:  # Gemma 3: 1 at image tokens (bidirectional blocks)
        inputs["token_type_ids"] = (torch.tensor([types]) == 1).long()
    labels = input_ids.masked_fill(torch.tensor([no_loss]), -100)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lens), 0)
    return inputs, labels, cu
