"""One conversation -> a Hugging Face processor's inputs, with labels on the trained messages only.

The text and its trained tokens come from :func:`vlmcp.data.hf.template.render` (Note
[vlmcp data: trained tokens from the chat template]); this module adds the images: their
token counts from the file headers (planning), their pixels through the processor
(training), and :class:`MediaError` naming ``file:line`` and the image when either fails.

Token counts are known before any image is decoded (an image's count needs only its
size, read from the file header), so packing is planned up front; the pixels are
decoded later, by the row loader (:mod:`vlmcp.data.hf.rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmcp.data.hf.conversation import Conversation
from vlmcp.data.hf.template import Rendered, render
from vlmcp.layout.labels import IGNORE_INDEX

__all__ = ["EncodedSample", "MediaError", "check_pixels", "encode_conversation", "image_sizes",
           "image_token_counts", "planned_tokens", "sample_length"]


class MediaError(ValueError):
    """An image of a conversation cannot be used: its header, its pixels or the processor.

    The message names ``file:line`` and the image. Planning skips such a conversation (an
    error with ``--strict``); training skips it on every rank of the CP group.

    Attributes:
        where: ``file:line``.
        name: the image (its path, or ``<N inline bytes>``).
        reason: the message without ``file:line``: ``cannot decode image a.jpg: OSError: ...``.
    """

    def __init__(self, where: str, name: str, what: str, err: Exception) -> None:
        self.where, self.name = where, name
        self.reason = f"{what} {name}: {type(err).__name__}: {err}"
        super().__init__(f"{where}: {self.reason}")


def image_sizes(conv: Conversation) -> list[tuple[int, int]]:
    """``(height, width)`` of each image, from the file headers (no decoding).

    Raises:
        MediaError: for an image whose header cannot be read.
    """
    sizes = []
    for media in conv.images:
        try:
            with media.open_image() as im:
                sizes.append((im.height, im.width))
        except Exception as err:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError
            raise MediaError(conv.where, media.name, "cannot read image", err) from None
    return sizes


def image_token_counts(processor, conv: Conversation, sizes: list[tuple[int, int]]) -> list[int]:
    """Tokens of each image of ``conv`` at the given sizes (the processor's rule, no pixels).

    Raises:
        MediaError: when the processor refuses an image's size (e.g. Qwen's aspect ratio > 200).
    """
    counts = []
    for media, size in zip(conv.images, sizes, strict=True):
        try:
            counts.append(int(processor._get_num_multimodal_tokens(image_sizes=[size]).num_image_tokens[0]))
        except Exception as err:  # the processor's own checks (smart_resize, ...)
            raise MediaError(conv.where, media.name, "the processor refuses image", err) from None
    return counts


def _expand(processor, conv: Conversation, rendered: Rendered, counts: list[int]
            ) -> tuple[list[int], list[bool]]:
    """Each image token -> the image's count of them; their labels off: ``(ids, trained)``."""
    image_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    ids, mask, k = [], [], 0
    for token, trained in zip(rendered.ids, rendered.trained, strict=True):
        if token == image_id:
            if k == len(counts):
                raise ValueError(f"{conv.where}: the chat template wrote more image placeholders "
                                 f"than the {len(counts)} image(s)")
            ids += [token] * counts[k]
            mask += [False] * counts[k]
            k += 1
        else:
            ids.append(token)
            mask.append(trained)
    if k != len(counts):
        raise ValueError(f"{conv.where}: the chat template wrote {k} image placeholder(s) for "
                         f"{len(counts)} image(s)")
    return ids, mask


def planned_tokens(processor, conv: Conversation) -> tuple[Rendered, list[int], list[bool]]:
    """``(rendered, ids, trained)``: ``conv``'s tokens as the model will see them, each image
    expanded to its token count, and which carry loss; only image headers are read.

    Raises:
        MediaError: an image's header cannot be read, or the processor refuses its size.
        ValueError: naming ``file:line`` for a conversation the template cannot render.
    """
    counts = image_token_counts(processor, conv, image_sizes(conv))
    rendered = render(processor, conv)
    return (rendered, *_expand(processor, conv, rendered, counts))


def sample_length(processor, conv: Conversation) -> int:
    """Tokens of ``conv`` after the processor expands its images (only image headers are read).

    Raises:
        MediaError, ValueError: as :func:`planned_tokens`.
    """
    return len(planned_tokens(processor, conv)[1])


def check_pixels(conv: Conversation) -> None:
    """Decode every image of ``conv`` (``--strict`` does this before training).

    Raises:
        MediaError: for the first image whose pixels cannot be decoded.
    """
    for media in conv.images:
        try:
            with media.open_image() as im:
                im.load()
        except Exception as err:
            raise MediaError(conv.where, media.name, "cannot decode image", err) from None


@dataclass(frozen=True, eq=False)
class EncodedSample:
    """One conversation as model inputs.

    Attributes:
        input_ids: ``LongTensor[n]``.
        labels: ``LongTensor[n]``, unshifted (HF convention): the token itself on trained
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
    """Decode ``conv``'s images and run the processor; labels on the trained messages only.

    Raises:
        MediaError: naming ``file:line`` and the image when it cannot be decoded or the
            processor fails on it.
        ValueError: naming the line when the processor's tokens differ from the tokenizer's
            (see Note [vlmcp data: trained tokens from the chat template]).
    """
    images = []
    for media in conv.images:
        try:
            with media.open_image() as im:
                images.append(im.convert("RGB"))
        except Exception as err:  # a truncated file: header fine, pixels not
            raise MediaError(conv.where, media.name, "cannot decode image", err) from None
    counts = image_token_counts(processor, conv, [(im.height, im.width) for im in images])
    rendered = render(processor, conv)
    ids, mask = _expand(processor, conv, rendered, counts)
    try:
        out = processor(text=[rendered.text], images=images or None, return_tensors="pt")
    except Exception as err:
        if not conv.images:
            raise ValueError(f"{conv.where}: the processor failed: {type(err).__name__}: {err}") from None
        names = ", ".join(m.name for m in conv.images)
        raise MediaError(conv.where, names, "the processor fails on image(s)", err) from None
    if out["input_ids"][0].tolist() != ids:
        raise ValueError(f"{conv.where}: the processor's tokens differ from the tokenizer's on the "
                         "same text; cannot place the labels")
    input_ids = out["input_ids"][0]
    labels = torch.where(torch.tensor(mask), input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    pixels = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
    mm = out["mm_token_type_ids"][0] if "mm_token_type_ids" in out else None
    return EncodedSample(input_ids=input_ids, labels=labels, pixels=pixels, mm_token_type_ids=mm)
