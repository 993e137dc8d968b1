"""JSONL conversations with images: reading and checking both formats users already have.

=======================  ==================================================================
format                   one line
=======================  ==================================================================
LLaMA-Factory / ms-swift ``{"messages": [{"role": "system"|"user"|"assistant", "content": "... <image> ..."}],
                         "images": ["a.png", ...]}``
LLaVA                    ``{"image": "a.png" or [...], "conversations": [{"from": "human"|"gpt",
                         "value": "<image>\\n..."}]}``
=======================  ==================================================================

Both become a :class:`Conversation`: roles ``system``/``user``/``assistant``, string
contents whose ``<image>`` placeholders match the images one to one and in order, and
image paths resolved against ``--image-root`` or else the JSONL file's directory.
Every problem is a ``ValueError`` that names the file and line, raised while reading,
so ``vlmcp train`` reports it before any rank starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from vlmcp.data.hf.conversation import IMAGE_PLACEHOLDER, Conversation, Media, Message

__all__ = ["IMAGE_PLACEHOLDER", "Conversation", "read_conversations"]

_ROLES = {"system": "system", "user": "user", "assistant": "assistant",
          "human": "user", "gpt": "assistant"}  # LLaVA's names -> chat-template roles


def _messages(record: dict, where: str) -> tuple[list[dict], list]:
    if "messages" in record:
        raw, images = record["messages"], record.get("images", [])
        role_key, text_key = "role", "content"
    elif "conversations" in record:
        raw, images = record["conversations"], record.get("image", record.get("images", []))
        role_key, text_key = "from", "value"
    else:
        raise ValueError(f"{where}: expected a \"messages\" (LLaMA-Factory / ms-swift) or "
                         f"\"conversations\" (LLaVA) list, found keys {sorted(record)}")
    if isinstance(images, str):
        images = [images]
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise ValueError(f"{where}: images must be a path or a list of paths, got {images!r}")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where}: the message list is empty or not a list")
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or role_key not in message or text_key not in message:
            raise ValueError(f"{where}: message {i} needs \"{role_key}\" and \"{text_key}\", got {message!r}")
        role, content = message[role_key], message[text_key]
        if role not in _ROLES:
            raise ValueError(f"{where}: message {i} has role {role!r}; expected one of {sorted(_ROLES)}")
        if not isinstance(content, str):
            raise ValueError(f"{where}: message {i}'s \"{text_key}\" must be a string, got "
                             f"{type(content).__name__}")
        messages.append(Message(role=_ROLES[role], content=content))
    if not any(m.role == "assistant" for m in messages):
        raise ValueError(f"{where}: no assistant message, so nothing to learn")
    if messages[0].role == "assistant":
        raise ValueError(f"{where}: the conversation opens with an assistant message; "
                         "it needs a user (or system) message first")
    return messages, images


def _resolve(name: str, base: Path, where: str) -> Path:
    path = Path(name) if os.path.isabs(name) else base / name
    if not path.is_file():
        raise ValueError(f"{where}: image file {path} does not exist")
    return path


def read_conversations(path: str | os.PathLike, image_root: str | os.PathLike | None = None
                       ) -> list[Conversation]:
    """Read and check every line of a JSONL conversations file.

    Args:
        path: the JSONL file (blank lines are skipped).
        image_root: the directory relative image paths start from; default the file's own.

    Returns:
        The conversations in file order.

    Raises:
        ValueError: naming ``path:line`` for a line that is not a JSON object, has neither
            format's fields, has a bad role or content, no assistant message, a number of
            ``<image>`` placeholders different from its images, or an image file that does
            not exist; naming ``path`` for a missing file or a file with no conversation.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--data {path}: no such file")
    base = Path(image_root) if image_root is not None else path.parent
    if image_root is not None and not base.is_dir():
        raise ValueError(f"--image-root {base}: no such directory")
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            messages, images = _messages(record, where)
            placeholders = sum(m.content.count(IMAGE_PLACEHOLDER) for m in messages)
            if placeholders != len(images):
                raise ValueError(f"{where}: {placeholders} {IMAGE_PLACEHOLDER} placeholder(s) but "
                                 f"{len(images)} image(s); each image needs one {IMAGE_PLACEHOLDER} "
                                 "where it goes")
            resolved = tuple(Media("image", path=_resolve(name, base, where)) for name in images)
            out.append(Conversation(line=number, messages=tuple(messages), images=resolved, source=str(path)))
    if not out:
        raise ValueError(f"--data {path}: the file holds no conversation")
    return out
