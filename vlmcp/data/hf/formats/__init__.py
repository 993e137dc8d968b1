"""``--data`` formats: one file per format, one typed interface, a registry.

==================  ====================================================================
format              one line
==================  ====================================================================
``messages``        ``{"messages": [{"role": "user", "content": "<image>Who?"}, {"role": "assistant",
                    "content": "Kane.", "loss": true}], "images": ["1.jpg"], "system": "..."}``
                    (ms-swift, LLaMA-Factory OpenAI-style; ``content`` may be a list of parts)
``messages``        ``{"conversations": [{"from": "human", "value": "<image>Who?"}, {"from":
                    "function_call", "value": "{\\"name\\": ...}"}, {"from": "observation", ...},
                    {"from": "gpt", "value": "Kane."}], "images": [...], "tools": "[...]"}``
                    (LLaMA-Factory sharegpt)
``query_response``  ``{"query": "<image>And now?", "response": "A square.", "history": [["Q1",
                    "A1"]], "system": "...", "images": ["a.png"]}`` (ms-swift)
``llava``           ``{"id": "1", "image": "a.png", "conversations": [{"from": "human", "value":
                    "<image>\\nWhat is this?"}, {"from": "gpt", "value": "A bus."}]}``
==================  ====================================================================

Each format's module documents its keys and rules; :mod:`~vlmcp.data.hf.formats.registry`
says which format reads a line (LLaVA vs sharegpt included). Adding a format is adding a
file with a :class:`DataFormat` subclass and calling :func:`register_format`.
"""

from __future__ import annotations

from vlmcp.data.hf.formats.base import (
    METADATA_KEYS,
    DataFormat,
    Detection,
    Line,
    build_conversation,
    check_keys,
)
from vlmcp.data.hf.formats.llava import LLAVA
from vlmcp.data.hf.formats.messages import MESSAGES
from vlmcp.data.hf.formats.query_response import QUERY_RESPONSE
from vlmcp.data.hf.formats.registry import certain_formats, data_formats, read_record, register_format

__all__ = ["METADATA_KEYS", "DataFormat", "Detection", "Line", "build_conversation", "certain_formats",
           "check_keys", "data_formats", "read_record", "register_format"]

for _f in (MESSAGES, QUERY_RESPONSE, LLAVA):
    register_format(_f)
