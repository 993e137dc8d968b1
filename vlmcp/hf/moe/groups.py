"""The EP layout of a training world: expert-parallel groups and their expert-data-parallel partners.

A world of W = D*P ranks (CP groups of consecutive ranks, DP groups strided by P:
:func:`vlmcp.train.groups.dp_cp_groups`) is cut into EP groups of E consecutive ranks, as
torchtitan's ``[.., efsdp, ep]`` mesh with ``ep`` innermost; EP rank j of every EP group holds the same
experts, and those W/E ranks form its expert-DP group (strided by E), over which the experts'
gradients are summed (Note [vlmcp gradient rules]). E must divide W, nothing else: an EP group may
sit inside a CP group, be one, or span DP replicas::

    W=4, P=2 (CP {0,1} {2,3}; DP {0,2} {1,3})
    E=2:  EP {0,1} {2,3}   expert-DP {0,2} {1,3}
    E=4:  EP {0,1,2,3}     expert-DP {0} {1} {2} {3}
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from vlmcp.attention.usp_groups import group_timeout

__all__ = ["expert_groups"]


def expert_groups(group: dist.ProcessGroup, ep: int,
                  timeout: timedelta | None = None) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """Split ``group`` (the W ranks of the run) into EP groups of ``ep`` consecutive ranks and the
    strided expert-DP groups; a collective (every rank creates every subgroup, in the same order).

    The all-to-all gets groups of its own even where their ranks are a CP group's: one communicator
    shared with the ring's collectives could deadlock on an interleaving the ranks do not share.
    The subgroups wait ``timeout`` for a peer, by default as long as ``group`` does.

    Returns:
        ``(ep_group, expert_dp_group)`` of the calling rank.
    """
    ranks = dist.get_process_group_ranks(group)
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1 or len(ranks) % ep:
        raise ValueError(f"an EP size of {ep!r} does not divide a group of {len(ranks)} ranks")
    me = ranks[dist.get_rank(group)]
    timeout = group_timeout(group) if timeout is None else timeout
    mine = {}
    for kind, subgroups in (("ep", [ranks[i:i + ep] for i in range(0, len(ranks), ep)]),
                            ("edp", [ranks[j::ep] for j in range(ep)])):
        for sub in subgroups:
            pg = dist.new_group(sub, timeout=timeout)
            if me in sub:
                mine[kind] = pg
    return mine["ep"], mine["edp"]
