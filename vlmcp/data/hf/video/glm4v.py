"""GLM-4.1V videos: ``Glm4vVideoProcessor``'s rules, and no images beside them.

vlmcp runs the video processor's own code on the header (transformers 5.24)::

    frames   its sample_frames on the header's metadata (duration = total / fps): at --video-fps
             (default its fps, 2), frame ceil(i * video_fps / fps) for i < floor(duration * fps)
             (a video longer than max_duration 300 s: int(300 * fps) times spread over it),
             duplicates dropped, the last repeated to an even count; --video-max-frames then
             thins them evenly to at most that many (floored to even; vlmcp's rule)
    size     its smart_resize over the whole video, as Qwen3-VL's (vlmcp.data.hf.video.qwen3_vl:
             size["shortest_edge"], size["longest_edge"], and the same flags)
    text     the processor writes each frame group <|begin_of_image|> + image placeholders +
             <|end_of_image|> + the whole seconds of its first frame, inside the template's
             <|begin_of_video|> ... <|end_of_video|>: video tokens are image placeholders,
             told apart by mm_token_type_ids (2 inside a video)

``--video-min-frames`` is refused (the sampler has no floor). GLM-4.1V's forward fills images
and videos at the same placeholder, so it cannot take both in one row: a conversation with
both is refused at planning, and rows pack image and video conversations apart
(:func:`vlmcp.data.hf.rows.build_index`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlmcp.data.hf.video.qwen3_vl import Qwen3VLRules
from vlmcp.data.hf.video.sampling import floor_to, listed_frames

__all__ = ["GLM4V"]


@dataclass(frozen=True, kw_only=True)
class Glm4vRules(Qwen3VLRules):
    """``Glm4vVideoProcessor``'s sampling and sizes (module docstring)."""

    def check(self, processor, sampling):
        self.source(processor)
        if sampling.min_frames is not None:
            raise ValueError("--video-min-frames: GLM-4.1V's sampler takes ceil(i * fps) frames and has no "
                             "floor; raise --video-fps instead")

    def indices(self, vp, header, sampling):
        from transformers.video_utils import VideoMetadata

        fps = vp.fps if sampling.fps is None else sampling.fps
        if header.fps is None:
            return listed_frames(header.frames, sampling.max_frames or header.frames + 1, 2), float(fps)
        metadata = VideoMetadata(total_num_frames=header.frames, fps=header.fps, height=header.height,
                                 width=header.width, duration=header.frames / header.fps)
        indices = [int(i) for i in vp.sample_frames(metadata, fps=fps)]
        most = sampling.max_frames
        if most is not None and len(indices) > floor_to(most, 2):
            keep = np.linspace(0, len(indices) - 1, floor_to(most, 2)).round().astype(int)
            indices = [indices[k] for k in keep]
        return tuple(indices), header.fps

    def smart_resize(self):
        from transformers.models.glm4v.video_processing_glm4v import smart_resize

        return smart_resize

    def timestamps(self, processor, indices, fps, groups):
        """The processor's: ``metadata.timestamps[::2]``, the last repeated to ``groups``, whole seconds."""
        stamps = [i / fps for i in indices][::2][:groups]
        stamps += stamps[-1:] * (groups - len(stamps))
        return tuple(float(int(s)) for s in stamps)


GLM4V = Glm4vRules(name="glm4v", processors=("Glm4vProcessor",), mixes_images_and_videos=False,
                   video_processor="Glm4vVideoProcessor")
