"""``vlmcp init-model --arch smolvlm``: SmolVLM's tokens, chat template and processor, built offline.

The tokenizer has SmolVLM's special tokens as single ids (``<|im_start|>``, ``<end_of_utterance>``,
``<fake_token_around_image>``, ``<global-img>``, ``<image>``, ``<row_i_col_j>`` up to
:data:`MAX_GRID`); the chat template is the hub's (``<|im_start|>User:<image>...<end_of_utterance>``,
``Assistant: ...``). The processor (``SmolVLMProcessor``, no video part) resizes each image so its
longest edge is :data:`LONGEST_EDGE` and splits it into :data:`~vlmcp.debug.tiny.anyres.SIDE`-pixel
crops (up to :data:`MAX_GRID` x :data:`MAX_GRID`; small images are scaled up first, so every image
is split) plus the image scaled to one crop (the global image). Each crop is
:data:`IMAGE_SEQ_LEN` ``<image>`` tokens: ``<fake_token_around_image><row_i_col_j>`` + tokens per crop,
``"\\n"`` after each row, then ``"\\n<fake_token_around_image><global-img>"`` + tokens +
``<fake_token_around_image>`` (the newlines are text and merge with each other). The model is
:func:`vlmcp.debug.tiny.tiny_config`'s SmolVLM: 8x8 tiles of 2x2-pixel patches, pixel-shuffled 2x2.
"""

from __future__ import annotations

__all__ = ["CHAT_TEMPLATE", "IMAGE_SEQ_LEN", "LONGEST_EDGE", "MAX_GRID", "SPECIALS", "config", "processor",
           "tokenizer"]

MAX_GRID = 3
"""Crops per side at most."""
IMAGE_SEQ_LEN = 4
"""``<image>`` tokens per crop (and for the global image): 4x4 patches pixel-shuffled 2x2."""
LONGEST_EDGE = 24
"""Images are resized to this longest edge before splitting (:data:`MAX_GRID` crops of 8 pixels)."""

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>",
            "<global-img>", "<image>", "<video>",
            *(f"<row_{r}_col_{c}>" for r in range(1, MAX_GRID + 1) for c in range(1, MAX_GRID + 1)))
"""SmolVLM's special tokens (single ids)."""
CORPUS = ["User: Describe the image.", "Assistant: a red circle", "\n\n", "\n"] * 20
"""Extra BPE training text: the turn prefixes, and ``\\n\\n`` (the newline after a crop row and the one
before the global image merge, as in SmolVLM's own vocabulary)."""

CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'] is string %}{{': ' + message['content']}}{% else %}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% elif line['type'] == 'video' %}{{ '<video>' }}"
    "{% endif %}{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
"""SmolVLM's chat template as on the hub (transformers' ``DEFAULT_CHAT_TEMPLATE``)."""


def tokenizer(tok):
    """The transformers tokenizer around the trained BPE ``tok`` (SmolVLM's named tokens)."""
    from transformers import TokenizersBackend

    named = {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
             "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>",
             "video_token": "<video>"}
    return TokenizersBackend(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<end_of_utterance>",
                             pad_token="<|endoftext|>", extra_special_tokens=named)


def processor(tok):
    """``SmolVLMProcessor`` (no video part: ``build_without_video``)."""
    import transformers
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    from vlmcp.data.hf.processor import build_without_video
    from vlmcp.debug.tiny.anyres import SIDE

    images = SmolVLMImageProcessorPil(size={"longest_edge": LONGEST_EDGE},
                                      max_image_size={"longest_edge": SIDE}, do_image_splitting=True)
    return build_without_video(transformers.SmolVLMProcessor, tok, images, CHAT_TEMPLATE,
                               image_seq_len=IMAGE_SEQ_LEN)


def config(tok, text: dict):
    """:func:`vlmcp.debug.tiny.tiny_config`'s SmolVLM with ``tok``'s ids."""
    from vlmcp.debug.tiny import tiny_config

    text = {**text, "bos_token_id": tok.bos_token_id}
    return tiny_config("smolvlm", text_config=text, image_token_id=tok.convert_tokens_to_ids("<image>"))
