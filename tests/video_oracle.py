"""transformers' own video processors run without torchvision, as the oracle of vlmcp's video data.

transformers' video processors call torchvision for three things only: the resize, the
normalize and (with ``do_convert_rgb``) ``grayscale_to_rgb``. :func:`torchvision_free` puts a
stand-in ``tvF`` in their modules for the duration of a test: ``normalize`` is
``tvF.normalize``'s arithmetic (``(x - mean) / std``), and ``resize`` is torchvision 0.28's
``resize_image`` for a uint8 CPU tensor, which hands the tensor to torch's own kernel,
``interpolate(mode, align_corners=False, antialias=True)`` on uint8 (its "native uint8
resize on CPU" branch for bicubic). So everything the processor computes (frame sampling,
sizes, the text with its timestamps, ids, grids, pixels) is transformers' code, and the
resize is the kernel torchvision itself would run.
"""

from __future__ import annotations

import contextlib
import enum
import sys
import types

import torch
from torch.nn import functional as F


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def _resize(image: torch.Tensor, size, interpolation=InterpolationMode.BILINEAR, antialias=True, **_):
    """torchvision 0.28's ``resize_image`` for a uint8 tensor on the CPU (bicubic: native uint8)."""
    new_h, new_w = int(size[0]), int(size[1])
    if (new_h, new_w) == tuple(image.shape[-2:]):
        return image
    shape = image.shape
    flat = image.reshape(-1, *shape[-3:])
    if interpolation not in (InterpolationMode.BICUBIC, InterpolationMode.BILINEAR) or \
            flat.dtype != torch.uint8:
        raise NotImplementedError(f"the test stand-in resizes uint8 bicubic/bilinear, not {interpolation}")
    out = F.interpolate(flat, size=[new_h, new_w], mode=interpolation.value, align_corners=False,
                        antialias=antialias)
    return out.reshape(*shape[:-2], new_h, new_w)


def _normalize(x: torch.Tensor, mean, std, inplace=False):
    mean = torch.as_tensor(mean, dtype=x.dtype).view(-1, 1, 1)
    std = torch.as_tensor(std, dtype=x.dtype).view(-1, 1, 1)
    return (x.sub_(mean) if inplace else x - mean).div_(std)


@contextlib.contextmanager
def torchvision_free():
    """transformers' image/video backends with the stand-in ``tvF`` (module docstring)."""
    from PIL import Image

    tvF = types.SimpleNamespace(InterpolationMode=InterpolationMode, resize=_resize, normalize=_normalize)
    mapping = {Image.Resampling.BICUBIC: InterpolationMode.BICUBIC,
               Image.Resampling.BILINEAR: InterpolationMode.BILINEAR}
    missing = object()
    patches = []
    for name in ("transformers.image_processing_backends", "transformers.video_processing_utils"):
        module = sys.modules[name]
        for attr, value in (("tvF", tvF), ("pil_torch_interpolation_mapping", mapping)):
            if attr == "tvF" or hasattr(module, attr):
                patches.append((module, attr, module.__dict__.get(attr, missing)))
                setattr(module, attr, value)
    try:
        yield
    finally:
        for module, attr, old in patches:
            if old is missing:
                delattr(module, attr)
            else:
                setattr(module, attr, old)


def transformers_inputs(processor, text: str, frames, video_fps: float, **kwargs):
    """transformers' processor on a whole decoded video ``uint8[N, H, W, 3]`` (``video_fps`` a second):
    its own sampling (``do_sample_frames``), resize, normalize, patches and text; ``kwargs`` go to
    the call (``fps=``, ``size=``, ...)."""
    from transformers.video_utils import VideoMetadata

    metadata = VideoMetadata(total_num_frames=len(frames), fps=video_fps, duration=len(frames) / video_fps,
                             height=frames.shape[1], width=frames.shape[2])
    with torchvision_free():
        return processor(text=[text], videos=[frames], video_metadata=[metadata], do_convert_rgb=False,
                         return_tensors="pt", **{"do_sample_frames": True, **kwargs})


def decoded(path):
    """Every frame of a video file ``uint8[N, H, W, 3]`` and its frame rate (transformers' PyAV reader's)."""
    import av
    import numpy as np

    with av.open(str(path)) as container:
        fps = float(container.streams.video[0].average_rate)
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)]), fps
