"""The collective inverse of sharding: rebuild a full-row tensor (for evaluation).

Every rank holds the same number of local slots (the plan gives each sample the
same local length on every rank), so one equal-size ``all_gather`` suffices.
Not differentiable: it is for metrics and checks, not for training.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vlmcp.layout.plan import RankShard

__all__ = ["unshard"]


def unshard(
    local: torch.Tensor,
    shard: RankShard,
    group: dist.ProcessGroup,
    dim: int = 0,
    fill: float | int = 0,
) -> torch.Tensor:
    """Rebuild the global-row tensor from every rank's local tensor.

    Args:
        local: this rank's tensor, ``local.shape[dim] == shard.num_tokens``.
        shard: this rank's :class:`RankShard`.
        group: the CP process group the plan was made for.
        dim: token dimension.
        fill: value for global positions no rank holds (none, for a valid plan).

    Returns:
        A tensor with ``shape[dim] == L``, identical on every rank. Replicated
        tokens are taken from the lowest rank.
    """
    world = dist.get_world_size(group)
    if world != shard.cp_size:
        raise ValueError(f"shard was planned for cp_size={shard.cp_size}, group has {world} ranks")
    if dist.get_rank(group) != shard.rank:
        raise ValueError(f"shard is rank {shard.rank}'s, but this is rank {dist.get_rank(group)}")
    d = dim % local.dim()
    if local.shape[d] != shard.num_tokens:
        raise ValueError(
            f"local tensor has {local.shape[d]} tokens on dim {dim}, shard has {shard.num_tokens}")
    x = local.detach().movedim(d, 0).contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x, group=group)
    out = x.new_full((shard.seq_len, *x.shape[1:]), fill)
    plan = shard.plan
    for r in reversed(range(world)):  # lowest rank written last wins for replicated tokens
        pos = plan.for_rank(r).positions.to(x.device)
        valid = pos >= 0
        out[pos[valid]] = parts[r][valid]
    return out.movedim(0, d)
