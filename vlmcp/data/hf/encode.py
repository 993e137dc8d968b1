"""One conversation -> a Hugging Face processor's inputs, with labels on the trained messages only.

The text and its trained tokens come from :func:`vlmcp.data.hf.template.render` (Note
[vlmcp data: trained tokens from the chat template]); this module adds the images and
videos: their tokens from the file headers, expanded by the processor's own code (planning;
Note [vlmcp data: the processor's own expansion]), their pixels through the processor
(training, which refuses tokens other than the planned ones), and a
:class:`~vlmcp.data.hf.schema.MediaError` naming
``file:line`` and the file when either fails.

Token counts are known before any image or video is decoded (an image's count needs only
its size, a video's its frame count, frame rate and size: Note [vlmcp data: video frames,
sizes and tokens]), so packing is planned up front; the pixels are decoded later, by the
row loader (:mod:`vlmcp.data.hf.rows`). Video pixels are vlmcp's, made without torchvision
(Note [vlmcp data: video pixels from the image processor]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmcp.data.hf.expand import Expansion, expand
from vlmcp.data.hf.image_bounds import ImageBounds
from vlmcp.data.hf.image_text import image_texts, image_token_counts
from vlmcp.data.hf.schema import Conversation, MediaError
from vlmcp.data.hf.template import Rendered, render
from vlmcp.data.hf.video import VideoPlan, VideoSampling, decode_frames, read_header, require_av, video_rules
from vlmcp.data.hf.video_processor import process, replacement_texts
from vlmcp.layout.labels import IGNORE_INDEX

__all__ = ["EncodedSample", "check_pixels", "encode_conversation", "image_sizes",
           "image_token_counts", "plan_expansion", "planned_tokens", "sample_length", "video_plans"]


def image_sizes(conv: Conversation, bounds: ImageBounds | None = None) -> list[tuple[int, int]]:
    """``(height, width)`` of each image, from the file headers (no decoding), after ``bounds``
    (``--image-max-pixels``/``--image-min-pixels``) scale it.

    Raises:
        MediaError: for an image whose header cannot be read.
    """
    sizes = []
    for media in conv.images:
        try:
            with media.open_image() as im:
                sizes.append((im.height, im.width) if bounds is None else bounds.size(im.height, im.width))
        except Exception as err:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError
            raise MediaError(conv.where, media.name, "cannot read image", err) from None
    return sizes


def video_plans(processor, conv: Conversation, sampling: VideoSampling | None = None) -> list[VideoPlan]:
    """Each video's frames, size and token count, from its header (no frame decoded).

    Raises:
        MediaError: a video whose header cannot be read, or that cannot be sampled (fewer
            frames than the model's temporal patch, an aspect ratio the model refuses).
        ValueError: naming ``file:line`` when the model's processor takes no videos vlmcp encodes.
        ModuleNotFoundError: PyAV is missing (a video file needs it; the message names the extra).
    """
    if not conv.videos:
        return []
    sampling = sampling or VideoSampling()
    try:
        rules = video_rules(processor)
        rules.check(processor, sampling)  # a flag or a processor config it cannot use: never a video's fault
    except ValueError as err:
        raise ValueError(f"{conv.where}: {len(conv.videos)} video(s): {err}") from None
    if conv.images and not rules.mixes_images_and_videos:
        raise ValueError(f"{conv.where}: {len(conv.images)} image(s) and {len(conv.videos)} video(s): "
                         f"{type(processor).__name__}'s model fills images and videos at the same "
                         "placeholder, so its forward cannot take both in one conversation; put them in "
                         "different lines")
    plans = []
    for media in conv.videos:
        if media.frames is None:
            require_av()  # a missing decoder is the install's fault, not the video's: never a skip
        try:
            header = read_header(media)
        except Exception as err:  # PyAV's and PIL's errors on a bad header
            raise MediaError(conv.where, media.name, "cannot read video", err) from None
        try:
            plans.append(rules.plan(processor, header, sampling))
        except Exception as err:
            raise MediaError(conv.where, media.name, "cannot sample video", err) from None
    return plans


def _video_texts(processor, conv: Conversation, plans: list[VideoPlan]) -> list[str]:
    """The text the processor writes for each video (its own ``replace_video_token`` on the plan),
    each checked against its plan's tokens."""
    texts = replacement_texts(processor, plans)
    placeholder = processor.image_token if not video_rules(processor).mixes_images_and_videos else \
        processor.video_token  # GLM-4.1V writes its frames with the image placeholder
    for k, (text, plan) in enumerate(zip(texts, plans, strict=True)):
        if text.count(placeholder) != plan.tokens:
            raise ValueError(f"{conv.where}: video {k} planned as {plan.tokens} tokens, but the processor "
                             f"writes {text.count(placeholder)} {placeholder}")
    return texts


def _expand(processor, conv: Conversation, rendered: Rendered, images: list[str], plans: list[VideoPlan]
            ) -> Expansion:
    """Each image and video placeholder -> the processor's text for it (``images``, the videos of
    ``plans``), put in place by the processor's own code (Note [vlmcp data: the processor's own
    expansion]); their tokens carry no loss."""
    return expand(processor, conv, rendered, images, _video_texts(processor, conv, plans) if plans else [])


def plan_expansion(processor, conv: Conversation, video: VideoSampling | None = None,
                   images: ImageBounds | None = None) -> tuple[Rendered, Expansion]:
    """``(rendered, expansion)``: ``conv`` through its chat template, and its tokens as the model will
    see them, each image and video expanded by the processor's own code; only headers are read.

    Raises:
        MediaError, ValueError: as :func:`planned_tokens`.
    """
    texts = image_texts(processor, conv, image_sizes(conv, images))
    plans = video_plans(processor, conv, video)
    rendered = render(processor, conv)
    return rendered, _expand(processor, conv, rendered, texts, plans)


def planned_tokens(processor, conv: Conversation, video: VideoSampling | None = None,
                   images: ImageBounds | None = None) -> tuple[Rendered, list[int], list[bool]]:
    """``(rendered, ids, trained)``: ``conv``'s tokens as the model will see them, each image and
    video expanded by the processor's own code, and which carry loss; only headers are read.

    Args:
        processor: the model's processor.
        conv: the conversation.
        video: how videos are sampled (default :class:`VideoSampling`'s).
        images: the pixel bounds images are scaled into (default: none).

    Raises:
        MediaError: an image's or video's header cannot be read, or the processor refuses its size.
        ValueError: naming ``file:line`` for a conversation the template cannot render, or
            videos for a model whose videos vlmcp does not encode.
    """
    rendered, expansion = plan_expansion(processor, conv, video, images)
    return rendered, expansion.ids, expansion.trained


def sample_length(processor, conv: Conversation, video: VideoSampling | None = None,
                  images: ImageBounds | None = None) -> int:
    """Tokens of ``conv`` after the processor expands its images and videos (headers only).

    Raises:
        MediaError, ValueError: as :func:`planned_tokens`.
    """
    return len(planned_tokens(processor, conv, video, images)[1])


def _decode_videos(processor, conv: Conversation, plans: list[VideoPlan]) -> list[tuple[dict, VideoPlan]]:
    """Each video's model inputs and plan: one video's planned frames decoded at a time, turned into
    its pixels and dropped (a row never holds more than one video's frames)."""
    rules = video_rules(processor) if plans else None
    out = []
    for media, plan in zip(conv.videos, plans, strict=True):
        try:
            frames = decode_frames(media, plan, rules.resample(processor))
        except Exception as err:  # a truncated file: header fine, frames not
            raise MediaError(conv.where, media.name, "cannot decode video", err) from None
        out.append((rules.pixels(processor, frames, plan), plan))
        del frames
    return out


def check_pixels(conv: Conversation, processor=None, video: VideoSampling | None = None) -> None:
    """Decode every image and video of ``conv`` (``--strict`` does this before training).

    Args:
        conv: the conversation.
        processor: the model's processor (needed when ``conv`` has videos: it sizes the frames).
        video: how videos are sampled.

    Raises:
        MediaError: for the first image or video whose pixels cannot be decoded.
    """
    for media in conv.images:
        try:
            with media.open_image() as im:
                im.load()
        except Exception as err:
            raise MediaError(conv.where, media.name, "cannot decode image", err) from None
    if conv.videos:
        if processor is None:
            raise ValueError("check_pixels: a conversation with videos needs the processor")
        _decode_videos(processor, conv, video_plans(processor, conv, video))


@dataclass(frozen=True, eq=False)
class EncodedSample:
    """One conversation as model inputs.

    Attributes:
        input_ids: ``LongTensor[n]``.
        labels: ``LongTensor[n]``, unshifted (HF convention): the token itself on trained
            tokens, ``-100`` elsewhere.
        pixels: the processor's image and video outputs (``pixel_values``, ``image_grid_thw``,
            ``pixel_values_videos``, ``video_grid_thw``, ``second_per_grid_ts``, ...); empty
            without images or videos.
        mm_token_type_ids: ``LongTensor[n]`` (1 on image tokens, 2 on video tokens) when the
            processor makes them (Qwen2-VL), else None.
        token_type_ids: ``LongTensor[n]``, 1 on image tokens, when the processor makes them
            (Gemma 3, whose model reads them), else None.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    pixels: dict[str, torch.Tensor]
    mm_token_type_ids: torch.Tensor | None
    token_type_ids: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.numel()


def _first_difference(tokenizer, planned: list[int], got: list[int]) -> str:
    """Where two token lists first differ, for one line, three tokens decoded from there: ``120 planned,
    118 from the processor; first difference at token 3: planned '<|vision_start|><0.3 seconds>',
    the processor's '<0.3 seconds><|vision_start|>'``."""
    k = next((i for i, (a, b) in enumerate(zip(planned, got, strict=False)) if a != b),
             min(len(planned), len(got)))
    show = lambda ids: repr(tokenizer.decode(ids[k:k + 3])) if k < len(ids) else "the end"
    return (f"{len(planned)} planned, {len(got)} from the processor; first difference at token {k}: planned "
            f"{show(planned)}, the processor's {show(got)}")


def encode_conversation(processor, conv: Conversation, video: VideoSampling | None = None,
                        bounds: ImageBounds | None = None) -> EncodedSample:
    """Decode ``conv``'s images and videos and run the processor; labels on the trained messages only.

    Args:
        processor: the model's processor.
        conv: the conversation.
        video: how videos are sampled (as planning sampled them; default :class:`VideoSampling`'s).
        bounds: the pixel bounds each image is scaled into before the processor (as planning).

    Raises:
        MediaError: naming ``file:line`` and the image or video when it cannot be decoded or
            the processor fails on it.
        ValueError: naming the line when the processor's tokens differ from the planned ones
            (Note [vlmcp data: the processor's own expansion]).
    """
    images = []
    for media in conv.images:
        try:
            with media.open_image() as im:
                image = im.convert("RGB")
            images.append(image if bounds is None else bounds.apply(image))
        except Exception as err:  # a truncated file: header fine, pixels not
            raise MediaError(conv.where, media.name, "cannot decode image", err) from None
    texts = image_texts(processor, conv, [(im.height, im.width) for im in images])
    plans = video_plans(processor, conv, video)
    rendered = render(processor, conv)
    expansion = _expand(processor, conv, rendered, texts, plans)
    videos = _decode_videos(processor, conv, plans)
    try:
        out = process(processor, rendered.text, images, videos)
    except Exception as err:
        if not conv.images and not conv.videos:
            raise ValueError(f"{conv.where}: the processor failed: {type(err).__name__}: {err}") from None
        names = ", ".join(m.name for m in conv.images + conv.videos)
        what = " and ".join(w for w, media in (("image(s)", conv.images), ("video(s)", conv.videos)) if media)
        raise MediaError(conv.where, names, f"the processor fails on {what}", err) from None
    if out["input_ids"][0].tolist() != expansion.ids:
        where = _first_difference(processor.tokenizer, expansion.ids, out["input_ids"][0].tolist())
        raise ValueError(f"{conv.where}: the processor's tokens differ from the planned ones ({where}); "
                         "cannot place the labels")
    input_ids = out["input_ids"][0]
    labels = torch.where(torch.tensor(expansion.trained), input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    per_token = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")
    pixels = {k: v for k, v in out.items() if k not in per_token}
    mm = out["mm_token_type_ids"][0] if "mm_token_type_ids" in out else None
    types = out["token_type_ids"][0] if "token_type_ids" in out else None
    return EncodedSample(input_ids=input_ids, labels=labels, pixels=pixels, mm_token_type_ids=mm,
                         token_type_ids=types)
