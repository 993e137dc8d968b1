"""ms-swift's query / response lines (with ``history``).

A line::

    {"system": "Be brief.", "query": "<image>And now?", "response": "A square.",
     "history": [["<image>What is this?", "A circle."]], "images": ["a.png", "b.png"]}

becomes ``system``, then one user / assistant pair per ``history`` entry
(``[query, response]``), then ``query`` / ``response``: every response trains, as
ms-swift and LLaMA-Factory do by default. ``system`` null or ``""`` is none; ``images``
and ``videos`` as in :mod:`vlmcp.data.hf.media`, one per ``<image>`` / ``<video>``. ms-swift's
column aliases (``prompt``, ``answer``, ...) are not read: rename them, or use the
``messages`` format.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vlmcp.data.hf.formats.base import DataFormat, Detection, Line, build_conversation, check_keys, string
from vlmcp.data.hf.media import resolve_images, resolve_videos
from vlmcp.data.hf.schema import Conversation, Message

__all__ = ["QUERY_RESPONSE", "QueryResponseFormat"]

_LINE_KEYS = ("query", "response", "history", "system", "images", "videos")


class QueryResponseFormat(DataFormat):
    """ms-swift's ``query`` / ``response`` / ``history`` (see the module docstring)."""

    name = "query_response"
    signature = ('"query" and "response", with optional "history" ([query, response] pairs), "system", '
                 '"images", "videos"')

    def detect(self, record: Mapping[str, Any]) -> Detection | None:
        key = next((k for k in ("query", "response", "history") if k in record), None)
        return None if key is None else Detection(True, f'has "{key}"')

    def read(self, record: Mapping[str, Any], line: Line) -> Conversation:
        check_keys(line, record, _LINE_KEYS)
        for key in ("query", "response"):
            if key not in record:
                raise line.error(f"a query/response line needs \"{key}\"")
        history = record.get("history") or []
        if not isinstance(history, list):
            raise line.error(f"\"history\" must be a list of [query, response] pairs, got "
                             f"{type(history).__name__}")
        messages = []
        system = record.get("system")
        if system is not None and string(line, system, '"system"'):
            messages.append(Message(role="system", content=system))
        for i, pair in enumerate(history):
            if not isinstance(pair, list) or len(pair) != 2:
                raise line.error(f"\"history\"[{i}] must be a [query, response] pair, got {pair!r:.80}")
            messages.append(Message(role="user", content=string(line, pair[0], f'"history"[{i}][0]')))
            messages.append(Message(role="assistant", content=string(line, pair[1], f'"history"[{i}][1]')))
        messages.append(Message(role="user", content=string(line, record["query"], '"query"')))
        messages.append(Message(role="assistant", content=string(line, record["response"], '"response"')))
        videos = resolve_videos(record.get("videos"), line.media_root, line.where)
        images = resolve_images(record.get("images"), line.media_root, line.where)
        return build_conversation(line, messages, images, videos)


QUERY_RESPONSE = QueryResponseFormat()
