"""Structured message content: a list of typed parts -> text with ``<image>`` / ``<video>`` placeholders.

==========================================================  ============================
part                                                        source
==========================================================  ============================
``{"type": "text", "value": "..."}``                        LLaMA-Factory v1
``{"type": "image_url", "value": "a.png"}``                 LLaMA-Factory v1
``{"type": "text", "text": "..."}``                         OpenAI, transformers
``{"type": "image_url", "image_url": {"url": "a.png"}}``    OpenAI (``image_url`` may be the string)
``{"type": "image", "image"|"path"|"url"|"base64": ...}``   transformers chat templates
``{"type": "video", "video"|"path"|"url": ...}``            transformers, qwen-vl-utils (a
                                                            video file, directory, or list
                                                            of frame paths)
``{"type": "video_url", "video_url": {"url": ...}}``        OpenAI-style (or the string)
``{"type": "video_url", "value": "a.mp4"}``                 LLaMA-Factory v1
==========================================================  ============================

The parts are joined in order with nothing between them (as the chat templates render
them), each image part becoming one ``<image>``, each video part one ``<video>``. A literal
``<image>`` or ``<video>`` in a text part is an error: it would read as a second
placeholder. Any other part type, or a key a part does not have, is refused: a
qwen-vl-utils video part's own sampling keys (``fps``, ``max_pixels``, ``nframes``, ...)
included, since vlmcp samples every video by ``--video-fps`` and the like.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vlmcp.data.hf.formats.base import Line
from vlmcp.data.hf.schema import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER

__all__ = ["read_parts"]

_VALUE_KEYS: dict[str, tuple[str, ...]] = {
    "text": ("text", "value"),
    "image": ("image", "path", "url", "base64"),
    "image_url": ("image_url", "value"),
    "video": ("video", "path", "url"),
    "video_url": ("video_url", "value"),
}
"""Each part type and the keys that may hold its value (exactly one per part)."""
_VIDEO_TYPES = ("video", "video_url")


def _media_spec(line: Line, what: str, key: str, value: Any) -> Any:
    """The part's image or video as a :mod:`~vlmcp.data.hf.media` spec."""
    if key == "base64":
        return {"bytes": value}
    if key in ("image_url", "video_url") and isinstance(value, Mapping):  # OpenAI: {"url", "detail"?}
        if set(value) != {"url"}:
            raise line.error(f"{what}: \"{key}\" must be {{\"url\": ...}}, got keys {sorted(value)} "
                             "(\"detail\" and the like change how the media is read; vlmcp does not "
                             "honour them)")
        return value["url"]
    return value


def read_parts(line: Line, parts: list, what: str) -> tuple[str, list[Any], list[Any]]:
    """A message's list of parts as text, and its image and video specs in placeholder order.

    Args:
        line: the line being read (for errors).
        parts: the message's ``content``.
        what: how errors name the message, e.g. ``message 2``.

    Returns:
        ``(text, images, videos)``: the parts joined, one ``<image>`` per image part and one
        ``<video>`` per video part, and the parts' specs, still to resolve.
    """
    if not parts:
        raise line.error(f"{what}'s content is an empty list of parts")
    pieces, images, videos = [], [], []
    for j, part in enumerate(parts):
        here = f"{what}, part {j}"
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise line.error(f"{here} must be an object with a \"type\", got {part!r:.80}")
        kind = part["type"]
        accepted = _VALUE_KEYS.get(kind)
        if accepted is None:
            raise line.error(f"{here} has type {kind!r}; vlmcp reads parts of type "
                             f"{', '.join(_VALUE_KEYS)}")
        keys = [k for k in part if k != "type"]
        if len(keys) != 1 or keys[0] not in accepted:
            sampling = (" (vlmcp samples every video by --video-fps, --video-max-frames and "
                        "--video-*-pixels)") if kind in _VIDEO_TYPES else ""
            raise line.error(f"{here} ({kind}) needs exactly one of the keys {', '.join(accepted)}, "
                             f"got {keys}{sampling}")
        value = part[keys[0]]
        if kind == "text":
            if not isinstance(value, str):
                raise line.error(f"{here}: the text must be a string, got {type(value).__name__}")
            for placeholder in (IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER):
                if placeholder in value:
                    raise line.error(f"{here}: a text part holds a literal {placeholder}; in structured "
                                     "content media are parts of their own, so it would be ambiguous")
            pieces.append(value)
        elif kind in _VIDEO_TYPES:
            pieces.append(VIDEO_PLACEHOLDER)
            videos.append(_media_spec(line, here, keys[0], value))
        else:
            pieces.append(IMAGE_PLACEHOLDER)
            images.append(_media_spec(line, here, keys[0], value))
    return "".join(pieces), images, videos
