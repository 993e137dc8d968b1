"""One conversation -> a Hugging Face processor's inputs, with labels on assistant tokens only.

Note [vlmcp data: assistant tokens from the chat template]
----------------------------------------------------------
The loss covers what the assistant says. Chat templates do not mark it (the hub's
Qwen2-VL and LLaVA templates have no ``{% generation %}`` tags), so the spans come from
rendering prefixes, which works for any template that renders a conversation
left to right::

    render(messages[:i], add_generation_prompt=True)  = P      "...<|im_start|>assistant\\n"
    render(messages[:i + 1])                          = P + A  "...assistant\\na red circle<|im_end|>\\n"
    render(messages)                                  starts with P + A

so message i's characters are ``[len(P), len(P + A))`` of the full text (its end-of-turn
token included: a model must learn to stop). The text is tokenized once with offsets; a
token is a target when its first character lies in a span. Each image placeholder
token is then expanded to the image's token count, which must reproduce the processor's
own ``input_ids`` exactly (checked), so the labels line up with what the model sees.
Template or tokenizer behaviour that breaks either property is an error naming the line.

Token counts are known before any image is decoded (an image's count needs only its
size, read from the file header), so packing is planned up front; the pixels are
decoded later, by the row loader (:mod:`vlmcp.data.hf.rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmcp.data.hf.conversations import IMAGE_PLACEHOLDER, Conversation
from vlmcp.layout.labels import IGNORE_INDEX

__all__ = ["EncodedSample", "encode_conversation", "image_sizes", "sample_length"]


def _structured(messages) -> list[dict]:
    """String contents with ``<image>`` -> the processor's ``[{"type": "image"}, {"type": "text"}]``."""
    out = []
    for m in messages:
        parts = []
        for k, text in enumerate(m.content.split(IMAGE_PLACEHOLDER)):
            if k:
                parts.append({"type": "image"})
            if text:
                parts.append({"type": "text", "text": text})
        out.append({"role": m.role, "content": parts})
    return out


def _render(processor, conv: Conversation) -> tuple[str, list[tuple[int, int]]]:
    """The conversation's text and its assistant character spans (see the Note)."""
    messages = _structured(conv.messages)
    render = lambda msgs, prompt: processor.apply_chat_template(msgs, tokenize=False,
                                                                add_generation_prompt=prompt)
    full = render(messages, False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt, turn = render(messages[:i], True), render(messages[:i + 1], False)
        if not (turn.startswith(prompt) and full.startswith(turn)):
            raise ValueError(f"{conv.where}: the chat template does not render this conversation "
                             "left to right, so its assistant turns cannot be found")
        spans.append((len(prompt), len(turn)))
    return full, spans


def image_sizes(conv: Conversation) -> list[tuple[int, int]]:
    """``(height, width)`` of each image, from the file headers (no decoding)."""
    sizes = []
    for media in conv.images:
        try:
            with media.open_image() as im:
                sizes.append((im.height, im.width))
        except (OSError, SyntaxError) as err:
            raise ValueError(f"{conv.where}: cannot read image {media.name}: {err}") from None
    return sizes


def _image_token_counts(processor, sizes: list[tuple[int, int]]) -> list[int]:
    if not sizes:
        return []
    return [int(n) for n in processor._get_num_multimodal_tokens(image_sizes=sizes).num_image_tokens]


def _tokens(processor, conv: Conversation, counts: list[int]) -> tuple[str, list[int], list[bool]]:
    """The rendered text, its expanded token ids and their target mask (no pixel touched)."""
    text, spans = _render(processor, conv)
    enc = processor.tokenizer(text, return_offsets_mapping=True)
    image_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    ids, mask, k = [], [], 0
    for token, (start, _) in zip(enc["input_ids"], enc["offset_mapping"], strict=True):
        if token == image_id:
            if k == len(counts):
                raise ValueError(f"{conv.where}: the chat template wrote more image placeholders "
                                 f"than the {len(counts)} image(s)")
            ids += [token] * counts[k]
            mask += [False] * counts[k]
            k += 1
        else:
            ids.append(token)
            mask.append(any(s <= start < e for s, e in spans))
    if k != len(counts):
        raise ValueError(f"{conv.where}: the chat template wrote {k} image placeholder(s) for "
                         f"{len(counts)} image(s)")
    return text, ids, mask


def sample_length(processor, conv: Conversation) -> int:
    """Tokens of ``conv`` after the processor expands its images (no image is decoded)."""
    return len(_tokens(processor, conv, _image_token_counts(processor, image_sizes(conv)))[1])


@dataclass(frozen=True, eq=False)
class EncodedSample:
    """One conversation as model inputs.

    Attributes:
        input_ids: ``LongTensor[n]``.
        labels: ``LongTensor[n]``, unshifted (HF convention): the token itself on assistant
            tokens, ``-100`` elsewhere.
        pixels: the processor's image outputs (``pixel_values``, ``image_grid_thw``, ...);
            empty without images.
        mm_token_type_ids: ``LongTensor[n]`` (1 on image tokens) when the processor makes
            them (Qwen2-VL), else None.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    pixels: dict[str, torch.Tensor]
    mm_token_type_ids: torch.Tensor | None

    def __len__(self) -> int:
        return self.input_ids.numel()


def encode_conversation(processor, conv: Conversation) -> EncodedSample:
    """Decode ``conv``'s images and run the processor; labels on assistant tokens only.

    Raises:
        ValueError: naming the line when an image cannot be decoded or the processor's
            tokens differ from the tokenizer's (see Note [vlmcp data: assistant tokens
            from the chat template]).
    """
    images = []
    for media in conv.images:
        try:
            with media.open_image() as im:
                images.append(im.convert("RGB"))
        except (OSError, SyntaxError) as err:
            raise ValueError(f"{conv.where}: cannot decode image {media.name}: {err}") from None
    counts = _image_token_counts(processor, [(im.height, im.width) for im in images])
    text, ids, mask = _tokens(processor, conv, counts)
    out = processor(text=[text], images=images or None, return_tensors="pt")
    if out["input_ids"][0].tolist() != ids:
        raise ValueError(f"{conv.where}: the processor's tokens differ from the tokenizer's on the "
                         "same text; cannot place the labels")
    input_ids = out["input_ids"][0]
    labels = torch.where(torch.tensor(mask), input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    pixels = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
    mm = out["mm_token_type_ids"][0] if "mm_token_type_ids" in out else None
    return EncodedSample(input_ids=input_ids, labels=labels, pixels=pixels, mm_token_type_ids=mm)
