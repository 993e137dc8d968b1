"""LLaVA lines: ``conversations`` of ``human`` / ``gpt`` turns and an ``image``.

A line::

    {"id": "000000033471", "image": "coco/000000033471.jpg",
     "conversations": [{"from": "human", "value": "What is this?\\n<image>"},
                       {"from": "gpt", "value": "A bus."}]}

Read as LLaVA's ``train.py`` reads it:

* ``image``: one path, or a list (LLaVA-NeXT / OneVision multi-image lines); absent for a
  text-only line. ``video`` (LLaVA-Video / LLaVA-NeXT-Video lines): a video file or a
  directory of frames, or a list of them (:mod:`vlmcp.data.hf.media`), one per ``<video>``.
* A turn holding one ``<image>`` (or one ``<video>``, and no image): LLaVA 1.5's
  ``preprocess_multimodal`` rule, the placeholder removed, the rest stripped, then
  ``<image>\\n`` + rest, so ``"<image>\\nQ"``, ``"Q\\n<image>"`` and ``"<image>\\n\\nQ "`` all
  become ``"<image>\\nQ"`` (one newline, whatever the chat template adds). A turn holding
  several keeps them where they are (LLaVA-NeXT's rule for interleaved images).
* A leading ``gpt`` turn is dropped (``preprocess_v1`` does) and counted in
  :attr:`Conversation.dropped_turns`.
* A line with no ``gpt`` turn left trains nothing in LLaVA: it is skipped, with its
  reason, in :attr:`ConversationSet.skipped`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vlmcp.data.hf.formats.base import DataFormat, Detection, Line, build_conversation, check_keys, string
from vlmcp.data.hf.media import resolve_images, resolve_videos
from vlmcp.data.hf.schema import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, Conversation, Message, Skipped

__all__ = ["LLAVA", "LlavaFormat", "place_image"]

_ROLES = {"human": "user", "gpt": "assistant"}


def place_image(text: str) -> str:
    """LLaVA's placement of a turn's single ``<image>`` (or ``<video>``): first, then exactly one newline."""
    counts = {p: text.count(p) for p in (IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER)}
    if sorted(counts.values()) != [0, 1]:
        return text
    placeholder = max(counts, key=counts.get)
    return f"{placeholder}\n{text.replace(placeholder, '').strip()}".strip()


class LlavaFormat(DataFormat):
    """LLaVA's ``conversations`` + ``image`` (see the module docstring)."""

    name = "llava"
    signature = '"conversations" of {"from": "human"|"gpt", "value"} turns, with optional "image", "video"'

    def detect(self, record: Mapping[str, Any]) -> Detection | None:
        if "conversations" not in record or "messages" in record:
            return None
        key = next((k for k in ("image", "video") if k in record), None)
        if key is not None:
            return Detection(True, f'has "{key}"')
        return Detection(False, '"conversations" of human/gpt turns')

    def read(self, record: Mapping[str, Any], line: Line) -> Conversation | Skipped:
        check_keys(line, record, ("conversations", "image", "video"))
        videos = resolve_videos(record.get("video"), line.media_root, line.where, key="video")
        images = resolve_images(record.get("image"), line.media_root, line.where, key="image")
        turns = record["conversations"]
        if not isinstance(turns, list) or not turns:
            raise line.error("\"conversations\" must be a non-empty list of turns")
        messages = []
        for i, turn in enumerate(turns):
            what = f"turn {i}"
            if not isinstance(turn, Mapping) or "from" not in turn or "value" not in turn:
                raise line.error(f"{what} needs \"from\" and \"value\", got {turn!r:.80}")
            check_keys(line, turn, ("from", "value"), what, metadata=False)
            if not isinstance(turn["from"], str) or turn["from"] not in _ROLES:
                raise line.error(f"{what} is from {turn['from']!r}; a LLaVA turn is from human or gpt")
            messages.append(Message(role=_ROLES[turn["from"]],
                                    content=place_image(string(line, turn["value"], f"{what}'s \"value\""))))
        dropped = 0
        if messages[0].role == "assistant":
            messages, dropped = messages[1:], 1
        if not any(m.role == "assistant" for m in messages):
            reason = ("nothing left to train after dropping a leading gpt turn" if dropped
                      else "no gpt turn, nothing to train")
            return Skipped(where=line.where, reason=reason)
        return build_conversation(line, messages, images, videos, dropped_turns=dropped)


LLAVA = LlavaFormat()
