"""Reading ``--data`` files: every format users ship, checked line by line.

=================================  ==================================================================
format                             one line
=================================  ==================================================================
ms-swift / LLaMA-Factory messages  ``{"messages": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "<image>Who?"}, {"role": "assistant",
                                   "content": "Kane.", "loss": true}], "images": ["1.jpg"]}``
... with a video                   ``{"messages": [{"role": "user", "content": "<video>What happens?"},
                                   {"role": "assistant", "content": "A goal."}], "videos": ["1.mp4"]}``
LLaMA-Factory sharegpt             ``{"conversations": [{"from": "human", "value": "Weather in Paris?"},
                                   {"from": "function_call", "value": "{\\"name\\": \\"weather\\",
                                   \\"arguments\\": {\\"city\\": \\"Paris\\"}}"}, {"from": "observation",
                                   "value": "18C"},
                                   {"from": "gpt", "value": "18C."}], "system": "...", "tools": "[...]"}``
structured content (LLaMA-Factory  ``{"messages": [{"role": "user", "content": [{"type": "image_url", "value":
v1, OpenAI, transformers)          "1.jpg"}, {"type": "text", "value": "Who?"}]}, {"role": "assistant",
                                   "content": [{"type": "text", "text": "Kane."}]}]}``
ms-swift query / response          ``{"query": "<image>And now?", "response": "A square.", "history":
                                   [["<image>What?", "A circle."]], "images": ["a.png", "b.png"]}``
LLaVA                              ``{"id": "7", "image": "a.png", "conversations": [{"from": "human",
                                   "value": "What is this?\\n<image>"}, {"from": "gpt", "value": "A bus."}]}``
=================================  ==================================================================

Containers: ``.jsonl`` (one object per line, blank lines skipped) and ``.json`` (a list
of objects, or one object); UTF-8 with or without a BOM, any line endings. Several files
are read in the order given and concatenated. A JSONL line is named ``file:line``; an
object of a JSON list ``file.json:[N]`` (N from 1, the object's place in the list: a
``.json`` file is often one line), as :func:`~vlmcp.data.hf.schema.line_name` says;
a syntax error in a ``.json`` file names its text line. JSON Lines in a ``.json`` file is
refused (rename it ``.jsonl``) rather than guessed.

Each line becomes a :class:`~vlmcp.data.hf.schema.Conversation` (the format's rules
are in :mod:`vlmcp.data.hf.formats`, images and videos in :mod:`vlmcp.data.hf.media`) or, by a
documented rule (LLaVA: nothing to train), a recorded skip. Everything else is a
``ValueError`` naming the file and line, raised while reading, so ``vlmcp train``
reports it before any rank starts: a key, role or part no format reads is refused, never
dropped.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vlmcp.data.hf.dataset_info import DataSource
from vlmcp.data.hf.formats import Line, certain_formats, read_record
from vlmcp.data.hf.schema import IMAGE_PLACEHOLDER, Conversation, ConversationSet, Skipped, line_name

__all__ = ["IMAGE_PLACEHOLDER", "Conversation", "ConversationSet", "read_conversations"]

_CONTAINERS = (".jsonl", ".json")


def _label(source) -> str:
    """How a message names a file: ``--data FILE``, or ``--dataset NAME (FILE)`` for a
    ``dataset_info.json`` entry (its ``file_name``)."""
    if isinstance(source, DataSource) and source.name:
        return f"--{source.name} ({source.path})"
    return f"--data {os.fspath(source)}"


def _parse(path: Path, label: str) -> list[tuple[int, Any]]:
    """``(line, object)`` for every object of a ``.jsonl`` or ``.json`` file."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM is dropped; newlines become "\n"
    except UnicodeDecodeError as err:
        raise ValueError(f"{label}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    if path.suffix.lower() == ".jsonl":
        records = []
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                records.append((number, json.loads(line)))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})"
                                 ) from None
        return records
    if not text.strip():
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data" and text.lstrip().startswith("{"):
            # JSON Lines under a .json name: objects would be named [N] though N is a line
            raise ValueError(f"{label}: holds one JSON object per line (JSON Lines), not a JSON "
                             "list; name it .jsonl") from None
        raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise ValueError(f"{label}: a .json file holds a list of objects, got {type(data).__name__}")
    return list(enumerate(data, start=1))


def _is_dataset_info(path: Path, records: list) -> bool:
    """Whether a ``.json`` file is LLaMA-Factory's ``dataset_info.json``: one object of entries
    that each name a file or a hub dataset."""
    if path.suffix.lower() != ".json" or len(records) != 1 or not isinstance(records[0][1], dict):
        return False
    entries = records[0][1].values()
    sources = ("file_name", "hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
    return bool(entries) and all(isinstance(e, dict) and any(k in e for k in sources) for e in entries)


def _read_file(path: Path, media_root: Path, convert=None, max_samples: int | None = None, label: str = ""
               ) -> tuple[list[Conversation], list[Skipped]]:
    label = label or f"--data {path}"
    if not path.is_file():
        raise ValueError(f"{label}: no such file")
    if path.suffix.lower() not in _CONTAINERS:
        raise ValueError(f"{label}: vlmcp reads {' and '.join(_CONTAINERS)} files, not "
                         f"{path.suffix or 'a file without a suffix'}")
    records = _parse(path, label)
    if not records:
        raise ValueError(f"{label}: the file holds no conversation")
    if convert is None and _is_dataset_info(path, records):
        raise ValueError(f"--data {path}: this is LLaMA-Factory's dataset_info.json (a table of datasets), "
                         "not conversations; train its datasets with --dataset NAME[,NAME] --dataset-dir "
                         f"{path.parent}")
    if max_samples is not None:
        records = records[:max_samples]
    for i, (number, record) in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"{line_name(str(path), number)}: expected a JSON object, got "
                             f"{type(record).__name__}")
        if convert is not None:
            records[i] = (number, convert(record, line_name(str(path), number)))

    @functools.cache
    def file_formats() -> frozenset[str]:
        return frozenset().union(*(certain_formats(r) for _, r in records))

    kept, skipped = [], []
    for number, record in records:
        out = read_record(record, Line(source=str(path), number=number, media_root=media_root), file_formats)
        (skipped if isinstance(out, Skipped) else kept).append(out)
    return kept, skipped


def read_conversations(paths: str | os.PathLike | Sequence[str | os.PathLike],
                       image_root: str | os.PathLike | None = None, *,
                       max_samples: int | None = None) -> ConversationSet:
    """Read and check every line of one or more ``--data`` files.

    Args:
        paths: a file, or several, read in order and concatenated (``.jsonl`` or ``.json``); a
            :class:`~vlmcp.data.hf.dataset_info.DataSource` (``--dataset``) rewrites its lines
            first and has its own image directory.
        image_root: where relative image paths start; default each data file's own directory.
        max_samples: read only the first lines (objects) of each file (``--max-samples``).

    Returns:
        The kept conversations (files in the order given, each in file order) and the
        lines a format's rule skipped, with why.

    Raises:
        ValueError: naming ``file:line`` for a line that is not a JSON object, that no
            format reads, or that has a key, role, part or image vlmcp cannot honour (see
            the module docstring); naming the file for a missing, empty, non-UTF-8 or
            unparsable file; and when nothing is left to train.
    """
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not paths:
        raise ValueError("--data: no file given")
    root = None if image_root is None else Path(image_root)
    if root is not None and not root.is_dir():
        raise ValueError(f"--image-root {root}: no such directory")
    kept, skipped = [], []
    if max_samples is not None and (isinstance(max_samples, bool) or max_samples < 1):
        raise ValueError(f"--max-samples must be an integer >= 1, got {max_samples!r}")
    for source in paths:
        path, convert = Path(source), getattr(source, "convert", None)
        media_root = root if root is not None else getattr(source, "media_root", None) or path.parent
        conversations, skips = _read_file(path, media_root, convert, max_samples, _label(source))
        kept += conversations
        skipped += skips
    if not kept:
        raise ValueError(f"{', '.join(map(_label, paths))}: nothing to train, every line was skipped "
                         f"({len(skipped)}; the first, {skipped[0].where}: {skipped[0].reason})")
    return ConversationSet(conversations=kept, skipped=skipped)
