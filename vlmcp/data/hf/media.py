"""Image specs of a ``--data`` line -> :class:`~vlmcp.data.hf.conversation.Media`.

Every format names its images the way LLaMA-Factory, ms-swift, LLaVA and transformers do;
this module turns each into a local file or inline bytes, or refuses it:

=====================================  ======================================================
spec                                   becomes
=====================================  ======================================================
``"a.png"``, ``"/abs/a.png"``          that file; a relative path starts at ``--image-root``,
                                       else at the data file's directory (``~`` expanded)
``"file:///abs/a.png"``                that file
``"data:image/png;base64,..."``        the decoded bytes
``{"path": "a.png"}``                  the file, as a string spec (ms-swift, LLaMA-Factory)
``{"bytes": "<base64>"}``              the decoded bytes: JSON has no bytes, so inline images
                                       are base64 text (what ``datasets``' ``to_json`` writes)
``{"bytes": ..., "path": ...}``        the bytes when not null, else the path: a Hugging Face
                                       ``datasets`` ``Image`` column, where ``path`` is only the
                                       original file name once the bytes are embedded
``"http://..."``, ``"s3://..."``, ...  refused: vlmcp reads local files only
=====================================  ======================================================

Videos are refused for now by :func:`resolve_videos`, the one place a later issue
replaces. A missing file is named here; whether it decodes is checked while planning
(``build_index``), which names the line too.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from vlmcp.data.hf.conversation import Media

__all__ = ["resolve_image", "resolve_images", "resolve_videos"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_DATA_URL = re.compile(r"^data:[^,;]*(?:;[^,;]*)*;base64,(.*)$", re.DOTALL)


def _decode(text: Any, where: str, what: str) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"{where}: {what} must be base64 text (JSON has no bytes), got "
                         f"{type(text).__name__}")
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: {what} is not valid base64") from None
    if not data:
        raise ValueError(f"{where}: {what} is empty")
    return data


def _from_string(spec: str, root: Path, where: str) -> Media:
    if spec.startswith("data:"):
        match = _DATA_URL.match(spec)
        if match is None:
            raise ValueError(f"{where}: only base64 data URLs are read (data:<type>;base64,...), got "
                             f"{spec[:40]!r}")
        return Media("image", data=_decode(match.group(1), where, "the data URL"))
    if _URL.match(spec):
        url = urlparse(spec)
        if url.scheme.lower() != "file" or url.netloc not in ("", "localhost"):
            raise ValueError(f"{where}: images must be local files (URL given: {spec})")
        spec = unquote(url.path)
    if not spec.strip():
        raise ValueError(f"{where}: an image path is empty")
    name = os.path.expanduser(spec)
    path = Path(name) if os.path.isabs(name) else root / name
    if not path.exists():
        raise ValueError(f"{where}: image file {path} does not exist")
    if not path.is_file():
        raise ValueError(f"{where}: image {path} is not a file")
    return Media("image", path=path)


def resolve_image(spec: Any, root: Path, where: str) -> Media:
    """One image spec (see the module table) as a :class:`Media`.

    Args:
        spec: a path / URL string, or a dict with ``path`` and/or ``bytes``.
        root: where relative paths start (``--image-root``, else the data file's directory).
        where: ``file:line``, the prefix of every error.

    Raises:
        ValueError: a URL, a missing file, bad base64, or a spec of another shape.
    """
    if isinstance(spec, str):
        return _from_string(spec, root, where)
    if isinstance(spec, Mapping):
        unknown = sorted(set(spec) - {"path", "bytes"})
        if unknown:
            raise ValueError(f"{where}: an image given as an object has keys \"path\" and/or \"bytes\"; "
                             f"unknown key(s) {unknown}")
        if spec.get("bytes") is not None:
            return Media("image", data=_decode(spec["bytes"], where, 'an image\'s "bytes"'))
        if spec.get("path") is not None:
            if not isinstance(spec["path"], str):
                raise ValueError(f"{where}: an image's \"path\" must be a string, got {spec['path']!r}")
            return _from_string(spec["path"], root, where)
        raise ValueError(f"{where}: an image object has neither \"path\" nor \"bytes\": {dict(spec)!r}")
    raise ValueError(f"{where}: an image must be a path or an object with \"path\" or \"bytes\", got "
                     f"{type(spec).__name__}")


def resolve_images(specs: Any, root: Path, where: str, key: str = "images") -> tuple[Media, ...]:
    """A line's image column: one spec, a list of specs, or null / ``[]`` for none."""
    if specs is None:
        return ()
    if isinstance(specs, (str, Mapping)):
        specs = [specs]
    if not isinstance(specs, list):
        raise ValueError(f"{where}: \"{key}\" must be an image or a list of images, got "
                         f"{type(specs).__name__}")
    return tuple(resolve_image(s, root, where) for s in specs)


def resolve_videos(specs: Any, where: str, what: str = "videos") -> tuple[Media, ...]:
    """A line's videos: none yet. Null or ``[]`` is no video; anything else is refused.

    The one place video support replaces: every format sends its video column, video
    parts and ``<video>`` placeholders here.
    """
    if specs is None or specs == []:
        return ()
    raise ValueError(f"{where}: videos are not trained by vlmcp yet ({what}); remove the video(s) "
                     "or the line, rather than train on a <video> placeholder as text")
