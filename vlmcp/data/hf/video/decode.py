"""A video's header (frame count, frame rate, size) without decoding, and its planned frames decoded.

Everything a plan needs is in the header: PyAV's stream metadata (a container that does not
store the frame count, like WebM, has its packets counted, which reads the file but decodes
nothing), or, for a video given as frames, the images' headers. So planning knows every
video's token count without decoding (Note [vlmcp data: video frames, sizes and tokens]), and
the ranks decode their row later (:func:`decode_frames`): only the planned frames are kept,
each resized to the plan's size with the model's resample as soon as it is decoded, so a
long video never holds more than its sampled, resized frames. A stream that ends before a
planned frame is a decode failure, as is any PyAV error.
"""

from __future__ import annotations

import io

import numpy as np

from vlmcp.data.hf.schema import Media
from vlmcp.data.hf.video.sampling import VideoHeader, VideoPlan

__all__ = ["decode_frames", "read_header", "require_av"]


def require_av():
    """The ``av`` module (PyAV), or an error that says which extra brings it."""
    try:
        import av
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError("videos are decoded with PyAV, which is not installed: "
                                  "pip install 'vlmcp[hf]' (or pip install av)", name="av") from err
    return av


def _open(av, media: Media):
    return av.open(str(media.path) if media.data is None else io.BytesIO(media.data))


def read_header(media: Media) -> VideoHeader:
    """A video's frame count, frame rate and size, without decoding a frame.

    Raises:
        ModuleNotFoundError: PyAV is not installed (the message says how to install it).
        Exception: whatever PyAV or PIL raise on an unreadable header, and ValueError for a
            header without a video stream, a frame rate or frames, or frames of different sizes.
    """
    if media.frames is not None:
        from PIL import Image

        sizes = []
        for frame in media.frames:
            with Image.open(frame) as im:
                sizes.append((im.height, im.width))
        if len(set(sizes)) > 1:
            k = next(i for i, s in enumerate(sizes) if s != sizes[0])
            raise ValueError(f"frame {media.frames[k]} is {sizes[k][1]}x{sizes[k][0]}, frame "
                             f"{media.frames[0]} {sizes[0][1]}x{sizes[0][0]}: a video's frames share one "
                             "size")
        return VideoHeader(frames=len(sizes), fps=None, height=sizes[0][0], width=sizes[0][1])
    av = require_av()
    with _open(av, media) as container:
        if not container.streams.video:
            raise ValueError("no video stream")
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate
        if not rate or rate <= 0:
            raise ValueError("no frame rate in its header")
        height, width = stream.codec_context.height, stream.codec_context.width
        frames = stream.frames or sum(1 for packet in container.demux(stream) if packet.size)
    if not frames or not height or not width:
        raise ValueError(f"its header says {frames} frames of {width}x{height}")
    return VideoHeader(frames=frames, fps=float(rate), height=height, width=width)


def decode_frames(media: Media, plan: VideoPlan, resample: int) -> np.ndarray:
    """The planned frames, decoded and resized to the plan's size: ``uint8[n, H', W', 3]`` (RGB).

    Raises:
        ModuleNotFoundError: PyAV is not installed.
        Exception: whatever PyAV or PIL raise, and ValueError when the stream ends before a
            planned frame.
    """
    from PIL import Image

    def resized(rgb) -> np.ndarray:
        image = rgb if isinstance(rgb, Image.Image) else Image.fromarray(rgb)
        return np.asarray(image.convert("RGB").resize((plan.width, plan.height), resample=resample))

    wanted = set(plan.indices)
    last = max(wanted)
    got: dict[int, np.ndarray] = {}
    if media.frames is not None:
        for i in sorted(wanted):
            with Image.open(media.frames[i]) as im:
                got[i] = resized(im)
    else:
        av = require_av()
        seen = 0
        with _open(av, media) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for seen, frame in enumerate(container.decode(stream), start=1):
                if seen - 1 in wanted:
                    got[seen - 1] = resized(frame.to_ndarray(format="rgb24"))
                if seen > last:
                    break
        if len(got) < len(wanted):
            raise ValueError(f"the stream ends after {seen} frames; its header says {plan.total}")
    return np.stack([got[i] for i in plan.indices])
