"""What one ``--data`` format is (:class:`DataFormat`), and the checks every format ends with.

A format says whether a line is written in it (:meth:`DataFormat.detect`) and turns the
line into a :class:`~vlmcp.data.hf.schema.Conversation` or, by a documented rule of
the format, a :class:`~vlmcp.data.hf.schema.Skipped` (:meth:`DataFormat.read`).
Everything it cannot honour is a ``ValueError`` that starts with ``file:line: ``
(:meth:`Line.error`): a key, role or part it does not know is refused, never dropped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from vlmcp.data.hf.schema import (
    IMAGE_PLACEHOLDER,
    VIDEO_PLACEHOLDER,
    Conversation,
    Media,
    Message,
    Skipped,
    line_name,
)

__all__ = ["METADATA_KEYS", "DataFormat", "Detection", "Line", "build_conversation", "check_keys", "string"]

METADATA_KEYS: tuple[str, ...] = ("id", "source", "data_source", "dataset", "model")
"""Top-level keys that say where a line came from (LLaVA's ``id``, ShareGPT's ``model``,
a mix's ``source``). No reader of these formats uses them to build the sample, so they
are allowed and ignored; any other key a format does not read is refused."""


class Detection(NamedTuple):
    """A format's claim on a line."""

    certain: bool
    """True when the line has something only this format has; False when it merely fits."""
    reason: str
    """Why, for messages: e.g. ``has "messages"``."""


@dataclass(frozen=True)
class Line:
    """One line (or JSON list item) being read: where it is, and where its images start."""

    source: str
    """The data file, as given."""
    number: int
    """1-based line (JSONL) or index in the list (JSON)."""
    media_root: Path
    """Where relative image paths start: ``--image-root``, else the data file's directory."""

    @property
    def where(self) -> str:
        """``file:line`` (``file.json:[N]``): the prefix of every error about this line."""
        return line_name(self.source, self.number)

    def error(self, message: str) -> ValueError:
        """A ``ValueError`` naming this line: ``raise line.error("...")``."""
        return ValueError(f"{self.where}: {message}")


class DataFormat(ABC):
    """One ``--data`` format: a small class in its own file, registered by name."""

    name: ClassVar[str]
    """Display name, e.g. ``"llava"``."""
    signature: ClassVar[str]
    """What a line of this format has, for the error about a line no format reads."""

    @abstractmethod
    def detect(self, record: Mapping[str, Any]) -> Detection | None:
        """Whether ``record`` is written in this format: certain, fits, or None (it is not)."""

    @abstractmethod
    def read(self, record: Mapping[str, Any], line: Line) -> Conversation | Skipped:
        """The conversation of ``record``, or why the format's documented rule skips it.

        Raises:
            ValueError: from :meth:`Line.error`, naming what the line has that cannot train.
        """


def check_keys(line: Line, mapping: Mapping[str, Any], accepted: Iterable[str], what: str = "the line",
               metadata: bool = True) -> None:
    """Refuse a key of ``mapping`` neither ``accepted`` nor (with ``metadata``) in :data:`METADATA_KEYS`."""
    accepted = tuple(accepted)
    allowed = accepted + (METADATA_KEYS if metadata else ())
    unknown = [k for k in mapping if k not in allowed]
    if unknown:
        ignored = f"; ignored metadata: {', '.join(METADATA_KEYS)}" if metadata else ""
        raise line.error(f"{what} has key {unknown[0]!r}, which vlmcp does not read (it reads: "
                         f"{', '.join(accepted)}{ignored}); remove it or convert the line, so that "
                         "nothing it says is dropped")


def string(line: Line, value: Any, what: str) -> str:
    """``value`` if it is a string, else an error naming ``what``."""
    if not isinstance(value, str):
        raise line.error(f"{what} must be a string, got {type(value).__name__}")
    return value


def build_conversation(line: Line, messages: Sequence[Message], images: Sequence[Media] = (),
                       videos: Sequence[Media] = (), *, dropped_turns: int = 0,
                       tools: str | None = None, pretrain: bool = False) -> Conversation:
    """The :class:`Conversation`, after the checks every format shares.

    Raises:
        ValueError: no message; a number of ``<image>`` (``<video>``) placeholders other than
            the number of images (videos); a conversation that opens (after any system
            message) with an assistant turn, unless ``pretrain`` (then it is exactly one
            assistant message); no message with loss.
    """
    if not messages:
        raise line.error("the conversation has no message")
    for placeholder, media, what in ((IMAGE_PLACEHOLDER, images, "image"),
                                     (VIDEO_PLACEHOLDER, videos, "video")):
        placeholders = sum(m.content.count(placeholder) for m in messages)
        if placeholders != len(media):
            raise line.error(f"{placeholders} {placeholder} placeholder(s) but {len(media)} {what}(s); "
                             f"each {what} needs one {placeholder} where it goes")
    first = next((m for m in messages if m.role != "system"), None)
    if pretrain:
        if len(messages) != 1 or messages[0].role != "assistant" or tools is not None:
            raise line.error("a pre-training line is one assistant message and nothing else")
    elif first is not None and first.role in ("assistant", "tool_call"):
        raise line.error(f"the conversation opens with an {first.role} message; it needs a user (or "
                         "system) message first (an ms-swift pre-training line is one assistant message and "
                         "nothing else)")
    if not any(m.trained for m in messages):
        raise line.error("no message carries loss (no assistant or tool_call turn, and none with "
                         "\"loss\": true), so nothing to learn")
    return Conversation(line=line.number, messages=tuple(messages), images=tuple(images),
                        source=line.source, videos=tuple(videos), dropped_turns=dropped_turns, tools=tools,
                        pretrain=pretrain)
