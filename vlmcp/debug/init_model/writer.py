"""``vlmcp init-model``: write a small random Hugging Face VLM directory, built offline.

The directory holds what a hub checkout holds, so every consumer loads it unchanged::

    config.json, generation_config.json, model.safetensors
    tokenizer.json, tokenizer_config.json         (byte-level BPE trained here, in code)
    chat_template.jinja, processor_config.json    (the architecture's template and processor)

and it loads with ``AutoProcessor.from_pretrained(dir)`` and
``AutoModelForImageTextToText.from_pretrained(dir)`` with ``HF_HUB_OFFLINE=1``.

The tokenizer is a byte-level BPE (any text encodes) trained on the built-in shapes
captions and the chat template's words, so a caption costs one token per word; the
architecture's special tokens are single ids. Images are kept small: Qwen2-VL,
Qwen2.5-VL and Qwen3-VL use 8-pixel patches merged 2x2 (a 32x32 image is 4 tokens, a
48x48 one 9), LLaVA a 32x32 CLIP input with 8-pixel patches (16 tokens per image).
Qwen3-VL has deepstack at ViT block 0 (:func:`vlmcp.debug.tiny.tiny_config`); Qwen3.5 is
Qwen3-VL's processor and template on the hybrid model (three Gated DeltaNet layers, then
one gated attention layer). InternVL and LLaVA-OneVision are :mod:`vlmcp.debug.tiny.anyres`'s
models on 8x8-pixel tiles: InternVL cuts an image into up to :data:`MAX_TILES` tiles (and
a thumbnail when more than one), 4 tokens each between ``<img>`` and ``</img>``;
LLaVA-OneVision gives a base tile (16 tokens) and the anyres grid, one newline per row.
Without torchvision their processors are built without the video part
(:mod:`vlmcp.data.hf.processor`). Gemma 3 (:mod:`vlmcp.debug.init_model.gemma3`): 32x32 images of 4 tokens,
sliding-window and full layers, bidirectional images. GLM-4.1V
(:mod:`vlmcp.debug.init_model.glm4v`): 8-pixel patches merged 2x2, videos as frame groups of
image placeholders. SmolVLM (:mod:`vlmcp.debug.init_model.smolvlm`):
images split into up to 3x3 8x8-pixel crops and a global image, 4 tokens each, framed by
``<fake_token_around_image>`` and ``<row_i_col_j>`` / ``<global-img>``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, get_args

import torch

from vlmcp.data.hf.processor import save_processor
from vlmcp.debug.init_model import gemma3 as init_gemma3
from vlmcp.debug.init_model import glm4v as init_glm4v
from vlmcp.debug.init_model import smolvlm as init_smolvlm
from vlmcp.debug.init_model.templates import CHAT_TEMPLATES, special_tokens

__all__ = ["ARCHS", "Arch", "build_processor", "init_model"]

Arch = Literal["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "llava", "internvl", "llava_onevision",
               "gemma3", "smolvlm", "glm4v"]
ARCHS: tuple[str, ...] = get_args(Arch)

PATCH_SIZE = 8
LLAVA_IMAGE_SIZE = 32
MAX_TILES = 4
"""InternVL: an image is cut into at most this many 8x8 tiles (plus a thumbnail when more than one)."""
MAX_PIXELS = 64 * 64
"""Qwen images larger than this are scaled down (a 64x64 image is 16 tokens)."""
VIDEO_PIXELS = 16 * MAX_PIXELS
"""Qwen3-VL and Qwen3.5: a whole video's pixel budget (its video processor's ``size["longest_edge"]``,
``t * H' * W'``): 16 frames of 64x64, 256 tokens."""


def _corpus() -> list[str]:
    """Text the BPE is trained on: every built-in caption word and the template's words."""
    from vlmcp.data.builtin.vocab import SPECIAL_TOKENS, WORDS
    from vlmcp.data.hf.export import PROMPTS

    words = [w for w in WORDS if w not in SPECIAL_TOKENS]
    lines = [" ".join(words), "\n".join(words), *PROMPTS.values()]
    lines += ["system\nYou are a helpful assistant.", "user\n", "assistant\n", "model\n",
              "USER: Describe the image. ASSISTANT: a red circle top left", "Picture 1: Video 1:"]
    return lines * 20  # frequency makes every whole word a merge


def _tokenizer(arch: Arch):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import TokenizersBackend

    specials = list(special_tokens(arch))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    extra = {"gemma3": init_gemma3.CORPUS, "smolvlm": init_smolvlm.CORPUS,
             "glm4v": init_glm4v.CORPUS}.get(arch, [])
    tok.train_from_iterator(_corpus() + extra, trainer)
    if arch == "gemma3":
        return init_gemma3.tokenizer(tok)
    if arch == "smolvlm":
        return init_smolvlm.tokenizer(tok)
    if arch == "glm4v":
        return init_glm4v.tokenizer(tok)
    if arch == "llava":
        return TokenizersBackend(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                 pad_token="<pad>", extra_special_tokens={"image_token": "<image>"})
    if arch == "internvl":
        named = {"start_image_token": "<img>", "end_image_token": "</img>",
                 "context_image_token": "<IMG_CONTEXT>",
                 "video_token": "<video>"}
        return TokenizersBackend(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 extra_special_tokens=named)
    if arch == "llava_onevision":
        return TokenizersBackend(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 extra_special_tokens={"image_token": "<image>", "video_token": "<video>"})
    return TokenizersBackend(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                             extra_special_tokens={"image_token": "<|image_pad|>",
                                                   "video_token": "<|video_pad|>"})


def build_processor(arch: Arch):
    """The processor of a new ``arch`` directory: tokenizer, image processor, chat template."""
    if arch not in ARCHS:
        raise ValueError(f"--arch must be one of {ARCHS}, got {arch!r}")
    tokenizer = _tokenizer(arch)
    if arch == "llava":
        from transformers import LlavaProcessor
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

        size = {"shortest_edge": LLAVA_IMAGE_SIZE}
        crop = {"height": LLAVA_IMAGE_SIZE, "width": LLAVA_IMAGE_SIZE}
        images = CLIPImageProcessorPil(size=size, crop_size=crop)
        return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=PATCH_SIZE,
                              vision_feature_select_strategy="default", num_additional_image_tokens=1,
                              chat_template=CHAT_TEMPLATES[arch])
    if arch in ("internvl", "llava_onevision"):
        return _anyres_processor(arch, tokenizer)
    if arch == "gemma3":  # no video part: no torchvision needed
        return init_gemma3.processor(tokenizer)
    if arch == "smolvlm":
        return init_smolvlm.processor(tokenizer)
    if arch == "glm4v":
        return init_glm4v.processor(tokenizer)
    from transformers import Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    factor = 2 * PATCH_SIZE  # patch x merge: image sides are multiples of it after resizing
    images = Qwen2VLImageProcessorPil(patch_size=PATCH_SIZE, merge_size=2, temporal_patch_size=2,
                                      min_pixels=factor * factor, max_pixels=MAX_PIXELS)
    cls = Qwen2VLProcessor
    if arch == "qwen2_5_vl":
        from transformers import Qwen2_5_VLProcessor as cls
    elif arch in ("qwen3_vl", "qwen3_5"):  # Qwen3.5's processor is Qwen3-VL's
        from transformers import Qwen3VLProcessor as cls
    from transformers.utils import is_torchvision_available

    patching = dict(patch_size=PATCH_SIZE, merge_size=2, temporal_patch_size=2)
    if arch in ("qwen3_vl", "qwen3_5"):  # its video processor bounds a whole video's pixels by size
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

        from vlmcp.data.hf.processor import build_without_video

        video = Qwen3VLVideoProcessor(**patching, size={"shortest_edge": 4 * factor * factor,
                                                        "longest_edge": VIDEO_PIXELS})
        if not is_torchvision_available():  # its video processor imports without torchvision
            proc = build_without_video(cls, tokenizer, images, CHAT_TEMPLATES[arch])
            proc.video_processor = video
            return proc
    elif not is_torchvision_available():  # see vlmcp.data.hf.processor
        from vlmcp.data.hf.processor import processor_without_video

        return processor_without_video(cls, tokenizer, images, CHAT_TEMPLATES[arch])
    else:
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

        video = Qwen2VLVideoProcessor(**patching, min_pixels=factor * factor, max_pixels=MAX_PIXELS)
    return cls(image_processor=images, tokenizer=tokenizer, video_processor=video,
               chat_template=CHAT_TEMPLATES[arch])


def _anyres_processor(arch: Arch, tokenizer):
    """InternVL (8x8-pixel tiles, up to :data:`MAX_TILES` and a thumbnail) or LLaVA-OneVision
    (an 8x8 base tile and the anyres grid of :data:`vlmcp.debug.tiny.anyres.PINPOINTS`)."""
    import transformers
    from transformers.utils import is_torchvision_available

    from vlmcp.data.hf.processor import build_without_video
    from vlmcp.debug.tiny.anyres import PINPOINTS, SIDE

    tile = {"height": SIDE, "width": SIDE}
    if arch == "internvl":
        from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

        images = GotOcr2ImageProcessorPil(size=tile, crop_to_patches=True, min_patches=1,
                                          max_patches=MAX_TILES)
        cls, own = transformers.InternVLProcessor, dict(image_seq_length=4)
    else:
        from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
            LlavaOnevisionImageProcessorPil,
        )

        images = LlavaOnevisionImageProcessorPil(size=tile, image_grid_pinpoints=PINPOINTS)
        cls = transformers.LlavaOnevisionProcessor
        own = dict(num_image_tokens=16, vision_feature_select_strategy="full",
                   vision_aspect_ratio="anyres_max_1")
    if not is_torchvision_available():
        proc = build_without_video(cls, tokenizer, images, CHAT_TEMPLATES[arch], **own)
        if arch == "llava_onevision":  # its video processor imports without torchvision (InternVL's does not)
            from transformers.models.llava_onevision.video_processing_llava_onevision import (
                LlavaOnevisionVideoProcessor,
            )

            proc.video_processor = LlavaOnevisionVideoProcessor(size=tile)
        return proc
    if arch == "internvl":
        from transformers.models.internvl.video_processing_internvl import InternVLVideoProcessor as video_cls
    else:
        from transformers.models.llava_onevision.video_processing_llava_onevision import (
            LlavaOnevisionVideoProcessor as video_cls,
        )
    video = video_cls(size=tile)
    return cls(image_processor=images, tokenizer=tokenizer, video_processor=video,
               chat_template=CHAT_TEMPLATES[arch], **own)


def _config(arch: Arch, tokenizer):
    """:func:`vlmcp.debug.tiny.tiny_config` with this tokenizer's ids and 8-pixel patches."""
    from vlmcp.debug.tiny import tiny_config

    ids = tokenizer.convert_tokens_to_ids
    text = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id, max_position_embeddings=4096)
    if arch == "llava":
        text["bos_token_id"] = tokenizer.bos_token_id
        vision = dict(image_size=LLAVA_IMAGE_SIZE, patch_size=PATCH_SIZE)
        return tiny_config(arch, text_config=text, vision_config=vision, image_token_index=ids("<image>"),
                           image_seq_length=(LLAVA_IMAGE_SIZE // PATCH_SIZE) ** 2)
    if arch == "gemma3":
        return init_gemma3.config(tokenizer, text)
    if arch == "smolvlm":
        return init_smolvlm.config(tokenizer, text)
    if arch == "glm4v":
        return init_glm4v.config(tokenizer, text)
    text["bos_token_id"] = None
    if arch == "internvl":
        return tiny_config(arch, text_config=text, image_token_id=ids("<IMG_CONTEXT>"))
    if arch == "llava_onevision":
        return tiny_config(arch, text_config=text, image_token_index=ids("<image>"),
                           video_token_index=ids("<video>"))
    vision = dict(patch_size=PATCH_SIZE)
    if arch == "qwen2_5_vl":
        vision["window_size"] = 4 * PATCH_SIZE  # 2x2 merged tokens per window, as in tiny_config
    return tiny_config(arch, text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                       video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                       vision_end_token_id=ids("<|vision_end|>"))


def init_model(arch: Arch, out: str | os.PathLike, *, seed: int = 0,
               dtype: torch.dtype = torch.float32) -> Path:
    """Write a small random ``arch`` model with its processor to ``out``.

    Args:
        arch: one of :data:`ARCHS`.
        out: the directory (created; files already there are overwritten).
        seed: seeds the weights.
        dtype: the saved parameter dtype.

    Returns:
        ``Path(out)``.
    """
    from transformers import AutoModelForImageTextToText

    processor = build_processor(arch)
    config = _config(arch, processor.tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=dtype)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    save_processor(processor, out)
    return out
