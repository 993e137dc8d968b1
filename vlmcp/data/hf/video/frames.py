"""What the video-processor families share: their video processor's config, its normalization, and
patching T frames at a time with its own ``patchify`` (Qwen3-VL, Qwen3.5, GLM-4.1V).

transformers' video processors resize with torchvision (not installable for every torch);
everything after the resize is plain torch. vlmcp resizes with PIL
(:func:`vlmcp.data.hf.video.decode.decode_frames`) and runs the rest as transformers does:
the fused rescale-normalize of ``TorchvisionBackend.rescale_and_normalize`` (mean and std
times 1/rescale_factor, then ``(x - mean) / std`` in float32: ``tvF.normalize``'s arithmetic)
and the processor's own ``patchify``, a chunk of frames at a time (chunks of a multiple of
T frames give consecutive rows of the output, which is ``t``-major).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["normalized", "patchified", "video_processor_of"]


def video_processor_of(processor, cls_name: str):
    """``processor.video_processor``, checked to be ``cls_name`` (its config sizes the frames).

    Raises:
        ValueError: the processor has none (a directory without its video processor's config).
    """
    vp = getattr(processor, "video_processor", None)
    needs = "size" if cls_name == "LlavaOnevisionVideoProcessor" else "patch_size"
    if vp is None or not hasattr(vp, needs):
        raise ValueError(f"{type(processor).__name__}'s videos are sized by its {cls_name}, which this model "
                         "directory does not configure (processor_config.json's video_processor or "
                         "video_preprocessor_config.json); vlmcp init-model writes one")
    return vp


def normalized(vp, frames: torch.Tensor) -> torch.Tensor:
    """``frames uint8[..., 3, H, W]`` rescaled and normalized as ``vp`` does it: float32."""
    x = frames.to(torch.float32)
    if vp.do_rescale and vp.do_normalize:  # fused, as TorchvisionBackend._fuse_mean_std_and_rescale_factor
        mean = torch.tensor(vp.image_mean) * (1.0 / vp.rescale_factor)
        std = torch.tensor(vp.image_std) * (1.0 / vp.rescale_factor)
        return x.sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
    if vp.do_normalize:
        mean, std = torch.tensor(vp.image_mean), torch.tensor(vp.image_std)
        return x.sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
    if vp.do_rescale:
        return x * vp.rescale_factor
    return x


def patchified(vp, frames: np.ndarray, chunk: int = 32) -> tuple[torch.Tensor, list[int]]:
    """``(pixel_values_videos, [t, H'/p, W'/p])`` of resized frames ``uint8[n, H', W', 3]`` (module doc).

    ``chunk`` frames at a time (rounded to a multiple of T) bound the float copies.
    """
    T = vp.temporal_patch_size
    step = max(T, chunk // T * T)
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)  # (n, 3, H', W')
    parts, t = [], 0
    for start in range(0, video.shape[0], step):
        part = normalized(vp, video[start:start + step])[None]
        rows, gt, gh, gw = vp.patchify(part, patch_size=vp.patch_size, merge_size=vp.merge_size,
                                       temporal_patch_size=T)
        parts.append(rows[0])
        t += gt
    return torch.cat(parts), [t, gh, gw]
