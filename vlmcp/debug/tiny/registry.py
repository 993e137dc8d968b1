"""The registry of tiny configs: one builder per architecture (``config.model_type``).

Like torchtitan's debug model configs, each family file (:mod:`.qwen`, :mod:`.llava`,
:mod:`.anyres`, :mod:`.gemma3`, :mod:`.kimi_k25`, :mod:`.lfm2_vl`) registers the tiny config of
each model type it knows with :func:`register_tiny`, together with the verification row of
``vlmcp verify --model hf:ARCH`` in the architecture's image terms (the samples its model type's
synthetic images function reads, :mod:`vlmcp.debug.synthetic`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_SAMPLES", "VIDEO_ONLY_SAMPLES", "VIDEO_SAMPLES", "TinyArch", "register_tiny", "tiny_arch",
           "tiny_archs"]

DEFAULT_SAMPLES = (
    (5, (1, 4, 4), 9),                 # prompt text before the image
    (12,),                             # text only
    (3, (1, 4, 8), 4, (1, 4, 4), 7),   # two images in one sample, text between
)
"""The verification row: 3 packed samples (Qwen grids ``(t, h, w)``; LLaVA images are fixed-size)."""

VIDEO_SAMPLES = (
    (5, ("video", 3, 4, 4), 9),                                    # a video of 3 frame groups
    (12,),                                                         # text only
    (3, (1, 4, 8), 4, ("video", 2, 4, 8, 0.5), 2, (1, 4, 4), 7),   # image, video, image
)
"""``vlmcp verify --model --video``'s row (Qwen2.5-VL: the second video at 0.5 s per frame group)."""

VIDEO_ONLY_SAMPLES = ((5, ("video", 3, 4, 4), 9), (12,), (3, ("video", 2, 4, 8), 7))
"""The same for a model whose forward cannot take images and videos in one row (GLM-4.1V)."""

ConfigBuilder = Callable[[dict[str, Any]], Any]
"""``build(overrides) -> config``; ``overrides`` as :func:`vlmcp.debug.tiny.tiny_config` takes them."""


@dataclass(frozen=True, kw_only=True)
class TinyArch:
    """One architecture's tiny config and verification row."""

    model_type: str
    """``config.model_type``, the key (served by the adapter of that model type)."""
    build: ConfigBuilder
    """Builds the config from overrides (``text_config``/``vision_config`` update field by field)."""
    samples: tuple = DEFAULT_SAMPLES
    """``vlmcp verify``'s packed row: per sample, text lengths and images in the adapter's terms."""
    summary: str = ""
    """One line: what the tiny model has (layers, mixers, image rule)."""
    post_init: Callable[[Any], None] | None = None
    """Applied to every fresh model of it, under the model's seed (e.g. a weight HF initializes to zero)."""
    video_samples: tuple | None = None
    """``vlmcp verify --video``'s row in the adapter's terms; None: :data:`VIDEO_SAMPLES` (Qwen grids),
    or :data:`VIDEO_ONLY_SAMPLES` where the model cannot mix images and videos."""


_TINY: dict[str, TinyArch] = {}


def register_tiny(model_type: str, build: ConfigBuilder, *, samples: tuple = DEFAULT_SAMPLES,
                  summary: str = "", post_init: Callable[[Any], None] | None = None,
                  video_samples: tuple | None = None) -> None:
    """Register (or replace) the tiny config of ``model_type`` (see :class:`TinyArch` for the fields)."""
    _TINY[model_type] = TinyArch(model_type=model_type, build=build, samples=samples, summary=summary,
                                 post_init=post_init, video_samples=video_samples)


def tiny_arch(model_type: str) -> TinyArch:
    """The registered :class:`TinyArch`; raises naming every registered model type."""
    try:
        return _TINY[model_type]
    except KeyError:
        raise ValueError(f"no tiny config for {model_type!r}; choose one of {tiny_archs()}") from None


def tiny_archs() -> tuple[str, ...]:
    """Every registered model type, in registration order."""
    return tuple(_TINY)
