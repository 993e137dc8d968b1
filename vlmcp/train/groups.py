"""The DP x CP process groups of a training world (both trainers, and the distributed tests)."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from vlmcp.attention.usp_groups import group_timeout

__all__ = ["dp_cp_groups"]


def dp_cp_groups(group: dist.ProcessGroup, cp: int,
                 timeout: timedelta | None = None) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """Split ``group`` (D*P ranks) into CP groups of consecutive ranks and strided DP groups.

    Every rank creates every subgroup in the same order (``new_group`` is collective).
    The subgroups wait ``timeout`` for a peer, by default as long as ``group`` does
    (:func:`vlmcp.attention.usp_groups.group_timeout`), never torch's 30-minute default.

    Returns:
        ``(cp_group, dp_group)`` of the calling rank.
    """
    ranks = dist.get_process_group_ranks(group)
    if len(ranks) % cp:
        raise ValueError(f"a group of {len(ranks)} ranks does not split into CP groups of {cp}")
    me = ranks[dist.get_rank(group)]
    cp_groups = [ranks[i:i + cp] for i in range(0, len(ranks), cp)]
    dp_groups = [ranks[i::cp] for i in range(cp)]
    timeout = group_timeout(group) if timeout is None else timeout
    mine = {}
    for kind, subgroups in (("cp", cp_groups), ("dp", dp_groups)):
        for sub in subgroups:
            pg = dist.new_group(sub, timeout=timeout)
            if me in sub:
                mine[kind] = pg
    return mine["cp"], mine["dp"]
