"""The long tail: an M-RoPE VLM without an adapter, through its own ``get_rope_index``.

Note [vlmcp HF long tail: M-RoPE through the model's own rope index]
--------------------------------------------------------------------
A model outside vlmcp's table that computes multimodal (M-RoPE) positions with
``model.model.get_rope_index`` (the Qwen-VL family and the models built from it) runs under
:class:`MRopePlaceholderAdapter`: its inputs are Qwen-VL's (``pixel_values`` patch rows and
``image_grid_thw``; ``mm_token_type_ids`` consumed), an image's token count is ``t*h*w / merge**2``
(``vision_config.spatial_merge_size``; without it, the row's own runs, Note [vlmcp HF long tail: image
tokens from the row]), and each sample's positions are what its own ``get_rope_index`` returns on that
sample, called with the keywords its signature takes among ``mm_token_type_ids``, ``image_grid_thw``,
``video_grid_thw`` and ``attention_mask``. A rope index that needs anything else is refused by name
(:func:`mrope_adapter`), and so is every input key the adapter does not know. HF's own merge runs on
every rank's local row: ``replicate`` only (no vision modules are named), no videos.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from vlmcp.hf.adapters.base import PlaceholderAdapter
from vlmcp.hf.adapters.qwen2_vl import QwenVLAdapter, _rows

__all__ = ["ROPE_KEYWORDS", "MRopePlaceholderAdapter", "mrope_adapter"]

ROPE_KEYWORDS = ("mm_token_type_ids", "image_grid_thw", "video_grid_thw", "attention_mask")
"""The ``get_rope_index`` keywords the generic adapter can pass (besides ``input_ids``)."""


class MRopePlaceholderAdapter(QwenVLAdapter, PlaceholderAdapter):
    """An unlisted M-RoPE VLM: Qwen-VL inputs, the model's own ``get_rope_index``, ``replicate``."""

    def __init__(self, *, model_types: tuple[str, ...], rope_keywords: tuple[str, ...]):
        super().__init__(name="mrope_placeholder", model_types=model_types, vision_modules=(),
                         projector_last=None, video_keys=(), video_pixel_keys=())
        object.__setattr__(self, "rope_keywords", rope_keywords)

    def image_tokens(self, model, pixels):
        merge = getattr(model.config.vision_config, "spatial_merge_size", None)
        if merge is None:
            return None
        grid = _rows(pixels, "pixel_values", "image_grid_thw", "images")
        return (grid.prod(-1) // int(merge) ** 2).tolist()

    def select_images(self, pixels, index):
        return QwenVLAdapter.select_images(self, pixels, index)

    def position_ids(self, model, input_ids, token_type, pixels, videos=None):
        grid = pixels.get("image_grid_thw")
        given = {"mm_token_type_ids": token_type.unsqueeze(0),
                 "image_grid_thw": None if grid is None or len(grid) == 0 else grid,
                 "video_grid_thw": None, "attention_mask": torch.ones_like(input_ids).unsqueeze(0)}
        pos = model.model.get_rope_index(input_ids.unsqueeze(0), **{k: given[k] for k in self.rope_keywords})
        pos = pos[0] if isinstance(pos, tuple) else pos
        if pos.dim() != 3 or pos.shape[0] != 3:
            raise ValueError(f"{type(model).__name__}.model.get_rope_index returned positions of shape "
                             f"{tuple(pos.shape)}, not (3, 1, L): vlmcp's generic M-RoPE path cannot use "
                             "them")
        return pos[:, 0]


def mrope_adapter(model: nn.Module) -> MRopePlaceholderAdapter:
    """The generic M-RoPE adapter of ``model``; raises naming the rope index's parameters it cannot pass."""
    fn = model.model.get_rope_index
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    names = [p.name for p in params]
    first = "input_ids" if "input_ids" in names else (names[0] if names else None)
    unknown = [p.name for p in params if p.name != first and p.name not in ROPE_KEYWORDS
               and p.default is inspect.Parameter.empty]
    if first != "input_ids" or unknown:
        raise ValueError(
            f"{type(model).__name__} (model_type={model.config.model_type!r}) has no vlmcp adapter and its "
            f"get_rope_index{inspect.signature(fn)} needs {unknown or ['input_ids first']}, which vlmcp's "
            f"generic M-RoPE path does not pass (it passes input_ids and {', '.join(ROPE_KEYWORDS)}): "
            "register an adapter whose position_ids calls it (vlmcp.hf.register_adapter)")
    keywords = tuple(k for k in ROPE_KEYWORDS if k in names)
    return MRopePlaceholderAdapter(model_types=(model.config.model_type,), rope_keywords=keywords)
