"""Who writes the synthetic media of a model: one images function and one video function per model type.

A function is registered under the ``config.model_type`` values it serves (the adapters'
``model_types``), or under an adapter class for the models that have no adapter of their own (the
placeholder and M-RoPE fallbacks of :func:`vlmcp.hf.adapter_for`, and :class:`~vlmcp.hf.HFAdapter`
itself: the LLaVA-style default). :func:`images_writer` and :func:`video_writer` look a model's
type up first, then its adapter's classes from the most derived::

    @register_images("gemma3")
    def gemma3_images(adapter, model, images, generator, *, markers=True): ...

Adding an architecture's synthetic rows is adding a function to a family file; neither the
adapters nor :func:`~vlmcp.debug.synthetic.row.synthetic_row` change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import nn

from vlmcp.hf.adapters import HFAdapter

__all__ = ["ImagesWriter", "VideoWriter", "images_writer", "register_images", "register_video",
           "synthetic_images", "synthetic_video", "video_writer"]


class ImagesWriter(Protocol):
    def __call__(self, adapter: HFAdapter, model: nn.Module, images: Sequence[tuple],
                 generator: torch.Generator, *, markers: bool = True) -> tuple[dict, list[list[int]]]:
        """Random per-image inputs of one sample's ``images``, as the processor gives them.

        Args:
            adapter: the model's adapter (its fields: token ids, keys, OneVision...).
            model: the top-level model (its config gives the shapes).
            images: one tuple per image; what it holds is the family's to say (a patch grid, tiles,
                a size...).
            generator: for the random pixels.
            markers: write the markers the chat template puts around an image where the model has
                them optional (Qwen-VL's vision start / end, Llama 4's); others ignore it.

        Returns:
            ``(pixels, ids)``: the sample's per-image inputs (floating tensors in float64) and, per
            image, the token ids the processor writes for it: its placeholders and the markers
            around or between them (none of them a target).
        """


class VideoWriter(Protocol):
    def __call__(self, adapter: HFAdapter, model: nn.Module, video: tuple, generator: torch.Generator,
                 text: Callable[[int], list[int]]) -> tuple[dict, list[tuple[list[int], int]]]:
        """Random per-video inputs of one video and the tokens its processor writes.

        Args:
            adapter: the model's adapter.
            model: the top-level model.
            video: ``(t, h, w)`` or ``(t, h, w, seconds)``: ``t`` temporal patch groups of ``h x w``
                patches (``seconds`` per group, where the model reads it); LLaVA-OneVision: ``(frames,
                ...)``.
            generator: for the random pixels.
            text: ``text(n)``, n random text token ids (timestamps the processor writes as text).

        Returns:
            ``(pixels, runs)``: the video's inputs (the adapter's ``video_keys``; pixels in float64)
            and its tokens as ``(ids, kind)`` runs in row order, kind 0 text or marker, 2 video
            placeholder.
        """


Key = str | type[HFAdapter]
_IMAGES: dict[Key, ImagesWriter] = {}
_VIDEO: dict[Key, VideoWriter] = {}


def _register(table: dict, keys: tuple[Key, ...]):
    if not keys:
        raise TypeError("register a synthetic writer under at least one model type or adapter class")

    def add(fn):
        for key in keys:
            table[key] = fn
        return fn

    return add


def register_images(*keys: Key) -> Callable[[ImagesWriter], ImagesWriter]:
    """Decorator: ``fn`` writes the images of these model types (or of models under these adapter classes)."""
    return _register(_IMAGES, keys)


def register_video(*keys: Key) -> Callable[[VideoWriter], VideoWriter]:
    """Decorator: ``fn`` writes the videos of these model types (or of models under these adapter classes)."""
    return _register(_VIDEO, keys)


def _find(table: dict, adapter: HFAdapter, model: nn.Module):
    fn = table.get(getattr(model.config, "model_type", None))
    if fn is None:
        fn = next((table[cls] for cls in type(adapter).__mro__ if cls in table), None)
    return fn


def images_writer(adapter: HFAdapter, model: nn.Module) -> ImagesWriter:
    """The images function of ``model``: its model type's, else its adapter class's (HFAdapter's default)."""
    return _find(_IMAGES, adapter, model)


def video_writer(adapter: HFAdapter, model: nn.Module) -> VideoWriter:
    """The video function of ``model``; raises ``NotImplementedError`` where none is registered."""
    fn = _find(_VIDEO, adapter, model)
    if fn is None:
        model_type = getattr(model.config, "model_type", None)
        raise NotImplementedError(f"the {adapter.name} adapter takes no videos, or no synthetic video writer "
                                  f"is registered for model type {model_type!r}")
    return fn


def synthetic_images(adapter: HFAdapter, model: nn.Module, images: Sequence[tuple],
                     generator: torch.Generator, *, markers: bool = True) -> tuple[dict, list[list[int]]]:
    """One sample's ``images`` through :func:`images_writer` (see :class:`ImagesWriter`)."""
    return images_writer(adapter, model)(adapter, model, images, generator, markers=markers)


def synthetic_video(adapter: HFAdapter, model: nn.Module, video: tuple, generator: torch.Generator,
                    text: Callable[[int], list[int]]) -> tuple[dict, list[tuple[list[int], int]]]:
    """One ``video`` through :func:`video_writer` (see :class:`VideoWriter`)."""
    return video_writer(adapter, model)(adapter, model, video, generator, text)
