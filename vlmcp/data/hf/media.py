"""Image and video specs of a ``--data`` line -> :class:`~vlmcp.data.hf.schema.Media`.

Every format names its images and videos the way LLaMA-Factory, ms-swift, LLaVA and
transformers do; this module turns each into a local file or inline bytes, or refuses it:

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

A video (:func:`resolve_video`) is any of the same specs naming a video file (mp4, avi,
webm, mov, mkv, ...: whatever PyAV decodes), or a **directory of frames** (its image files,
in natural order: ``2.jpg`` before ``10.jpg``; any other file in it is refused), or a
**list of frame paths** (LLaMA-Factory's and qwen-vl-utils' form: ``"videos": [["f1.jpg",
"f2.jpg"]]``). A missing file is named here; whether it decodes is checked while planning
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

from vlmcp.data.hf.schema import Media

__all__ = ["FRAME_SUFFIXES", "resolve_image", "resolve_images", "resolve_video", "resolve_videos"]

FRAME_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
"""Image files that are a video's frames (in a directory of frames); also what a video file is not."""

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


def _local_path(spec: str, root: Path, where: str, kind: str) -> Path:
    """A path or ``file://`` URL string as an existing local path."""
    if _URL.match(spec):
        url = urlparse(spec)
        if url.scheme.lower() != "file" or url.netloc not in ("", "localhost"):
            raise ValueError(f"{where}: {kind}s must be local files (URL given: {spec})")
        spec = unquote(url.path)
    if not spec.strip():
        raise ValueError(f"{where}: an {kind} path is empty" if kind == "image" else
                         f"{where}: a {kind} path is empty")
    name = os.path.expanduser(spec)
    path = Path(name) if os.path.isabs(name) else root / name
    if not path.exists():
        raise ValueError(f"{where}: {kind} file {path} does not exist")
    return path


def _from_string(spec: str, root: Path, where: str, kind: str = "image") -> Media:
    if spec.startswith("data:"):
        match = _DATA_URL.match(spec)
        if match is None:
            raise ValueError(f"{where}: only base64 data URLs are read (data:<type>;base64,...), got "
                             f"{spec[:40]!r}")
        return Media(kind, data=_decode(match.group(1), where, "the data URL"))
    path = _local_path(spec, root, where, kind)
    if kind == "video":
        if path.is_dir():
            return Media("video", path=path, frames=_frames_of(path, where))
        if path.suffix.lower() in FRAME_SUFFIXES:
            raise ValueError(f"{where}: video {path} is an image; a video is a video file, a directory of "
                             "frames, or a list of frame paths")
    if not path.is_file():
        raise ValueError(f"{where}: {kind} {path} is not a file")
    return Media(kind, path=path)


def _natural(name: str) -> list:
    """``frame_10`` after ``frame_2``: digit runs compare as numbers."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name) if t]


def _frames_of(directory: Path, where: str) -> tuple[Path, ...]:
    """A directory's frames: its image files in natural order (hidden files aside; any other
    file is refused rather than skipped, so nothing a user put there is dropped unseen)."""
    files = [p for p in directory.iterdir() if not p.name.startswith(".")]
    others = sorted(p.name for p in files if p.suffix.lower() not in FRAME_SUFFIXES or not p.is_file())
    if others:
        raise ValueError(f"{where}: video directory {directory} holds {others[0]!r}, which is not a frame "
                         f"(frames are {', '.join(FRAME_SUFFIXES)} files); remove it")
    if not files:
        raise ValueError(f"{where}: video directory {directory} holds no frame")
    return tuple(sorted(files, key=lambda p: _natural(p.name)))


def _resolve(spec: Any, root: Path, where: str, kind: str) -> Media:
    article = "an" if kind == "image" else "a"
    if isinstance(spec, str):
        return _from_string(spec, root, where, kind)
    if isinstance(spec, Mapping):
        unknown = sorted(set(spec) - {"path", "bytes"})
        if unknown:
            raise ValueError(f"{where}: {article} {kind} given as an object has keys \"path\" and/or "
                             f"\"bytes\"; unknown key(s) {unknown}")
        if spec.get("bytes") is not None:
            return Media(kind, data=_decode(spec["bytes"], where, f'{article} {kind}\'s "bytes"'))
        if spec.get("path") is not None:
            if not isinstance(spec["path"], str):
                raise ValueError(f"{where}: {article} {kind}'s \"path\" must be a string, got "
                                 f"{spec['path']!r}")
            return _from_string(spec["path"], root, where, kind)
        raise ValueError(f"{where}: {article} {kind} object has neither \"path\" nor \"bytes\": "
                         f"{dict(spec)!r}")
    raise ValueError(f"{where}: {article} {kind} must be a path or an object with \"path\" or \"bytes\""
                     f"{', or a list of frame paths' if kind == 'video' else ''}, got {type(spec).__name__}")


def resolve_image(spec: Any, root: Path, where: str) -> Media:
    """One image spec (see the module table) as a :class:`Media`.

    Args:
        spec: a path / URL string, or a dict with ``path`` and/or ``bytes``.
        root: where relative paths start (``--image-root``, else the data file's directory).
        where: ``file:line``, the prefix of every error.

    Raises:
        ValueError: a URL, a missing file, bad base64, or a spec of another shape.
    """
    return _resolve(spec, root, where, "image")


def resolve_video(spec: Any, root: Path, where: str) -> Media:
    """One video spec (see the module docstring) as a :class:`Media` of kind ``"video"``.

    Args:
        spec: as :func:`resolve_image` takes, naming a video file or a directory of frames; or
            a list of frame specs (path strings), the frames in order.
        root: where relative paths start.
        where: ``file:line``.

    Raises:
        ValueError: a URL, a missing file or frame, an image given as a video, a directory
            holding something other than frames, bad base64, or a spec of another shape.
    """
    if isinstance(spec, list):
        if not spec:
            raise ValueError(f"{where}: a video given as a list of frames has no frame")
        frames = []
        for frame in spec:
            if not isinstance(frame, str):
                raise ValueError(f"{where}: a video's frames must be path strings, got "
                                 f"{type(frame).__name__}")
            path = _local_path(frame, root, where, "frame")
            if not path.is_file():
                raise ValueError(f"{where}: frame {path} is not a file")
            frames.append(path)
        return Media("video", frames=tuple(frames))
    return _resolve(spec, root, where, "video")


def _resolve_column(specs: Any, root: Path, where: str, key: str, kind: str, resolve) -> tuple[Media, ...]:
    """A line's ``kind`` column: one spec, a list of specs, or null / ``[]`` for none."""
    if specs is None:
        return ()
    if isinstance(specs, (str, Mapping)):
        specs = [specs]
    if not isinstance(specs, list):
        raise ValueError(f"{where}: \"{key}\" must be {'an' if kind == 'image' else 'a'} {kind} or a list of "
                         f"{kind}s, got {type(specs).__name__}")
    return tuple(resolve(s, root, where) for s in specs)


def resolve_images(specs: Any, root: Path, where: str, key: str = "images") -> tuple[Media, ...]:
    """A line's image column: one spec, a list of specs, or null / ``[]`` for none."""
    return _resolve_column(specs, root, where, key, "image", resolve_image)


def resolve_videos(specs: Any, root: Path, where: str, key: str = "videos") -> tuple[Media, ...]:
    """A line's video column: one spec, a list of specs, or null / ``[]`` for none.

    A list of strings is that many videos; a video given as its frames is a list inside
    the list (``[["f1.jpg", "f2.jpg"]]``), as LLaMA-Factory writes it.
    """
    return _resolve_column(specs, root, where, key, "video", resolve_video)
