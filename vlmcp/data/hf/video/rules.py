"""The interface each video family fills in, and the registry that finds a processor's family.

The package (:mod:`vlmcp.data.hf.video`) registers the families; a new one is a module with a
:class:`VideoRules` subclass, registered with :func:`register_video_rules`.

Note [vlmcp data: video frames, sizes and tokens]
-------------------------------------------------
A video becomes model inputs in three steps, each from the header alone until the last:
which frames (``indices``), at what size (``H' x W'``), and how the processor writes them
(tokens, timestamps). Each family follows its model's own processor (transformers 5.24, 5.25);
the flags mean the same thing everywhere, and an unset flag takes the model's default:

* Qwen2-VL, Qwen2.5-VL (``Qwen2VLProcessor``, ``Qwen2_5_VLProcessor``; :mod:`.qwen2_vl`):
  qwen-vl-utils. Frames: ``n = duration * fps`` within ``[min_frames, max_frames]``, floored to
  a multiple of T, ``linspace`` rounded. Size: ``smart_resize`` of each frame within
  ``[min_px, max_px]``, ``max_px <= total_pixels / n * T``. Text: one run of ``<|video_pad|>``.
* Qwen3-VL, Qwen3.5 and their MoE (``Qwen3VLProcessor``; :mod:`.qwen3_vl`): the video
  processor's ``sample_frames`` (``n = int(duration * fps)`` within ``[min_frames,
  max_frames]``, ``linspace`` rounded; an odd n gets its last frame repeated) and its
  ``smart_resize``, which bounds the whole video, ``t * H' * W'``, by ``[shortest_edge,
  longest_edge]``. Text: per frame group ``<t seconds>``, vision start, pads, vision end.
* GLM-4.1V (``Glm4vProcessor``; :mod:`.glm4v`): its ``sample_frames`` (frame ``ceil(i *
  video_fps / fps)``, duplicates dropped, an even count) and Qwen3-VL's kind of
  ``smart_resize``. Text: per frame group image start, image pads, image end, whole seconds.
* LLaVA-OneVision (``LlavaOnevisionProcessor``; :mod:`.llava_onevision`): exactly
  ``max_frames`` frames (default 32), ``linspace`` (LLaVA's uniform sampling), at the video
  processor's fixed size. Text: one run of ``<video>``, ``n * pooled^2 + 1`` (a newline).

Flags over every family: ``--video-fps`` frames per second of video (not LLaVA-OneVision,
which takes a fixed count: refused there), ``--video-min-frames`` / ``--video-max-frames``
bounds on the count (GLM-4.1V: ``--video-max-frames`` evenly thins what its sampler takes;
LLaVA-OneVision: ``--video-max-frames`` is the count), ``--video-min-pixels`` /
``--video-max-pixels`` per frame, ``--video-total-pixels`` per video (Qwen3-VL and GLM-4.1V
count their bounds over the whole video, ``t * H' * W'``, as their ``smart_resize`` does:
the per-frame flags become ``n`` times themselves there; LLaVA-OneVision's frames have one
size, so the budget caps the frame count and the per-frame bounds are refused). The tokens
are ``(t * H'/p * W'/p) / merge^2`` (t = ceil(n / T)), LLaVA-OneVision ``n * ceil(S/p / 2)^2 + 1``.

Frames given as images (a directory or a list) have no fps: all are taken, the last
repeated up to a multiple of T, or past ``max_frames`` that many evenly; they count as
sampled at ``fps`` (their timestamps too).

What matches transformers exactly, and what within rounding (tests/test_video_data.py,
tests/test_video_families.py, tests/test_demo_data.py): the frame indices (the video
processors' own ``sample_frames`` run on the header's metadata, as transformers' PyAV reader
fills it), the sizes (their own ``smart_resize``), the expanded text and its token ids (the
processor's own ``replace_video_token`` and ``get_text_with_replacements`` at planning, which
each version may override, Note [vlmcp data: the processor's own expansion]; its own call with
vlmcp's pixels at training, so timestamps, markers, the template's wrapper around a video and
``mm_token_type_ids`` are transformers'), ``video_grid_thw``, and the pixel layout and values
for the same resized frames (their own ``patchify``; the fused rescale-normalize written out,
bit for bit). Within rounding: the resize. vlmcp resizes with
PIL (the image processor's resample), transformers' video processors with torchvision's
antialiased resize, which is not installable for every torch: at most 2 levels of 255 apart
(1 in most videos) in about 0.1% of the values where a frame is resized (``docs/data.md``).
qwen-vl-utils differs from transformers for Qwen3-VL (it caps pixels per frame and floors
the count to a multiple of T); vlmcp follows the model's processor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmcp.data.hf.video.sampling import VideoHeader, VideoPlan, VideoSampling

__all__ = ["VideoRules", "register_video_rules", "video_processors", "video_rules"]


@dataclass(frozen=True, kw_only=True)
class VideoRules:
    """One family's video rules: the plan from a header, the pixels from decoded frames.

    Subclasses fill in :meth:`plan` and :meth:`pixels`; the processor expands the text
    itself (:func:`vlmcp.data.hf.video_processor.replacement_texts`).
    """

    name: str
    """Display name, e.g. ``"qwen3_vl"``."""
    processors: tuple[str, ...]
    """Processor class names served."""
    mixes_images_and_videos: bool = True
    """False where the model's forward cannot take images and videos in one row (GLM-4.1V)."""

    def check(self, processor, sampling: VideoSampling) -> None:
        """Raise ``ValueError`` naming a flag this family cannot honour, or a processor without
        what it needs (before any video is read: a setting's fault, never a video's)."""
        self.source(processor)

    def plan(self, processor, header: VideoHeader, sampling: VideoSampling) -> VideoPlan:
        """The frames, size and tokens of a video with this header.

        Raises:
            ValueError: too few frames, or a size the model refuses.
        """
        raise NotImplementedError

    def resample(self, processor) -> int:
        """PIL's filter for resizing frames (the processor's own resample)."""
        return int(self.source(processor).resample)

    def source(self, processor):
        """The sub-processor whose parameters size and normalize frames."""
        return processor.image_processor

    def pixels(self, processor, frames, plan: VideoPlan) -> dict[str, torch.Tensor]:
        """The model's video inputs of one video's decoded, resized frames ``uint8[n, H', W', 3]``."""
        raise NotImplementedError

    def metadata(self, plan: VideoPlan):
        """transformers' ``VideoMetadata`` of the planned video (what its decoder would have filled)."""
        from transformers.video_utils import VideoMetadata

        return VideoMetadata(total_num_frames=plan.total, fps=plan.fps, height=plan.height, width=plan.width,
                             duration=plan.total / plan.fps, frames_indices=list(plan.indices))


_RULES: dict[str, VideoRules] = {}


def register_video_rules(rules: VideoRules) -> None:
    """Serve ``rules.processors`` with ``rules`` (replacing earlier ones)."""
    for name in rules.processors:
        _RULES[name] = rules


def video_processors() -> tuple[str, ...]:
    """Processor class names whose videos vlmcp encodes."""
    return tuple(_RULES)


def video_rules(processor) -> VideoRules:
    """The rules of ``processor``'s videos.

    Raises:
        ValueError: a processor whose videos vlmcp does not encode (the message names those it does).
    """
    name = type(processor).__name__
    rules = _RULES.get(name)
    if rules is None or getattr(processor, "video_token", None) is None:
        raise ValueError(f"vlmcp encodes videos for {', '.join(_RULES)}, not {name}; drop the video lines, "
                         "or give the frames as images")
    return rules
