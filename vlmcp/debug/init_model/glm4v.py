"""``vlmcp init-model --arch glm4v``: GLM-4.1V's tokens, chat template and processor, built offline.

The tokenizer has GLM-4.1V's special tokens as single ids (``[gMASK]``, ``<sop>``, the role
tokens, ``<|begin_of_image|>``, ``<|image|>``, ``<|end_of_image|>``, ``<|begin_of_video|>``,
``<|video|>``, ``<|end_of_video|>``, ``<|endoftext|>``). The chat template is the hub's shape
(``[gMASK]<sop>``, ``<|user|>\\n`` and ``<|assistant|>\\n`` turns, each image
``<|begin_of_image|><|image|><|end_of_image|>``, each video
``<|begin_of_video|><|video|><|end_of_video|>``), except that the assistant turn ends in
``<|endoftext|>`` so a trained model learns to stop (the hub's ends at the next role token).
The processor is ``Glm4vProcessor`` with 8-pixel patches merged 2x2 (F = 16): images within
[256, 4096] pixels, videos by its ``Glm4vVideoProcessor`` (2 fps, a whole video within
[1024, 65536] pixels); every frame group is written with the image placeholder, its whole
seconds after it (:mod:`vlmcp.data.hf.video.glm4v`).
"""

from __future__ import annotations

__all__ = ["CHAT_TEMPLATE", "CORPUS", "SPECIALS", "config", "processor", "tokenizer"]

SPECIALS = ("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
            "<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>",
            "<|video|>")
"""GLM-4.1V's special tokens (single ids)."""
PATCH_SIZE = 8
CORPUS = ["<|user|>\n", "<|assistant|>\n", "0123456789"] * 20
"""Extra BPE training text: the turn headers and the digits of the frame timestamps."""

CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for msg in messages %}"
    "{%- if msg['role'] == 'system' %}<|system|>{{ '\n' }}"
    "{%- if msg['content'] is string %}{{ msg['content'] }}"
    "{%- else %}{%- for item in msg['content'] %}"
    "{%- if item['type'] == 'text' %}{{ item['text'] }}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- elif msg['role'] == 'user' %}<|user|>{{ '\n' }}"
    "{%- if msg['content'] is string %}{{ msg['content'] }}"
    "{%- else %}{%- for item in msg['content'] %}"
    "{%- if item['type'] == 'video' or 'video' in item %}<|begin_of_video|><|video|><|end_of_video|>"
    "{%- elif item['type'] == 'image' or 'image' in item %}<|begin_of_image|><|image|><|end_of_image|>"
    "{%- elif item['type'] == 'text' %}{{ item['text'] }}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- elif msg['role'] == 'assistant' %}<|assistant|>{{ '\n' }}"
    "{%- if msg['content'] is string %}{{ msg['content'] }}"
    "{%- else %}{%- for item in msg['content'] %}"
    "{%- if item['type'] == 'text' %}{{ item['text'] }}{%- endif %}{%- endfor %}{%- endif %}<|endoftext|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{{ '\n' }}{%- endif %}")
"""GLM-4.1V's chat template, its turns closed by ``<|endoftext|>`` (module docstring)."""


def tokenizer(tok):
    """The transformers tokenizer around the trained BPE ``tok`` (GLM-4.1V's named tokens)."""
    from transformers import TokenizersBackend

    return TokenizersBackend(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                             extra_special_tokens={"image_token": "<|image|>", "video_token": "<|video|>"})


def processor(tok):
    """``Glm4vProcessor`` with its image and video processors (module docstring)."""
    from transformers import Glm4vProcessor
    from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil
    from transformers.models.glm4v.video_processing_glm4v import Glm4vVideoProcessor
    from transformers.utils import is_torchvision_available

    from vlmcp.data.hf.processor import build_without_video

    factor = 2 * PATCH_SIZE
    patching = dict(patch_size=PATCH_SIZE, merge_size=2, temporal_patch_size=2)
    images = Glm4vImageProcessorPil(**patching, size={"shortest_edge": factor ** 2, "longest_edge": 4096})
    video = Glm4vVideoProcessor(**patching, size={"shortest_edge": 4 * factor ** 2, "longest_edge": 65536})
    if is_torchvision_available():
        return Glm4vProcessor(image_processor=images, tokenizer=tok, video_processor=video,
                              chat_template=CHAT_TEMPLATE)
    proc = build_without_video(Glm4vProcessor, tok, images, CHAT_TEMPLATE)
    proc.video_processor = video  # imports without torchvision (only its resize needs it)
    return proc


def config(tok, text: dict):
    """:func:`vlmcp.debug.tiny.tiny_config`'s GLM-4.1V with ``tok``'s ids, on 8-pixel patches."""
    from vlmcp.debug.tiny import tiny_config

    ids = tok.convert_tokens_to_ids
    text = {**text, "bos_token_id": None, "eos_token_id": [tok.eos_token_id, ids("<|user|>")]}
    vision = dict(patch_size=PATCH_SIZE, image_size=4 * PATCH_SIZE)  # a 4x4 table of learned positions
    named = dict(image_token_id="<|image|>", video_token_id="<|video|>",
                 image_start_token_id="<|begin_of_image|>", image_end_token_id="<|end_of_image|>",
                 video_start_token_id="<|begin_of_video|>", video_end_token_id="<|end_of_video|>")
    tokens = {k: ids(v) for k, v in named.items()}
    return tiny_config("glm4v", text_config=text, vision_config=vision, **tokens)
