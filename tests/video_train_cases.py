"""Rank functions of the video training tests (importable by name from spawned ranks)."""

from __future__ import annotations

import torch.distributed as dist


def train_then_resume(group: dist.ProcessGroup, cfg, resumed, index, probe) -> dict:
    """``cfg``'s run (checkpoints every ``cfg.checkpoint_every`` steps), its last checkpoint removed,
    then ``resumed`` (``resume=True`` from the one before) in the same spawned group: both summaries."""
    from vlmcp.train.checkpoint import checkpoint_path
    from vlmcp.train.hf.loop import train_hf_rank

    first = train_hf_rank(group, cfg, index, probe)
    if dist.get_rank(group) == 0:
        checkpoint_path(cfg.checkpoints, cfg.steps).unlink()
    dist.barrier(group)
    return {"first": first, "second": train_hf_rank(group, resumed, index)}


def long_video_probe(model, processor, index, cp_group) -> dict:
    """After training: row 0 again under the run's layout, its strategy and each rank's ViT patch rows."""
    import torch

    import vlmcp.hf
    from vlmcp.data.hf.rows import build_row

    rows: list[int] = []
    hook = model.model.visual.register_forward_pre_hook(lambda m, args: rows.append(int(args[0].shape[0])))
    row = build_row(processor, index, 0)
    batch = vlmcp.hf.shard_inputs(model, row.inputs, cp_group, labels=row.labels, cu_seqlens=row.cu_seqlens,
                                  image_strategy="auto")
    with torch.no_grad():
        model(**batch.model_inputs)
    hook.remove()
    vit = torch.tensor([sum(rows)])
    gathered = [torch.zeros_like(vit) for _ in range(dist.get_world_size(cp_group))]
    dist.all_gather(gathered, vit, group=cp_group)
    return {"strategy": batch.shard.plan.image_strategy, "vit_rows": [int(g) for g in gathered],
            "patch_rows": int(row.inputs["pixel_values_videos"].shape[0]),
            "frame_groups": int(row.inputs["video_grid_thw"][:, 0].sum())}
