"""Synthetic processor rows for Hugging Face VLMs (tests, ``vlmcp verify --model``, the benchmarks).

:func:`synthetic_row` (:mod:`.row`) packs chat-like samples into one row as the model's processor
would write it, with labels and ``cu_seqlens``. What an image or a video becomes (pixels,
placeholders, markers, timestamps) is written by one function per model type, registered in
:mod:`.registry` (:func:`register_images`, :func:`register_video`) by the family files:

* :mod:`.placeholder` — the LLaVA-style default and the long tail's placeholder models;
* :mod:`.qwen` — Qwen-VL patch rows and videos (Qwen2-VL to Qwen3.5, GLM-4.xV, MiniMax-M3-VL, the
  long tail's M-RoPE models);
* :mod:`.anyres` — InternVL, LLaVA-NeXT / OneVision (and its videos), Idefics3 / SmolVLM, Mistral3;
* :mod:`.gemma3`, :mod:`.gemma4`, :mod:`.kimi_k25`, :mod:`.lfm2_vl`, :mod:`.nemotron`, :mod:`.llama4`.

The adapters (``vlmcp.hf.adapters``) know none of this: it is tooling, and the runtime never imports it.
"""

from vlmcp.debug.synthetic import (  # noqa: F401  (registration)
    anyres,
    gemma3,
    gemma4,
    kimi_k25,
    lfm2_vl,
    llama4,
    nemotron,
    placeholder,
    qwen,
)
from vlmcp.debug.synthetic.registry import (
    images_writer,
    register_images,
    register_video,
    synthetic_images,
    synthetic_video,
    video_writer,
)
from vlmcp.debug.synthetic.row import synthetic_row

__all__ = ["images_writer", "register_images", "register_video", "synthetic_images", "synthetic_row",
           "synthetic_video", "video_writer"]
