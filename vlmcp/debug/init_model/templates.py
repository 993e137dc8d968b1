"""What each architecture's tokenizer gets in ``vlmcp init-model``: its special tokens and chat template.

Qwen-VL's, LLaVA's, InternVL's and LLaVA-OneVision's here, as on the hub (or where they differ, why);
Gemma 3's, SmolVLM's and GLM-4.1V's with the rest of what those processors need, in their own files.
"""

from __future__ import annotations

from vlmcp.debug.init_model import gemma3 as init_gemma3
from vlmcp.debug.init_model import glm4v as init_glm4v
from vlmcp.debug.init_model import smolvlm as init_smolvlm

__all__ = ["CHAT_TEMPLATES", "special_tokens"]

_QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>")
_LLAVA_SPECIALS = ("<unk>", "<s>", "</s>", "<pad>", "<image>")
# InternVL3-hf and LLaVA-OneVision (Qwen2 language models): Qwen's chat tokens and their image tokens
_INTERNVL_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>",
                      "<video>")
_ONEVISION_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>")
_SPECIALS = {"llava": _LLAVA_SPECIALS, "internvl": _INTERNVL_SPECIALS, "llava_onevision": _ONEVISION_SPECIALS,
             "gemma3": init_gemma3.SPECIALS, "smolvlm": init_smolvlm.SPECIALS, "glm4v": init_glm4v.SPECIALS}

# Qwen2-VL's template (as on the hub), structured content: images where they occur.
_QWEN_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# LLaVA-1.5's ``USER: <image>\n... ASSISTANT: ...`` with an end-of-turn token, so a
# trained model learns to stop.
_LLAVA_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' ' }}{% endfor %}"
    "{% else %}{{ message['role'].upper() + ': ' }}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<image>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}"
    "{% if message['role'] == 'assistant' %}{{ '</s>' }}{% else %}{{ ' ' }}{% endif %}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")

# Qwen3-VL's (as on the hub, images and text only): no default system prompt.
_QWEN3_TEMPLATE = _QWEN_TEMPLATE.replace(
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}", "")

# InternVL3-hf's (as on the hub): each image is ``<IMG_CONTEXT>\n``, which the processor expands to
# ``<img>`` + tiles x 4 ``<IMG_CONTEXT>`` + ``</img>``.
_INTERNVL_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# LLaVA-OneVision's (as on the hub: images before the text of a message, the text after a newline),
# except that the generation prompt is ``<|im_start|>assistant `` as the assistant turn renders it
# (the hub's ends in a newline the turn does not have, so its trained tokens could not be found).
_ONEVISION_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' ' }}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}"
    "{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>' }}"
    "{% endfor %}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ '\n' + content['text'] }}{% endfor %}"
    "{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\n' + content['text'] }}{% endgeneration %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant ' }}{% endif %}")

CHAT_TEMPLATES = {"qwen2_vl": _QWEN_TEMPLATE, "qwen2_5_vl": _QWEN_TEMPLATE, "qwen3_vl": _QWEN3_TEMPLATE,
                  "qwen3_5": _QWEN3_TEMPLATE, "llava": _LLAVA_TEMPLATE, "internvl": _INTERNVL_TEMPLATE,
                  "llava_onevision": _ONEVISION_TEMPLATE, "gemma3": init_gemma3.CHAT_TEMPLATE,
                  "smolvlm": init_smolvlm.CHAT_TEMPLATE, "glm4v": init_glm4v.CHAT_TEMPLATE}
"""The chat template each architecture's directory gets."""


def special_tokens(arch: str) -> tuple[str, ...]:
    """The special tokens of ``arch``'s tokenizer (Qwen-VL's for the Qwen family)."""
    return _SPECIALS.get(arch, _QWEN_SPECIALS)
