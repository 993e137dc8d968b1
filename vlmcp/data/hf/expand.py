"""A rendered conversation's image and video placeholders expanded by the processor's own code.

Note [vlmcp data: the processor's own expansion]
------------------------------------------------
The processor turns the chat template's text into model tokens in two steps: each image
(video) gets a replacement text (``replace_image_token`` / ``replace_video_token``), and
``get_text_with_replacements(text, images, videos)`` puts them in place, which a processor
may override. Planning runs that same method with the same replacement texts (each video's
from the processor's own ``replace_video_token`` on its plan,
:func:`vlmcp.data.hf.video_processor.replacement_texts`; each image's from its size,
:mod:`vlmcp.data.hf.image_text`), then tokenizes the result as the processor does. So
whatever a transformers version writes, planning writes the same: 5.24's Qwen3-VL keeps the
template's ``<|vision_start|><|video_pad|><|vision_end|>`` and replaces the pad alone, 5.25's
collapses the whole wrapper into the frame groups (each has its own vision start / end)::

    template   ... user\\n<|vision_start|><|video_pad|><|vision_end|>Why?
    5.24       ... user\\n<|vision_start|><0.3 seconds><|vision_start|>pads<|vision_end|>...<|vision_end|>Why?
    5.25       ... user\\n<0.3 seconds><|vision_start|>pads<|vision_end|>...Why?

The method returns, per replaced item, the characters it replaced in the template's text
(``span``: 5.25's includes the wrapper) and where its replacement lies in the new text
(``new_span``). Between items the text is unchanged, so every new character maps back to a
template character or to a replacement; a token carries loss where its first character
came from a trained token of the template's text (replacements never do). A mismatch that
planning still misses is caught when the first conversation of each kind is encoded at
planning (:func:`vlmcp.data.hf.planned.check_planned`), before any rank starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmcp.data.hf.schema import Conversation
from vlmcp.data.hf.template import Rendered

__all__ = ["Expansion", "expand"]

VIDEO_HINT = ("; this model's chat template does not render video parts (the hub's Qwen2-VL template writes "
              "<|vision_start|><|video_pad|><|vision_end|> for each)")


@dataclass(frozen=True)
class Expansion:
    """A conversation's tokens after the processor expands its images and videos.

    Attributes:
        text: the expanded text (what the processor tokenizes).
        ids: its token ids.
        trained: per token, whether it carries loss.
        spans: per image and video in text order, ``(kind, start, end)``: the characters of
            the template's text it replaced (``"image"`` or ``"video"``).
    """

    text: str
    ids: list[int]
    trained: list[bool]
    spans: tuple[tuple[str, int, int], ...]


def _check_counts(processor, conv: Conversation, text: str, items: dict[str, list[str]]) -> None:
    """As many placeholders in ``text`` as items of each kind (the processor's own count: its token
    in the text), else a ``file:line`` error."""
    for kind, texts in items.items():
        token = getattr(processor, f"{kind}_token", None)
        n = text.count(token) if token else 0
        if n != len(texts):
            raise ValueError(f"{conv.where}: the chat template wrote {n} {kind} placeholder(s) for "
                             f"{len(texts)} {kind}(s)" + (VIDEO_HINT if kind == "video" else ""))


def expand(processor, conv: Conversation, rendered: Rendered, images: list[str], videos: list[str]
           ) -> Expansion:
    """``rendered`` with each image (video) placeholder replaced by the processor's own
    ``get_text_with_replacements``, tokenized as the processor tokenizes it.

    Args:
        processor: the model's processor.
        conv: the conversation (errors name its ``file:line``).
        rendered: its chat template text.
        images: each image's replacement text, in order.
        videos: each video's replacement text, in order.

    Raises:
        ValueError: naming ``file:line`` when the template wrote another count of placeholders
            than the conversation has images (videos), or the processor's offsets do not map
            its text back to the template's.
    """
    _check_counts(processor, conv, rendered.text, {"image": images, "video": videos})
    if not images and not videos:
        return Expansion(text=rendered.text, ids=list(rendered.ids), trained=list(rendered.trained), spans=())
    (text,), (offsets,) = processor.get_text_with_replacements([rendered.text], images, videos)
    if [o["type"] for o in offsets].count("image") != len(images) or \
            [o["type"] for o in offsets].count("video") != len(videos):
        raise ValueError(f"{conv.where}: {type(processor).__name__} replaced {len(offsets)} placeholders for "
                         f"{len(images)} image(s) and {len(videos)} video(s)")
    origin, old, new = [], 0, 0  # origin[c]: the template character new character c came from, or -1
    for o in sorted(offsets, key=lambda o: o["new_span"][0]):
        (s, e), (ns, ne) = o["span"], o["new_span"]
        if ns - new != s - old:
            raise ValueError(f"{conv.where}: {type(processor).__name__}'s replacement offsets do not map its "
                             "text back to the chat template's; cannot place the labels")
        origin += [*range(old, s), *[-1] * (ne - ns)]
        old, new = e, ne
    origin += range(old, len(rendered.text))
    if len(origin) != len(text):
        raise ValueError(f"{conv.where}: {type(processor).__name__}'s replacement offsets do not cover its "
                         "text; cannot place the labels")
    trained_char = [False] * len(rendered.text)
    for (s, e), trained in zip(rendered.offsets, rendered.trained, strict=True):
        trained_char[s:e] = [trained] * (e - s)
    enc = processor.tokenizer(text, return_offsets_mapping=True)
    trained = [e > s and origin[s] >= 0 and trained_char[origin[s]] for s, e in enc["offset_mapping"]]
    spans = tuple((o["type"], *o["span"]) for o in sorted(offsets, key=lambda o: o["span"][0]))
    return Expansion(text=text, ids=list(enc["input_ids"]), trained=trained, spans=spans)
