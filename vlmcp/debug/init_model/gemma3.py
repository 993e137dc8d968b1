"""``vlmcp init-model --arch gemma3``: Gemma 3's tokens, chat template and processor, built offline.

The tokenizer has Gemma 3's special tokens as single ids (``<bos>``, ``<eos>``, ``<pad>``,
``<start_of_turn>``, ``<end_of_turn>``, ``<start_of_image>``, ``<end_of_image>``,
``<image_soft_token>``); the chat template is the hub's (system text folded into the first
user turn, the assistant's role written ``model``, each image ``<start_of_image>``). The
processor (``Gemma3Processor``, no video part) resizes every image to
:data:`IMAGE_SIZE` square and replaces each ``<start_of_image>`` with its
``full_image_sequence``: ``"\\n\\n<start_of_image>"``, :data:`IMAGE_TOKENS`
``<image_soft_token>``, ``"<end_of_image>\\n\\n"`` (the newlines are text, and merge with the
text around them); ``token_type_ids`` is 1 at the soft tokens. The model is
:func:`vlmcp.debug.tiny.tiny_config`'s Gemma 3 on 8-pixel patches: a 4x4 patch grid pooled to
2x2 = :data:`IMAGE_TOKENS` tokens per image.
"""

from __future__ import annotations

__all__ = ["CHAT_TEMPLATE", "IMAGE_SIZE", "IMAGE_TOKENS", "SPECIALS", "config", "processor", "tokenizer"]

SPECIALS = ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
            "<end_of_image>", "<image_soft_token>")
"""Gemma 3's special tokens (single ids)."""
IMAGE_SIZE = 32
"""Every image is resized to this square (SigLIP's fixed input)."""
IMAGE_TOKENS = 4
"""LLM tokens per image (``mm_tokens_per_image``)."""
PATCH_SIZE = 8
CORPUS = ["user\n\n\n", "\n\nDescribe the image.", "model\n", "\n\n\n\n"] * 20
"""Extra BPE training text: runs of newlines become merged tokens, as in Gemma's own vocabulary, so the
``\\n\\n`` around each image merges with the newline before it (the data path must expand images in
the text, not token by token)."""

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}{%- endfor -%}"
    "{%- else -%}{{ raise_exception('Invalid content type') }}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}")
"""Gemma 3's chat template as on the hub (images and text)."""


def tokenizer(tok):
    """The transformers tokenizer around the trained BPE ``tok`` (Gemma 3's named tokens)."""
    from transformers import TokenizersBackend

    return TokenizersBackend(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                             extra_special_tokens={"image_token": "<image_soft_token>",
                                                   "boi_token": "<start_of_image>",
                                                   "eoi_token": "<end_of_image>"})


def processor(tok):
    """``Gemma3Processor``: :data:`IMAGE_SIZE` square images, :data:`IMAGE_TOKENS` tokens each."""
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    images = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return Gemma3Processor(image_processor=images, tokenizer=tok, chat_template=CHAT_TEMPLATE,
                           image_seq_length=IMAGE_TOKENS)


def config(tok, text: dict):
    """:func:`vlmcp.debug.tiny.tiny_config`'s Gemma 3 with ``tok``'s ids, on 8-pixel patches."""
    from vlmcp.debug.tiny import tiny_config

    ids = tok.convert_tokens_to_ids
    text = {**text, "bos_token_id": tok.bos_token_id,
            "eos_token_id": [tok.eos_token_id, ids("<end_of_turn>")]}
    return tiny_config("gemma3", text_config=text,
                       vision_config=dict(image_size=IMAGE_SIZE, patch_size=PATCH_SIZE),
                       image_token_index=ids("<image_soft_token>"), boi_token_index=ids("<start_of_image>"),
                       eoi_token_index=ids("<end_of_image>"), mm_tokens_per_image=IMAGE_TOKENS)
