"""Synthetic processor rows for Hugging Face VLMs (tests and ``vlmcp verify --model``).

A sample is a list of segments: an int ``n`` is n random text tokens, a tuple is one
image (Qwen-VL: its patch grid ``(t, h, w)``; LLaVA: any tuple, images have a fixed
size; an adapter with its own ``synthetic_images`` says what its tuples hold, e.g.
InternVL ``(tiles,)``). :func:`synthetic_row` returns what a processor would, for the samples packed
into one row, plus HF-convention labels and ``cu_seqlens``::

    synthetic_row(model, [[5, (1, 4, 4), 9], [12], [(1, 4, 8), 3, (1, 4, 4), 6]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vlmcp.hf.adapters import HFAdapter, adapter_for
from vlmcp.hf.adapters.llava import LLAVA

__all__ = ["synthetic_row"]

Segment = int | tuple


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
            as the chat template does.
        dtype: pixel dtype (default: the model's).

    Returns:
        ``(inputs, labels, cu_seqlens)``: ``inputs`` holds ``input_ids (1, L)``,
        ``attention_mask`` and, with images, ``pixel_values`` (Qwen-VL also
        ``image_grid_thw`` and ``mm_token_type_ids``); ``labels (1, L)`` is ``input_ids``
        with -100 at image and marker tokens; ``cu_seqlens`` is ``IntTensor[S+1]``.
    """
    adapter = adapter_for(model)
    config = model.config
    image_id = adapter.image_token_id(config)
    dtype = dtype or next(model.parameters()).dtype
    qwen = "image_grid_thw" in adapter.pixel_keys  # Qwen-VL-style patch rows (Qwen2/2.5/3-VL, GLM-4.1V)
    own = type(adapter).synthetic_images is not HFAdapter.synthetic_images  # the adapter builds its images
    g = torch.Generator().manual_seed(seed)
    vocab = min(int(config.text_config.vocab_size), 100)
    ids, no_loss, grids, pixels, lens, parts = [], [], [], [], [], []
    for sample in samples:
        n0 = len(ids)
        images = [s for s in sample if not isinstance(s, int)]
        if own and images:
            part, image_ids = adapter.synthetic_images(model, images, g)
            parts.append(part)
        for seg in sample:
            if isinstance(seg, int):
                ids += torch.randint(3, vocab, (seg,), generator=g).tolist()
                no_loss += [False] * seg
                continue
            if own:
                one = image_ids.pop(0)
                ids += one
                no_loss += [True] * len(one)
                continue
            if qwen:
                t, h, w = (int(x) for x in seg)
                vc = config.vision_config
                k = t * h * w // vc.spatial_merge_size ** 2
                width = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
                pixels.append(torch.randn(t * h * w, width, generator=g, dtype=torch.float64))
                grids.append([t, h, w])
                pre, post = [], []
                if markers:  # GLM-4.1V names them image_start / image_end
                    start = getattr(config, "vision_start_token_id", None)
                    end = getattr(config, "vision_end_token_id", None)
                    pre = [config.image_start_token_id if start is None else start]
                    post = [config.image_end_token_id if end is None else end]
            else:
                vc = config.vision_config
                blank = torch.zeros(1, vc.num_channels, vc.image_size, vc.image_size)
                k = LLAVA.image_tokens(model, {"pixel_values": blank})[0]  # LLaVA-style configs
                pixels.append(torch.randn(1, vc.num_channels, vc.image_size, vc.image_size, generator=g,
                                          dtype=torch.float64))
                pre, post = [], []
            ids += pre + [image_id] * k + post
            no_loss += [True] * (len(pre) + k + len(post))
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
    if qwen:
        inputs["mm_token_type_ids"] = (input_ids == image_id).int()
    labels = input_ids.masked_fill(torch.tensor([no_loss]), -100)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lens), 0)
    return inputs, labels, cu
