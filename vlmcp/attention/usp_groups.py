"""The process groups of hybrid Ulysses x ring attention (USP), created once, on every rank.

A CP group of P ranks with Ulysses size U splits two ways (P = 8, U = 2 here)::

    CP ranks          0 1 | 2 3 | 4 5 | 6 7
    Ulysses groups   {0,1} {2,3} {4,5} {6,7}      U consecutive ranks: all-to-all over heads
    ring groups      {0,2,4,6} {1,3,5,7}          stride U: ring attention across the groups

``dist.new_group`` is collective over the *default* group: every process of the job
must create every subgroup, in the same order, even the ones it is not in. In a
DP x CP job a rank does not know the other CP groups, so :func:`usp_groups` first
gathers every rank's CP group (one ``all_gather_object`` over the default group;
none when the CP group is the whole job) and then creates all of their subgroups in
one sorted order. Hence its rule: every process of the job calls it, at the same
point, each with its own CP group and the same ``ulysses_size``. ``cp_attention``
creates them itself on first use only when the CP group is the whole job (then every
process reaches that call); otherwise it refuses, before any communication, until
``usp_groups`` has been called.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["UspGroups", "cached_usp_groups", "group_timeout", "usp_groups"]


def group_timeout(group: dist.ProcessGroup) -> timedelta | None:
    """The timeout ``group`` was created with, or None where torch does not say.

    ``dist.new_group`` without ``timeout=`` gives torch's default (30 minutes), not the
    parent group's: a subgroup made without it would let a stalled peer hang the job for
    half an hour whatever the run's ``--timeout``. Subgroups vlmcp makes inherit this.
    """
    for device in ("cpu", "cuda"):
        try:
            timeout = group._get_backend(torch.device(device)).options._timeout
        except (AttributeError, RuntimeError, ValueError):
            continue
        if isinstance(timeout, timedelta):
            return timeout
    return None


@dataclass(frozen=True, eq=False)
class UspGroups:
    """This rank's USP subgroups of one CP group.

    Attributes:
        ulysses_size: U, ranks per Ulysses group (a divisor of P).
        ulysses: the U consecutive CP ranks ``gU .. gU+U-1`` holding this rank
            (None when U = 1: nothing to exchange over heads).
        ring: the P/U CP ranks ``j, j+U, j+2U, ...`` with this rank's ``j = rank % U``
            (None when U = P: a ring of one).
        ulysses_rank: j, this rank's index in its Ulysses group.
        ring_rank: g, the index of its Ulysses group (its rank in the ring group).
    """

    ulysses_size: int
    ulysses: dist.ProcessGroup | None
    ring: dist.ProcessGroup | None
    ulysses_rank: int
    ring_rank: int


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # CP group -> {U: UspGroups}


def check_ulysses_size(ulysses_size, cp_size: int) -> None:
    if isinstance(ulysses_size, bool) or not isinstance(ulysses_size, int) or ulysses_size < 1 \
            or cp_size % ulysses_size:
        raise ValueError(f"ulysses_size must be a positive divisor of the CP size P={cp_size}, "
                         f"got {ulysses_size!r}")


def cached_usp_groups(group: dist.ProcessGroup, ulysses_size: int) -> UspGroups | None:
    """The groups :func:`usp_groups` made for ``(group, ulysses_size)``, or None (no communication)."""
    return _CACHE.get(group, {}).get(ulysses_size)


def usp_groups(group: dist.ProcessGroup, ulysses_size: int, timeout: timedelta | None = None) -> UspGroups:
    """Create (once) the Ulysses and ring subgroups of the CP group ``group``.

    Collective over the default group: every process of the job calls it at the same
    point, each with its own CP group, every CP group of the same size, and the same
    ``ulysses_size`` (see the module docstring). Later calls return the cached groups
    without communicating.

    Args:
        group: this rank's CP process group (P ranks).
        ulysses_size: U, a divisor of P.
        timeout: how long the subgroups wait for a peer; default: ``group``'s own
            (:func:`group_timeout`), torch's default only where that is unknown.

    Returns:
        This rank's :class:`UspGroups`.

    Raises:
        ValueError: ``ulysses_size`` does not divide P, the processes disagree, or a
            CP group's ranks are not in increasing global order (raised on every
            process alike, after the one gather).
    """
    P = dist.get_world_size(group)
    check_ulysses_size(ulysses_size, P)
    hit = cached_usp_groups(group, ulysses_size)
    if hit is not None:
        return hit
    mine = tuple(dist.get_process_group_ranks(group))
    if P == dist.get_world_size():
        cp_groups = [mine]
    else:
        seen: list = [None] * dist.get_world_size()
        dist.all_gather_object(seen, (mine, ulysses_size))
        if len({(len(ranks), u) for ranks, u in seen}) != 1:
            raise ValueError(f"usp_groups: every process must pass a CP group of the same size and the same "
                             f"ulysses_size; got (CP group, ulysses_size) = {sorted(set(seen))}")
        cp_groups = sorted({ranks for ranks, _ in seen})
    if any(list(ranks) != sorted(ranks) for ranks in cp_groups):
        # new_group orders a subgroup's ranks by global rank: CP rank order must be that order
        raise ValueError(f"usp_groups: a CP group's ranks are not in increasing global order: {cp_groups}")
    U, R = ulysses_size, P // ulysses_size
    me = mine[dist.get_rank(group)]
    timeout = group_timeout(group) if timeout is None else timeout
    made: dict[str, dist.ProcessGroup] = {}
    for ranks in cp_groups:  # the same order on every process
        for kind, subs in (("ulysses", [ranks[g * U:(g + 1) * U] for g in range(R)] if U > 1 else []),
                           ("ring", [ranks[j::U] for j in range(U)] if R > 1 else [])):
            for sub in subs:
                pg = dist.new_group(list(sub), timeout=timeout)
                if me in sub:
                    made[kind] = pg
    rank = dist.get_rank(group)
    out = UspGroups(ulysses_size=U, ulysses=made.get("ulysses"), ring=made.get("ring"),
                    ulysses_rank=rank % U, ring_rank=rank // U)
    _CACHE.setdefault(group, {})[U] = out
    return out
