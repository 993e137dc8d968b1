"""Loading and saving a model directory's processor, with or without torchvision.

transformers 5 builds the Qwen2-VL / Qwen2.5-VL processor from three parts: tokenizer,
image processor and video processor, and the video processor needs torchvision. vlmcp
trains on images only, so where torchvision is missing (CPU-only machines: there is no
CPU torchvision wheel for every torch) :func:`load_processor` assembles the same
processor class without its video part. Where torchvision is installed it is
``AutoProcessor.from_pretrained`` unchanged, and :func:`save_processor` writes the files
``save_pretrained`` writes (``processor_config.json`` with both sub-processors, the
tokenizer files, ``chat_template.jinja``), so either way the directory loads with
``AutoProcessor`` wherever the model's own dependencies are installed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["build_without_video", "load_processor", "processor_without_video", "save_processor"]

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


_QWEN_STYLE = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor")


def load_processor(model_dir: str | os.PathLike):
    """The processor of ``model_dir`` (``AutoProcessor.from_pretrained``; see the module doc).

    Raises:
        ValueError: if the directory has no processor files (the message names it).
    """
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    model_dir = Path(model_dir)
    config_file = model_dir / "processor_config.json"
    saved = json.loads(config_file.read_text()) if config_file.exists() else {}
    if is_torchvision_available() or "video_processor" not in saved:
        try:
            return AutoProcessor.from_pretrained(model_dir)
        except OSError as err:
            raise ValueError(f"cannot load a processor from {model_dir}: {err}") from None
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    cls = getattr(transformers, saved["processor_class"])
    template_file = model_dir / "chat_template.jinja"
    template = template_file.read_text() if template_file.exists() else None
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    images = AutoImageProcessor.from_pretrained(model_dir)
    if saved["processor_class"] in _QWEN_STYLE:
        return processor_without_video(cls, tokenizer, images, template)
    parts = ("image_processor", "video_processor", "processor_class")
    own = {k: v for k, v in saved.items() if k not in parts}
    return build_without_video(cls, tokenizer, images, template, **own)


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
    if cls not in _QWEN_STYLE:  # the processor's own arguments (image_seq_length, ...)
        own = processor.to_dict()
        for key in ("image_processor", "video_processor", "processor_class", "tokenizer", "chat_template",
                    "audio_tokenizer"):
            own.pop(key, None)
        config.update(own)
    (out / "processor_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if isinstance(processor.chat_template, str):
        (out / "chat_template.jinja").write_text(processor.chat_template)
