"""Loading and saving a model directory's processor, with or without torchvision.

transformers 5 builds a VLM processor from three parts: tokenizer, image processor and
video processor, and loading a video processor through ``AutoProcessor`` needs torchvision,
which is not installable for every torch (CPU-only machines). vlmcp makes video pixels
itself (:mod:`vlmcp.data.hf.video`), so where torchvision is missing :func:`load_processor`
assembles the same processor class from its parts: Qwen2-VL's without a video part (its
videos are sized by the image processor), the others with their video processor built from
the saved config (:func:`video_processor_from_config`: Qwen3-VL's, GLM-4.1V's and
LLaVA-OneVision's import without torchvision and hold the directory's frame sampling). Where
torchvision is installed it is ``AutoProcessor.from_pretrained`` unchanged, and
:func:`save_processor` writes the files ``save_pretrained`` writes (``processor_config.json``
with both sub-processors, the tokenizer files, ``chat_template.jinja``), so either way the
directory loads with ``AutoProcessor`` wherever the model's own dependencies are installed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from vlmcp.deps import check_versions

__all__ = ["build_without_video", "load_processor", "processor_without_video", "save_processor",
           "video_processor_from_config"]

_IMAGE_KEYS_FOR_VIDEO = ("patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_pixels",
                         "size", "image_mean", "image_std", "do_normalize", "do_rescale", "rescale_factor",
                         "do_resize", "do_convert_rgb", "resample")


def processor_without_video(cls, tokenizer, image_processor, chat_template):
    """An instance of ``cls`` (a Qwen2-VL-style processor) without a video processor.

    ``ProcessorMixin.__init__`` insists on every sub-processor; this sets the same
    attributes the class's own ``__init__`` sets, for images and text.
    """
    proc = cls.__new__(cls)
    proc.tokenizer, proc.image_processor, proc.video_processor = tokenizer, image_processor, None
    proc.chat_template = chat_template
    proc.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
    proc.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
    proc.image_token_id = tokenizer.convert_tokens_to_ids(proc.image_token)
    proc.video_token_id = tokenizer.convert_tokens_to_ids(proc.video_token)
    return proc


def build_without_video(cls, tokenizer, image_processor, chat_template, **kwargs):
    """``cls(image_processor, tokenizer, video_processor=None, chat_template, **kwargs)``.

    For processors whose ``__init__`` reads its tokens from the tokenizer and its own
    arguments (InternVL, LLaVA-OneVision, SmolVLM): the class's own ``__init__`` runs, only
    ``ProcessorMixin``'s class check lets the missing video processor through. SmolVLM's
    ``apply_chat_template`` (which reads the video processor's frame defaults) is ``ProcessorMixin``'s.
    """
    proc = cls.__new__(cls)
    check = cls.check_argument_for_proper_class
    proc.check_argument_for_proper_class = lambda name, arg: None if arg is None else check(proc, name, arg)
    try:
        cls.__init__(proc, image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                     chat_template=chat_template, **kwargs)
    finally:
        del proc.check_argument_for_proper_class
    if "apply_chat_template" in cls.__dict__ and cls.__name__ == "SmolVLMProcessor":
        # its override only picks a video template and the video processor's frame defaults (reading
        # video_processor.num_frames even without videos): without a video part, ProcessorMixin's
        from transformers import ProcessorMixin

        proc.apply_chat_template = ProcessorMixin.apply_chat_template.__get__(proc)
    return proc


_QWEN_STYLE = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor")
"""Processors assembled by :func:`processor_without_video` (the others run their own ``__init__``)."""
_SAVED_AS_DICT = _QWEN_STYLE + ("Qwen3VLProcessor", "Glm4vProcessor")
"""Processors with no arguments of their own beside the sub-processors (their saved config has none)."""


def video_processor_from_config(config: dict | None):
    """The video processor a saved config describes, built without torchvision; None when its class
    needs torchvision to import (Qwen2-VL's) or there is no config.

    transformers' Qwen3-VL, GLM-4.1V and LLaVA-OneVision video processors import and hold their
    parameters without torchvision (only their resize needs it, and vlmcp resizes with PIL), so
    the frame sampling and sizes vlmcp reads from them are the directory's own.
    """
    if not config or "video_processor_type" not in config:
        return None
    import importlib

    import transformers.models

    name = config["video_processor_type"]
    # transformers' top-level name (and its auto mapping) is a torchvision-gated stand-in: the class
    # itself lives in some models/<model>/video_processing_<model>.py
    for file in sorted(Path(transformers.models.__file__).parent.glob("*/video_processing_*.py")):
        if f"class {name}(" in file.read_text():
            try:
                module = importlib.import_module(f"transformers.models.{file.parent.name}.{file.stem}")
            except ImportError:  # its module imports torchvision (Qwen2-VL's)
                return None
            return getattr(module, name)(**{k: v for k, v in config.items() if k != "video_processor_type"})
    return None


def _saved_video_config(model_dir: Path, saved: dict) -> dict | None:
    """The video processor's config: ``processor_config.json``'s (transformers 5) or the hub's
    ``video_preprocessor_config.json``."""
    if "video_processor" in saved:
        return saved["video_processor"]
    hub = model_dir / "video_preprocessor_config.json"
    return json.loads(hub.read_text()) if hub.exists() else None


def load_processor(model_dir: str | os.PathLike):
    """The processor of ``model_dir`` (``AutoProcessor.from_pretrained``; see the module doc).

    Without torchvision, a processor with a video part is assembled from its tokenizer, image
    processor and template, with the video processor attached where it imports without
    torchvision (:func:`video_processor_from_config`: it holds the directory's video sampling).

    Raises:
        ValueError: if the directory has no processor files (the message names it).
    """
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    check_versions("transformers")
    model_dir = Path(model_dir)
    config_file = model_dir / "processor_config.json"
    saved = json.loads(config_file.read_text()) if config_file.exists() else {}
    video_config = _saved_video_config(model_dir, saved)
    if is_torchvision_available() or video_config is None:
        try:
            return AutoProcessor.from_pretrained(model_dir)
        except OSError as err:
            raise ValueError(f"cannot load a processor from {model_dir}: {err}") from None
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    name = saved.get("processor_class") or video_config.get("processor_class")
    if name is None:
        preprocessor = model_dir / "preprocessor_config.json"
        name = json.loads(preprocessor.read_text()).get("processor_class") if preprocessor.exists() else None
    if name is None:
        raise ValueError(f"cannot load a processor from {model_dir}: no processor_class in its configs")
    cls = getattr(transformers, name)
    template_file = model_dir / "chat_template.jinja"
    template = template_file.read_text() if template_file.exists() else None
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    images = AutoImageProcessor.from_pretrained(model_dir)
    if name in _QWEN_STYLE:
        return processor_without_video(cls, tokenizer, images, template)
    parts = ("image_processor", "video_processor", "processor_class")
    own = {k: v for k, v in saved.items() if k not in parts}
    proc = build_without_video(cls, tokenizer, images, template, **own)
    proc.video_processor = video_processor_from_config(video_config)
    return proc


def save_processor(processor, out: str | os.PathLike) -> None:
    """``processor.save_pretrained(out)``, also for a processor without its video part."""
    out = Path(out)
    if getattr(processor, "video_processor", False) is not None:
        processor.save_pretrained(out)
        return
    out.mkdir(parents=True, exist_ok=True)
    cls = type(processor).__name__
    processor.tokenizer._set_processor_class(cls)
    processor.tokenizer.save_pretrained(out)
    image = processor.image_processor.to_dict()
    image["image_processor_type"] = image["image_processor_type"].removesuffix("Pil")
    # what Qwen2VLVideoProcessor.to_dict() holds for the same patching, so that a
    # machine with torchvision builds the same video processor
    video = {k: image[k] for k in _IMAGE_KEYS_FOR_VIDEO if k in image}
    video["video_processor_type"] = image["image_processor_type"].replace("ImageProcessor", "VideoProcessor")
    if cls not in _QWEN_STYLE:  # InternVLProcessor -> InternVLVideoProcessor
        video["video_processor_type"] = cls.replace("Processor", "VideoProcessor")
    config = {"image_processor": image, "video_processor": video, "processor_class": cls}
    if cls not in _SAVED_AS_DICT:  # the processor's own arguments (image_seq_length, ...)
        own = processor.to_dict()
        for key in ("image_processor", "video_processor", "processor_class", "tokenizer", "chat_template",
                    "audio_tokenizer"):
            own.pop(key, None)
        config.update(own)
    (out / "processor_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if isinstance(processor.chat_template, str):
        (out / "chat_template.jinja").write_text(processor.chat_template)
