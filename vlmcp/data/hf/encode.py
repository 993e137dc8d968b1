"""One conversation -> a Hugging Face processor's inputs, with labels on the trained messages only.

The text and its trained tokens come from :func:`vlmcp.data.hf.template.render` (Note
[vlmcp data: trained tokens from the chat template]); this module adds the images and
videos: their token counts from the file headers (planning), their pixels through the
processor (training), and :class:`MediaError` naming ``file:line`` and the file when either
fails.

Token counts are known before any image or video is decoded (an image's count needs only
its size, a video's its frame count, frame rate and size: Note [vlmcp data: video frames,
sizes and tokens]), so packing is planned up front; the pixels are decoded later, by the
row loader (:mod:`vlmcp.data.hf.rows`). Video pixels are vlmcp's, made without torchvision
(Note [vlmcp data: video pixels from the image processor]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmcp.data.hf.image_bounds import ImageBounds
from vlmcp.data.hf.schema import Conversation
from vlmcp.data.hf.template import Rendered, render
from vlmcp.data.hf.video import VideoPlan, VideoSampling, decode_frames, read_header, require_av, video_rules
from vlmcp.data.hf.video_processor import process, replacement_texts
from vlmcp.layout.labels import IGNORE_INDEX

__all__ = ["EncodedSample", "MediaError", "check_pixels", "encode_conversation", "image_sizes",
           "image_token_counts", "planned_tokens", "sample_length", "video_plans"]


class MediaError(ValueError):
    """An image or video of a conversation cannot be used: its header, its pixels or the processor.

    The message names ``file:line`` and the file. Planning skips such a conversation (an
    error with ``--strict``); training skips it on every rank of the CP group.

    Attributes:
        where: ``file:line``.
        name: the image or video (its path, ``<N inline bytes>`` or ``<N frames: ...>``).
        reason: the message without ``file:line``: ``cannot decode image a.jpg: OSError: ...``.
    """

    def __init__(self, where: str, name: str, what: str, err: Exception) -> None:
        self.where, self.name = where, name
        self.reason = f"{what} {name}: {type(err).__name__}: {err}"
        super().__init__(f"{where}: {self.reason}")


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


def image_token_counts(processor, conv: Conversation, sizes: list[tuple[int, int]]) -> list[int]:
    """Tokens of each image of ``conv`` at the given sizes (the processor's rule, no pixels).

    Raises:
        MediaError: when the processor refuses an image's size (e.g. Qwen's aspect ratio > 200).
    """
    counts = []
    for media, size in zip(conv.images, sizes, strict=True):
        try:
            if type(processor).__name__ == "SmolVLMProcessor":  # no _get_num_multimodal_tokens: its text's
                counts.append(_smolvlm_text(processor, size).count(processor.image_token))
                continue
            counts.append(_image_token_count(processor, size))
        except Exception as err:  # the processor's own checks (smart_resize, ...)
            raise MediaError(conv.where, media.name, "the processor refuses image", err) from None
    if len(counts) > 1 and type(processor).__name__ == "LlavaOnevisionProcessor":
        # each image of a multi-image sample is its base tile and one newline
        # (LlavaOnevisionProcessor.replace_image_token; _get_num_multimodal_tokens counts it tiled)
        one = processor.num_image_tokens + 1 - (processor.vision_feature_select_strategy == "default")
        counts = [one] * len(counts)
    return counts


def _image_token_count(processor, size: tuple[int, int]) -> int:
    """The tokens one image of ``size`` becomes: the processor's count, or, for a processor that writes
    ``<img>`` and ``</img>`` around the image's tokens (InternVL), the tokens of its own
    ``replace_image_token`` text for the image's tiles (transformers 5.24 counted the two markers in
    ``num_image_tokens``, 5.25 does not: the text is the same in both)."""
    data = processor._get_num_multimodal_tokens(image_sizes=[size])
    if getattr(processor, "start_image_token_id", None) is None:
        return int(data.num_image_tokens[0])
    text = processor.replace_image_token({"num_patches": [int(data.num_image_patches[0])]}, 0)
    return len(processor.tokenizer(text, add_special_tokens=False)["input_ids"])


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


def _run(processor, what: str, token: int, n: int) -> list[int]:
    """The ``n`` tokens an image (video) placeholder becomes: ``n`` copies of it, or InternVL's
    ``<img>`` + ``n - 2`` ``<IMG_CONTEXT>`` + ``</img>`` (its counts hold the two)."""
    start = getattr(processor, "start_image_token_id", None)
    end = getattr(processor, "end_image_token_id", None)
    if what == "image" and start is not None and end is not None:
        return [start] + [token] * (n - 2) + [end]
    return [token] * n


def _smolvlm_text(processor, size: tuple[int, int]) -> str:
    """The text SmolVLM's processor writes for an image of ``size`` (``(height, width)``): its crops'
    ``<fake_token_around_image><row_i_col_j>`` + ``image_seq_len`` ``<image>``, ``"\\n"`` after each
    row, then ``"\\n"`` and the global image (the global image alone when the image is not split)."""
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    _, rows, cols = processor.image_processor.get_number_of_image_patches(*size)
    return get_image_prompt_string(rows, cols, processor.image_seq_len, processor.fake_image_token,
                                   processor.image_token, processor.global_image_token)


def _image_texts(processor, sizes: list[tuple[int, int]]) -> list[str] | None:
    """The text the processor writes for each image placeholder when it is more than a run of
    tokens, else None: Gemma 3's ``full_image_sequence`` (``"\\n\\n<start_of_image>"``, the image
    tokens, ``"<end_of_image>\\n\\n"``, whose newlines tokenize with the text around them), or
    SmolVLM's rows of crops and global image (:func:`_smolvlm_text`; it depends on the size)."""
    if type(processor).__name__ == "SmolVLMProcessor":
        return [_smolvlm_text(processor, size) for size in sizes]
    sequence = getattr(processor, "full_image_sequence", None)
    return [sequence] * len(sizes) if isinstance(sequence, str) else None


def _expand_text(processor, conv: Conversation, rendered: Rendered, items: dict[int, tuple[str, list[str]]]
                 ) -> tuple[list[int], list[bool]]:
    """:func:`_expand` where each placeholder becomes text: ``items`` maps a placeholder token to its
    kind (``"image"``, ``"video"``) and the text of each of its items, in order. The expanded text
    is tokenized as the processor tokenizes it; a token is trained where its first character came
    from a trained token of ``rendered``."""
    spans = [(off, t) for t, off in zip(rendered.ids, rendered.offsets, strict=True) if t in items]
    for token, (what, texts) in items.items():
        n = sum(t == token for _, t in spans)
        if n != len(texts):
            raise ValueError(f"{conv.where}: the chat template wrote {n} {what} placeholder(s) for "
                             f"{len(texts)} {what}(s)" + (_VIDEO_HINT if what == "video" else ""))
    trained_char = [False] * len(rendered.text)
    for (s, e), trained in zip(rendered.offsets, rendered.trained, strict=True):
        trained_char[s:e] = [trained] * (e - s)
    text, origin, cursor, seen = [], [], 0, dict.fromkeys(items, 0)
    for (s, e), token in spans:
        sequence = items[token][1][seen[token]]
        seen[token] += 1
        text += [rendered.text[cursor:s], sequence]
        origin += [*range(cursor, s), *[-1] * len(sequence)]
        cursor = e
    text.append(rendered.text[cursor:])
    origin += range(cursor, len(rendered.text))
    enc = processor.tokenizer("".join(text), return_offsets_mapping=True)
    trained = [s < len(origin) and origin[s] >= 0 and trained_char[origin[s]]
               for s, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), trained


_VIDEO_HINT = ("; this model's chat template does not render video parts (the hub's Qwen2-VL template writes "
               "<|vision_start|><|video_pad|><|vision_end|> for each)")


def _video_texts(processor, conv: Conversation, plans: list[VideoPlan]) -> list[str] | None:
    """The text the processor writes for each video when one is more than a run of its placeholder
    (Qwen3-VL's timestamps, GLM-4.1V's frames), else None; each checked against its plan's tokens."""
    texts = replacement_texts(processor, plans)
    token = processor.video_token
    if all(text == token * plan.tokens for text, plan in zip(texts, plans, strict=True)):
        return None
    placeholder = processor.image_token if not video_rules(processor).mixes_images_and_videos else token
    for k, (text, plan) in enumerate(zip(texts, plans, strict=True)):
        if text.count(placeholder) != plan.tokens:
            raise ValueError(f"{conv.where}: video {k} planned as {plan.tokens} tokens, but the processor "
                             f"writes {text.count(placeholder)} {placeholder}")
    return texts


def _expand(processor, conv: Conversation, rendered: Rendered, counts: list[int], plans: list[VideoPlan],
            sizes: list[tuple[int, int]]) -> tuple[list[int], list[bool]]:
    """Each image (video) token -> the tokens the processor writes for the image (video): the image's
    count of them (images of ``sizes``) or its text, the video's plan; their labels off:
    ``(ids, trained)``."""
    tokenizer = processor.tokenizer
    image_token = tokenizer.convert_tokens_to_ids(processor.image_token)
    sequences = _image_texts(processor, sizes)
    videos = _video_texts(processor, conv, plans) if plans else None
    if sequences is not None or videos is not None:
        if sequences is not None:
            soft = getattr(tokenizer, "image_token", None) or processor.image_token  # Gemma 3: its soft token
            per_image = [sequence.count(soft) for sequence in sequences]
            if counts != per_image:
                raise ValueError(f"{conv.where}: images of {counts} tokens, but the processor writes "
                                 f"{per_image}")
        if plans and sequences is not None:
            raise ValueError(f"{conv.where}: videos with {type(processor).__name__}'s images are not encoded")
        items = {image_token: ("image", sequences or [processor.image_token * n for n in counts])}
        if plans:
            items[tokenizer.convert_tokens_to_ids(processor.video_token)] = (
                "video", videos or [processor.video_token * p.tokens for p in plans])
        return _expand_text(processor, conv, rendered, items)
    runs = {image_token: ("image", counts)}
    if plans:
        runs[tokenizer.convert_tokens_to_ids(processor.video_token)] = ("video", [p.tokens for p in plans])
    ids, mask, seen = [], [], dict.fromkeys(runs, 0)
    for token, trained in zip(rendered.ids, rendered.trained, strict=True):
        if token in runs:
            what, n = runs[token]
            if seen[token] == len(n):
                raise ValueError(f"{conv.where}: the chat template wrote more {what} placeholders "
                                 f"than the {len(n)} {what}(s)")
            ids += _run(processor, what, token, n[seen[token]])
            mask += [False] * n[seen[token]]
            seen[token] += 1
        else:
            ids.append(token)
            mask.append(trained)
    for token, (what, n) in runs.items():
        if seen[token] != len(n):
            raise ValueError(f"{conv.where}: the chat template wrote {seen[token]} {what} placeholder(s) for "
                             f"{len(n)} {what}(s)" + (_VIDEO_HINT if what == "video" else ""))
    return ids, mask


def planned_tokens(processor, conv: Conversation, video: VideoSampling | None = None,
                   images: ImageBounds | None = None) -> tuple[Rendered, list[int], list[bool]]:
    """``(rendered, ids, trained)``: ``conv``'s tokens as the model will see them, each image and
    video expanded to its token count, and which carry loss; only headers are read.

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
    sizes = image_sizes(conv, images)
    counts = image_token_counts(processor, conv, sizes)
    plans = video_plans(processor, conv, video)
    rendered = render(processor, conv)
    return (rendered, *_expand(processor, conv, rendered, counts, plans, sizes))


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
        ValueError: naming the line when the processor's tokens differ from the tokenizer's
            (see Note [vlmcp data: trained tokens from the chat template]).
    """
    images = []
    for media in conv.images:
        try:
            with media.open_image() as im:
                image = im.convert("RGB")
            images.append(image if bounds is None else bounds.apply(image))
        except Exception as err:  # a truncated file: header fine, pixels not
            raise MediaError(conv.where, media.name, "cannot decode image", err) from None
    sizes = [(im.height, im.width) for im in images]
    counts = image_token_counts(processor, conv, sizes)
    plans = video_plans(processor, conv, video)
    rendered = render(processor, conv)
    ids, mask = _expand(processor, conv, rendered, counts, plans, sizes)
    videos = _decode_videos(processor, conv, plans)
    try:
        out = process(processor, rendered.text, images, videos)
    except Exception as err:
        if not conv.images and not conv.videos:
            raise ValueError(f"{conv.where}: the processor failed: {type(err).__name__}: {err}") from None
        names = ", ".join(m.name for m in conv.images + conv.videos)
        what = " and ".join(w for w, media in (("image(s)", conv.images), ("video(s)", conv.videos)) if media)
        raise MediaError(conv.where, names, f"the processor fails on {what}", err) from None
    if out["input_ids"][0].tolist() != ids:
        raise ValueError(f"{conv.where}: the processor's tokens differ from the tokenizer's on the "
                         "same text; cannot place the labels")
    input_ids = out["input_ids"][0]
    labels = torch.where(torch.tensor(mask), input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    per_token = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")
    pixels = {k: v for k, v in out.items() if k not in per_token}
    mm = out["mm_token_type_ids"][0] if "mm_token_type_ids" in out else None
    types = out["token_type_ids"][0] if "token_type_ids" in out else None
    return EncodedSample(input_ids=input_ids, labels=labels, pixels=pixels, mm_token_type_ids=mm,
                         token_type_ids=types)
