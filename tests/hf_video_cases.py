"""Rank functions for the video / sharded-visual-token HF tests (importable by name from spawned ranks).

Each function runs a whole grid inside one spawned group (spawning costs seconds).
"""

from __future__ import annotations

import torch.distributed as dist

from vlmcp.hf.verify import HFParityCase, hf_parity, reference_for

# A packed row with a video sample, a text-only sample and a sample mixing an image, a video
# (Qwen2.5-VL: 0.5 s per temporal patch group) and another image, text between; Qwen-VL grids.
VIDEO_PACKED = ((5, ("video", 3, 4, 4), 9), (12,),
                (3, (1, 4, 8), 4, ("video", 2, 4, 8, 0.5), 2, (1, 4, 4), 7))
# GLM-4.1V's forward cannot take images and videos in one row: videos and text only.
VIDEO_ONLY = ((5, ("video", 3, 4, 4), 9), (12,), (3, ("video", 2, 4, 8), 7))
# Whole-sample placement: short samples (video, image, text-only) and one long sample with a
# video, as hf_cases.MIXED.
VIDEO_MIXED = ((3, ("video", 2, 4, 4), 5), (4, (1, 4, 4), 3), (6,), (2, ("video", 1, 4, 4), 6),
               (40, ("video", 3, 4, 4), 80))
# One long video and little text: the row `auto` shards.
LONG_VIDEO = ((4, ("video", 8, 8, 8), 12),)
ROWS = {"video_packed": VIDEO_PACKED, "video_only": VIDEO_ONLY, "video_mixed": VIDEO_MIXED,
        "long_video": LONG_VIDEO}


def parity_grid(group: dist.ProcessGroup, cases: list[HFParityCase]) -> list[dict]:
    """``hf_parity`` of every case, in order, one single-process step per (model, dtype, row)."""
    refs, out = {}, []
    for c in cases:
        key = (c.model, c.dtype, c.seed, c.samples, c.markers)
        if key not in refs:
            refs[key] = reference_for(c)
        out.append(hf_parity(group, c, refs[key]))
    return out
