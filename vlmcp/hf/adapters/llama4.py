"""Llama 4: a tiled ViT (``vision_model``), ``multi_modal_projector``, a MoE LM with chunked and NoPE layers.

Layout: the top-level ``Llama4ForConditionalGeneration`` owns ``get_image_features`` (no ``.model``);
the decoder is ``language_model.model`` and the head ``language_model.lm_head``.

Inputs: ``pixel_values (tiles, 3, S, S)``: every tile (the processor's crops and its global view of each
image) is one row, run by the ViT on its own (a batch element) and pixel-shuffled to
``(S / patch)**2 * pixel_shuffle_ratio**2`` LLM tokens. The processor writes each tile's placeholders
as one run of ``<|patch|>`` (``image_token_index``) between text separators, so vlmcp's "images" are
the tiles: counts, per-sample references and selection are per ``pixel_values`` row. Positions are 1-D.

transformers 5.24's ``Llama4ForConditionalGeneration.forward`` raises ``AttributeError`` on every call
(its output reads ``outputs.image_outputs``, which the language model's output lacks); ``parallelize``
mends it on the instance (:func:`fix_forward`: transformers' own source with that one read replaced),
and the float64 reference runs the same mended forward (every computation HF's). transformers 5.25
fixed it the same way (``image_outputs=mm_encoder_outputs.get("image")``); nothing is mended there.

Vision modes: ``replicate`` only. HF's forward applies ``multi_modal_projector`` to
``get_image_features``' ``last_hidden_state`` itself, outside the ViT call that vlmcp's vision
placement wraps, so the modes that move features between ranks (and ``allreduce_hook``, whose hook
sits on that call's features) are not offered.

The language model's attention runs through vlmcp's Llama 4 mixer (Note [vlmcp HF Llama 4 attention]):
NoPE layers' temperature tuning at the true positions, chunked layers exact for samples of at most
``attention_chunk_size`` tokens and longer samples refused by name, here on the global row.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap
import types
from dataclasses import dataclass

import torch
from torch import nn

from vlmcp.hf.adapters.base import HFAdapter, fixed_size_images, select_rows
from vlmcp.hf.layers.llama4 import check_chunks

__all__ = ["LLAMA4", "Llama4Adapter", "fix_forward"]

_BROKEN = "outputs.image_outputs"
_FIXED = 'mm_encoder_outputs.get("image")'


@functools.cache
def _fixed_forward(cls: type) -> types.FunctionType | None:
    """``cls.forward`` (its decorators kept) with ``outputs.image_outputs`` read as the image outputs it
    computed; None where the source has no such read (a transformers that fixed it)."""
    raw = inspect.unwrap(cls.forward)
    source = textwrap.dedent(inspect.getsource(raw))
    if _BROKEN not in source:
        return None
    tree = ast.parse(source.replace(_BROKEN, _FIXED))
    fn = tree.body[0]  # auto_docstring documents the class's methods only: not needed, and it reads the class
    fn.decorator_list = [d for d in fn.decorator_list
                         if "auto_docstring" not in ast.dump(d)]
    ast.increment_lineno(tree, raw.__code__.co_firstlineno - 1)
    namespace = dict(sys.modules[cls.__module__].__dict__)
    exec(compile(tree, raw.__code__.co_filename, "exec"), namespace)  # noqa: S102  (transformers' own source)
    return namespace[raw.__name__]


def fix_forward(model: nn.Module) -> None:
    """Mend transformers 5.24's ``Llama4ForConditionalGeneration.forward`` on ``model`` (in place).

    Its last statement builds the output with ``image_outputs=outputs.image_outputs``, an attribute the
    language model's output does not have: every call raises ``AttributeError``, images or not. The
    mended forward is transformers' own source with that one read replaced by the image outputs the
    forward computed (``mm_encoder_outputs.get("image")``); every computation is HF's. Nothing happens
    where the source no longer has the read.
    """
    fixed = _fixed_forward(type(model))
    if fixed is not None and not getattr(model, "_vlmcp_llama4_forward", False):
        model.forward = types.MethodType(fixed, model)
        model._vlmcp_llama4_forward = True


@dataclass(frozen=True, kw_only=True)
class Llama4Adapter(HFAdapter):
    """Llama 4: one fixed-size tile per ``pixel_values`` row, 1-D positions, ``replicate``."""

    base_model: str = ""
    language_model: str = "language_model.model"
    lm_head: str = "language_model.lm_head"
    video_keys: tuple[str, ...] = ()

    @property
    def vision_modes(self) -> tuple[str, ...]:
        return ("replicate",)

    def _per_tile(self, config) -> int:
        vc = config.vision_config
        return int((vc.image_size // vc.patch_size) ** 2 * vc.pixel_shuffle_ratio ** 2)

    def image_tokens(self, model, pixels):
        pv = fixed_size_images(pixels, model.config, "Llama 4")
        return [self._per_tile(model.config)] * pv.shape[0]

    def select_images(self, pixels, index):
        return select_rows(pixels, index)

    def prepare_model(self, model):
        fix_forward(model)

    def position_ids(self, model, input_ids, token_type, pixels, videos=None):
        check_chunks(model.config.text_config, [input_ids.numel()], "shard_inputs")
        return torch.arange(input_ids.numel(), device=input_ids.device).unsqueeze(0)


LLAMA4 = Llama4Adapter(name="llama4", model_types=("llama4",))
