"""Rank functions for the video / sharded-visual-token HF tests (importable by name from spawned ranks).

Each function runs a whole grid inside one spawned group (spawning costs seconds).
"""

from __future__ import annotations

import torch.distributed as dist

from vlmcp.debug.parity.hf import HFParityCase, hf_parity, reference_for
from vlmcp.debug.tiny.anyres import ONEVISION_VIDEO_SAMPLES

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
# LLaVA-OneVision: videos of 3 frames each (one tensor of videos), two untiled images around one.
ONEVISION_VIDEO = ONEVISION_VIDEO_SAMPLES
ROWS = {"video_packed": VIDEO_PACKED, "video_only": VIDEO_ONLY, "video_mixed": VIDEO_MIXED,
        "long_video": LONG_VIDEO, "onevision_video": ONEVISION_VIDEO}


def parity_grid(group: dist.ProcessGroup, cases: list[HFParityCase]) -> list[dict]:
    """``hf_parity`` of every case, in order, one single-process step per (model, dtype, row)."""
    refs, out = {}, []
    for c in cases:
        key = (c.model, c.dtype, c.seed, c.samples, c.markers)
        if key not in refs:
            refs[key] = reference_for(c)
        out.append(hf_parity(group, c, refs[key]))
    return out


def vit_units(group: dist.ProcessGroup) -> dict:
    """Under ``scatter``, the patch rows each rank's ViT runs (a pre-hook on ``model.visual``) for one
    long video and for two images; under ``shard``, whether the visual slots travel."""
    import torch

    import vlmcp.hf
    from vlmcp.debug.synthetic import synthetic_row
    from vlmcp.debug.tiny import tiny_model

    out = {}
    for name, samples in (("long_video", LONG_VIDEO), ("two_images", ((3, (1, 4, 8), 4, (1, 4, 4), 7),))):
        model = vlmcp.hf.parallelize(tiny_model("qwen2_vl", torch.float64), group, vision_mode="scatter")
        rows: list[int] = []
        model.model.visual.register_forward_pre_hook(
            lambda m, args, rows=rows: rows.append(int(args[0].shape[0])))
        inputs, labels, cu = synthetic_row(model, samples)
        for strategy in ("replicate", "shard"):
            batch = vlmcp.hf.shard_inputs(model, inputs, group, labels=labels, cu_seqlens=cu,
                                          image_strategy=strategy)
            model(**batch.model_inputs).logits.sum().backward()
            shard = batch.shard
            out[(name, strategy)] = {
                "vit_rows": sum(rows), "visual_slots": int(shard.is_image.sum()),
                "visual_travel": bool(shard.travels[shard.is_image].all()),
                "visual_replicated": bool(shard.replicated[shard.is_image].all())}
            rows.clear()
    return out


def benches(group: dist.ProcessGroup) -> dict:
    """``vlmcp bench hf-memory`` and ``hf-vision``'s rank functions on tiny sizes (no extra spawn)."""
    from vlmcp.bench.hf import saved_bytes as memory
    from vlmcp.bench.hf import vision

    tiny = dict(hidden=64, layers=1, vit_width=16, vit_depth=1)
    pairs = [("replicate", "replicate"), ("shard", "scatter"), ("auto", "scatter")]
    saved = memory._rank(group, ((2, ("video", 2, 16, 16), 16),), pairs, tiny)
    times, per_rank = vision._rank(group, 4, 4, 1, tiny)
    qwen3 = {}
    for arch in ("qwen3_vl", "qwen3_5"):  # --arch
        sizes = {**tiny, "arch": arch}
        qwen3[arch] = (memory._rank(group, ((2, ("video", 2, 16, 16), 16),), [("shard", "scatter")], sizes),
                       vision._rank(group, 4, 4, 1, sizes)[1])
    return {"memory": saved, "vision": (times, per_rank), "qwen3": qwen3}


def suite(group: dist.ProcessGroup, cases: list[HFParityCase]) -> dict:
    """The P=2 group's whole job: the parity grid, the ViT-unit counts, the benchmarks' rank functions."""
    return {"parity": parity_grid(group, cases), "vit": vit_units(group), "benches": benches(group)}
