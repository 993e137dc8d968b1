"""One training conversation, as every ``--data`` format becomes it (the data model).

Every format reader (:mod:`vlmcp.data.hf.formats`) turns a line into a
:class:`Conversation`; everything after that (encoding, packing, ``vlmcp data show``)
reads only this. So the fields here are the complete list of what a line can make
vlmcp train: a field of a line that has no place here must be refused by its reader,
never dropped.

* :class:`Message`: a role, a string content with one placeholder per image
  (``<image>``) or video (``<video>``) where it goes, and whether it carries loss.
* :class:`Media`: one image or video: a local path, inline bytes, or a video's frames;
  :class:`MediaError`: one that cannot be used (its header, its pixels or the processor).
* :class:`Conversation`: messages, images and videos in placeholder order, and where
  the line came from (``file:line``) for every message that names it.
* :class:`Skipped` / :class:`ConversationSet`: what a read kept, and what it skipped and why.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

__all__ = ["IMAGE_PLACEHOLDER", "ROLES", "TRAINED_BY_DEFAULT", "VIDEO_PLACEHOLDER", "Conversation",
           "ConversationSet", "Media", "MediaError", "Message", "Role", "Skipped", "line_name"]

IMAGE_PLACEHOLDER = "<image>"
"""Where an image goes in a message's text."""
VIDEO_PLACEHOLDER = "<video>"
"""Where a video goes in a message's text."""

Role = Literal["system", "user", "assistant", "tool_call", "tool_response"]
ROLES: tuple[str, ...] = get_args(Role)
TRAINED_BY_DEFAULT: tuple[str, ...] = ("assistant", "tool_call")
"""Roles whose tokens carry loss unless the message says otherwise (``"loss": false``)."""


def line_name(source: str, line: int) -> str:
    """How error messages name line ``line`` of the file ``source``.

    ``file:line`` for JSONL; ``file.json:[N]`` for the N-th object (1-based) of a JSON
    list, whose objects need not start on lines of their own (one-line ``.json`` files
    are common); ``line N`` when the source is unknown.
    """
    if not source:
        return f"line {line}"
    return f"{source}:[{line}]" if source.lower().endswith(".json") else f"{source}:{line}"


@dataclass(frozen=True)
class Message:
    """One turn.

    Attributes:
        role: ``system``, ``user``, ``assistant``, ``tool_call`` (the assistant calling a
            tool; ``content`` is the call, a JSON object with ``name`` and ``arguments``)
            or ``tool_response`` (the tool's answer).
        content: the text, with one :data:`IMAGE_PLACEHOLDER` / :data:`VIDEO_PLACEHOLDER`
            per image / video of the conversation, in order.
        loss: ``True``/``False`` as the line says (ms-swift's per-message ``loss``), or
            ``None``: trained when the role is in :data:`TRAINED_BY_DEFAULT`.
    """

    role: Role
    content: str
    loss: bool | None = None

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise TypeError(f"content must be a string, got {type(self.content).__name__}")
        if self.loss is not None and not isinstance(self.loss, bool):
            raise TypeError(f"loss must be True, False or None, got {self.loss!r}")

    @property
    def trained(self) -> bool:
        """Whether this message's tokens carry loss."""
        return self.role in TRAINED_BY_DEFAULT if self.loss is None else self.loss


@dataclass(frozen=True)
class Media:
    """One image or video: a local file, the file's bytes given inline, or (a video) its frames.

    Attributes:
        kind: ``"image"`` or ``"video"``.
        path: the resolved local file; for a video given as a directory of frames, the
            directory (``frames`` then lists its images); None for inline bytes or a list of frames.
        data: the inline bytes (LLaMA-Factory / ms-swift ``{"bytes": ...}``), or None.
        frames: a video's frames as image files, in order (a directory's images, or a list
            given in the line), or None for a video file.
    """

    kind: Literal["image", "video"]
    path: Path | None = None
    data: bytes | None = field(default=None, repr=False)
    frames: tuple[Path, ...] | None = None

    def __post_init__(self):
        if self.frames is not None:
            if self.kind != "video" or self.data is not None or not self.frames:
                raise ValueError("frames are a video's, a non-empty list, without inline bytes")
        elif (self.path is None) == (self.data is None):
            raise ValueError("a Media is a path or inline bytes, exactly one of them")

    @property
    def name(self) -> str:
        """How messages name it: the path, ``<N inline bytes>`` or ``<N frames: first, ...>``."""
        if self.path is not None:
            return str(self.path)
        if self.frames is not None:
            return f"<{len(self.frames)} frames: {self.frames[0]}, ...>"
        return f"<{len(self.data)} inline bytes>"

    def open_image(self):
        """The image as a PIL image (lazy: only the header is read until pixels are used)."""
        from PIL import Image

        return Image.open(self.path if self.path is not None else io.BytesIO(self.data))


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


@dataclass(frozen=True)
class Conversation:
    """One training sample.

    Attributes:
        line: its 1-based line number in the file (JSONL), or its 1-based index in a
            JSON list.
        messages: the turns, in order; a top-level ``system`` field is the first message.
        images: in :data:`IMAGE_PLACEHOLDER` order.
        source: the file.
        videos: in :data:`VIDEO_PLACEHOLDER` order.
        dropped_turns: turns the format's reader dropped by its documented rule (LLaVA: a
            leading ``gpt`` turn), counted so the run can report them.
        tools: the tool schemas the line offers the model (LLaMA-Factory / ms-swift top-level
            ``tools``) as a JSON list in text, or None. Like ``tool_call`` messages they change
            what trains: an encoder that cannot render them must refuse the conversation.
        pretrain: an ms-swift pre-training line (one assistant message, nothing else): its text
            trains as plain text, every token, without the chat template
            (:func:`vlmcp.data.hf.template.render`).
    """

    line: int
    messages: tuple[Message, ...]
    images: tuple[Media, ...] = ()
    source: str = ""
    videos: tuple[Media, ...] = ()
    dropped_turns: int = 0
    tools: str | None = None
    pretrain: bool = False

    @property
    def where(self) -> str:
        """``file:line`` (``file.json:[N]`` in a JSON list), how error messages name the conversation."""
        return line_name(self.source, self.line)


@dataclass(frozen=True)
class Skipped:
    """A line (or conversation) left out of training, and why."""

    where: str
    """``file:line`` (:func:`line_name`)."""
    reason: str
    """One line, e.g. ``nothing left to train after dropping a leading gpt turn``."""


@dataclass(frozen=True)
class ConversationSet:
    """What reading one or more ``--data`` files gives."""

    conversations: list[Conversation]
    """The kept conversations, files in the order given, each in file order."""
    skipped: list[Skipped] = field(default_factory=list)
    """Lines a format's documented rule leaves out (counted and reported, never silent)."""

    @property
    def dropped_turns(self) -> int:
        """Turns dropped by a format's rule, over all kept conversations."""
        return sum(c.dropped_turns for c in self.conversations)
