"""LLaMA-Factory sharegpt / OpenAI-style and ms-swift ``messages`` lines.

A line::

    {"messages": [{"role": "user", "content": "<image>Who are they?"},
                  {"role": "assistant", "content": "Kane and Gretzka.", "loss": true}],
     "images": ["1.jpg"], "system": "You are a football fan.", "tools": "[...]"}

Top-level keys:

* ``messages`` or ``conversations``: the turns (one of the two), each
  ``{"role", "content"}`` or ``{"from", "value"}``;
* ``system``: the first message (null or ``""`` is none, as in LLaMA-Factory); a line with
  it *and* a leading system message is an error (LLaMA-Factory keeps the message,
  others the field);
* ``images``: a spec or a list of specs (:mod:`vlmcp.data.hf.media`), one per ``<image>``;
* ``tools``: the tool schemas, a JSON list (as text or as a list), carried as
  :attr:`Conversation.tools`;
* ``videos``: a spec or a list of specs (a video file, a directory of frames, or a list of
  frame paths: :mod:`vlmcp.data.hf.media`), one per ``<video>``; null or ``[]`` is none.

Roles (LLaMA-Factory's sharegpt tags, ms-swift's and OpenAI's names): ``user``/``human``,
``assistant``/``gpt``, ``system``, ``tool_call``/``function_call``,
``tool_response``/``tool``/``observation``. ``function`` is refused: LLaMA-Factory means
the call by it, OpenAI the result.

Per message: ms-swift's ``loss`` (true / false / null) and LLaMA-Factory v1's
``loss_weight`` (0 or 1; a fractional weight is refused) set :attr:`Message.loss`.
``content`` is a string with ``<image>`` / ``<video>`` placeholders, or a list of parts
(:mod:`~vlmcp.data.hf.formats.parts`) whose image and video parts are the line's images
and videos (then the line has no ``images`` / ``videos``). A ``tool_call`` content is the
call: a JSON object with a ``name`` (or a list of them, parallel calls), as text or
structured (then serialised).
A ``tool_response`` content may also be a JSON object (serialised).

ms-swift's pre-training line, ``{"messages": [{"role": "assistant", "content": "<image>A dog."}],
"images": ["d.jpg"]}`` (one assistant message, nothing else), trains its text as plain text
(:attr:`Conversation.pretrain`), as ``swift pt`` does (no chat template).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from vlmcp.data.hf.formats.base import DataFormat, Detection, Line, build_conversation, check_keys, string
from vlmcp.data.hf.formats.parts import read_parts
from vlmcp.data.hf.media import resolve_image, resolve_images, resolve_video, resolve_videos
from vlmcp.data.hf.schema import Conversation, Message

__all__ = ["MESSAGES", "ROLE_NAMES", "MessagesFormat"]

ROLE_NAMES: dict[str, str] = {
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant",
    "system": "system",
    "tool_call": "tool_call", "function_call": "tool_call",
    "tool_response": "tool_response", "tool": "tool_response", "observation": "tool_response",
}
"""A message's role or sharegpt tag -> its :data:`~vlmcp.data.hf.schema.Role`."""

_KEY_STYLES = (("role", "content"), ("from", "value"))
_LINE_KEYS = ("messages", "conversations", "system", "images", "tools", "videos")
_LLAVA_TAGS = ("human", "gpt")


def _loss(line: Line, turn: Mapping, what: str) -> bool | None:
    if "loss" in turn and "loss_weight" in turn:
        raise line.error(f"{what} has both \"loss\" and \"loss_weight\"; keep one")
    if "loss" in turn:
        value = turn["loss"]
        if value is None or isinstance(value, bool):
            return value
        raise line.error(f"{what}'s \"loss\" must be true, false or null, got {value!r}")
    if "loss_weight" in turn:
        value = turn["loss_weight"]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1):
            return value == 1
        raise line.error(f"{what}'s \"loss_weight\" is {value!r}: vlmcp trains a message or not (0 or 1), "
                         "weighted loss is not supported")
    return None


def _tool_call(line: Line, content: Any, what: str) -> str:
    """A tool call's text, checked to be a JSON object with a ``name`` (or a list of them)."""
    if isinstance(content, str):
        try:
            call = json.loads(content)
        except json.JSONDecodeError as err:
            raise line.error(f"{what} is a tool call but not JSON ({err.msg} at column {err.colno})"
                             ) from None
        text = content
    elif isinstance(content, (Mapping, list)):
        call, text = content, json.dumps(content, ensure_ascii=False)
    else:
        raise line.error(f"{what} is a tool call: a JSON object (or its text), got {type(content).__name__}")
    calls = call if isinstance(call, list) else [call]
    if not calls or not all(isinstance(c, Mapping) and isinstance(c.get("name"), str) and c["name"]
                            for c in calls):
        raise line.error(f"{what} is a tool call: a JSON object with a \"name\" (or a list of them), "
                         f"got {text:.80}")
    return text


def _tools(line: Line, tools: Any) -> str | None:
    """The ``tools`` field as JSON text (None when null, ``""`` or ``[]``)."""
    if tools is None or tools == "" or tools == []:
        return None
    parsed = tools
    if isinstance(tools, str):
        try:
            parsed = json.loads(tools)
        except json.JSONDecodeError as err:
            raise line.error(f"\"tools\" is not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(parsed, list):
        raise line.error(f"\"tools\" must be a JSON list of tool schemas, got {type(parsed).__name__}")
    for i, tool in enumerate(parsed):
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise line.error(f"\"tools\"[{i}] must be a tool schema with a \"name\" (or {{\"type\": "
                             f"\"function\", \"function\": {{\"name\": ...}}}}), got {tool!r:.80}")
    return json.dumps(parsed, ensure_ascii=False) if parsed else None


def _message(line: Line, turn: Any, i: int) -> tuple[Message, list, list]:
    """One turn as a :class:`Message`, and the image and video specs of its parts."""
    what = f"message {i}"
    if not isinstance(turn, Mapping):
        raise line.error(f"{what} must be an object, got {type(turn).__name__}")
    style = next((s for s in _KEY_STYLES if s[0] in turn), None)
    if style is None or style[1] not in turn:
        raise line.error(f"{what} needs \"role\" and \"content\" (or sharegpt's \"from\" and \"value\"), got "
                         f"keys {sorted(turn)}")
    role_key, text_key = style
    check_keys(line, turn, (role_key, text_key, "loss", "loss_weight"), what, metadata=False)
    tag = turn[role_key]
    role = ROLE_NAMES.get(tag) if isinstance(tag, str) else None
    if role is None:
        raise line.error(f"{what} has role {tag!r}; vlmcp reads the roles {', '.join(ROLE_NAMES)}")
    content, images, videos = turn[text_key], [], []
    if role == "tool_call":
        content = _tool_call(line, content, what)
    elif isinstance(content, list):
        content, images, videos = read_parts(line, content, what)
    elif isinstance(content, Mapping) and role == "tool_response":
        content = json.dumps(content, ensure_ascii=False)
    elif not isinstance(content, str):
        raise line.error(f"{what}'s \"{text_key}\" must be a string or a list of parts, got "
                         f"{type(content).__name__}")
    return Message(role=role, content=content, loss=_loss(line, turn, what)), images, videos


def _media(line: Line, column: tuple, parts: list, resolve, key: str, what: str) -> tuple:
    """The line's images (videos): from its column or from its messages' parts, not both."""
    if parts and column:
        raise line.error(f"the line gives {what}s twice: as {what} parts of its messages and in \"{key}\"; "
                         "keep one")
    return tuple(resolve(spec, line.media_root, line.where) for spec in parts) if parts else column


class MessagesFormat(DataFormat):
    """LLaMA-Factory sharegpt / OpenAI-style and ms-swift ``messages`` (see the module docstring)."""

    name = "messages"
    signature = ('"messages" or "conversations": a list of {"role", "content"} or {"from", "value"}, '
                 'with optional "system", "images", "videos", "tools"')

    def detect(self, record: Mapping[str, Any]) -> Detection | None:
        if "messages" in record:
            return Detection(True, 'has "messages"')
        if "conversations" not in record:
            return None
        for key in ("images", "system", "tools", "videos"):
            if key in record:
                return Detection(True, f'has "{key}"')
        turns = record["conversations"]
        for turn in turns if isinstance(turns, list) else ():
            if isinstance(turn, Mapping) and "role" in turn:
                return Detection(True, 'its turns have "role"')
            if isinstance(turn, Mapping) and turn.get("from", "human") not in _LLAVA_TAGS:
                return Detection(True, f'a turn is from {turn["from"]!r}')
        return Detection(False, '"conversations" of human/gpt turns')

    def read(self, record: Mapping[str, Any], line: Line) -> Conversation:
        check_keys(line, record, _LINE_KEYS)
        if "messages" in record and "conversations" in record:
            raise line.error("the line has both \"messages\" and \"conversations\"; keep one")
        key = "messages" if "messages" in record else "conversations"
        turns = record[key]
        if not isinstance(turns, list) or not turns:
            raise line.error(f"\"{key}\" must be a non-empty list of messages")
        messages, part_images, part_videos = [], [], []
        for i, turn in enumerate(turns):
            message, images, videos = _message(line, turn, i)
            messages.append(message)
            part_images += images
            part_videos += videos
        images = _media(line, resolve_images(record.get("images"), line.media_root, line.where), part_images,
                        resolve_image, "images", "image")
        videos = _media(line, resolve_videos(record.get("videos"), line.media_root, line.where), part_videos,
                        resolve_video, "videos", "video")
        system = record.get("system")
        if system is not None and string(line, system, '"system"'):
            if messages[0].role == "system":
                raise line.error("the line has a top-level \"system\" and a leading system message "
                                 "(message 0); which one trains is ambiguous, keep one")
            messages.insert(0, Message(role="system", content=system))
        # ms-swift's pre-training line: {"messages": [{"role": "assistant", "content": "..."}]}
        pretrain = key == "messages" and [m.role for m in messages] == ["assistant"]
        return build_conversation(line, messages, images, videos, tools=_tools(line, record.get("tools")),
                                  pretrain=pretrain)


MESSAGES = MessagesFormat()
