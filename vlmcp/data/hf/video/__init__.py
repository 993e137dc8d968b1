"""Videos in the data pipeline: which frames, at what size, from the header; decoding; model inputs.

One module per step and one per model family (Note [vlmcp data: video frames, sizes and
tokens] in :mod:`~vlmcp.data.hf.video.rules` has the table of every family's rules):

* :mod:`~vlmcp.data.hf.video.sampling`: the ``--video-*`` settings (:class:`VideoSampling`), a
  video's :class:`VideoHeader` and :class:`VideoPlan`;
* :mod:`~vlmcp.data.hf.video.decode`: :func:`read_header` without decoding, :func:`decode_frames`
  of the planned frames only (PyAV);
* :mod:`~vlmcp.data.hf.video.rules`: :class:`VideoRules`, the family interface, and
  :func:`video_rules`, the processor's family;
* the families: :mod:`~vlmcp.data.hf.video.qwen2_vl` (Qwen2-VL, Qwen2.5-VL: qwen-vl-utils),
  :mod:`~vlmcp.data.hf.video.qwen3_vl` (Qwen3-VL, Qwen3.5 and their MoE),
  :mod:`~vlmcp.data.hf.video.glm4v` (GLM-4.1V), :mod:`~vlmcp.data.hf.video.llava_onevision`;
  :mod:`~vlmcp.data.hf.video.frames` holds what the video-processor families share. This
  package registers them (:func:`register_video_rules`), as :mod:`vlmcp.hf.adapters` does its
  architectures: adding a family is adding a module and its line here.

The processor call that takes vlmcp's pixels is :mod:`vlmcp.data.hf.video_processor`.
Nothing here imports transformers at import time.
"""

from vlmcp.data.hf.video.decode import decode_frames, read_header, require_av
from vlmcp.data.hf.video.glm4v import GLM4V
from vlmcp.data.hf.video.llava_onevision import LLAVA_ONEVISION
from vlmcp.data.hf.video.qwen2_vl import QWEN2_VL, Patching, frame_bounds, plan_video, sample_indices
from vlmcp.data.hf.video.qwen3_vl import QWEN3_VL
from vlmcp.data.hf.video.rules import VideoRules, register_video_rules, video_processors, video_rules
from vlmcp.data.hf.video.sampling import VideoHeader, VideoPlan, VideoSampling

__all__ = ["Patching", "VideoHeader", "VideoPlan", "VideoRules", "VideoSampling", "decode_frames",
           "frame_bounds", "plan_video", "read_header", "register_video_rules", "require_av",
           "sample_indices", "video_processors", "video_rules"]

for _rules in (QWEN2_VL, QWEN3_VL, GLM4V, LLAVA_ONEVISION):
    register_video_rules(_rules)
