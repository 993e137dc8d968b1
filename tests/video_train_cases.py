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
