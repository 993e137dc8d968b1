"""The row's segments in global order: what a recurrence or a causal convolution runs over under CP.

A *segment* is a maximal run of consecutive global positions of one sample held by
the same owner (:attr:`vlmcp.CPPlan.owner`): a rank's zigzag text chunk (two adjacent
chunks of one rank merge into one segment), a replicated image run (owner ``-1``,
held by every rank), or a whole sample placed on one rank. A rank's local row holds
its own and the replicated segments, each contiguous and in global order (padding
apart), so a token's recurrent state is its segment's incoming state advanced within
the segment. See Note [vlmcp gated delta rule under CP: the segment schedule] in
:mod:`vlmcp.mixers.delta_rule_cp`.

Everything here is metadata computed identically on every rank from the plan (no
communication) and cached per :class:`~vlmcp.RankShard`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vlmcp.layout.plan import RankShard

__all__ = ["RowSegments", "ScanStep", "SegmentLayout", "incoming_states", "row_segments", "segment_layout"]


@dataclass(frozen=True, eq=False)
class RowSegments:
    """The segments of the whole row, in row order (identical on every rank).

    Attributes:
        starts, ends: ``LongTensor[G]``, global ``[start, end)`` of each segment.
        samples: ``LongTensor[G]``, each segment's sample.
        owners: ``LongTensor[G]``, the rank holding it, ``-1`` where every rank does.
        first: ``BoolTensor[G]``, starts its sample (its incoming state is zero).
        last: ``BoolTensor[G]``, ends its sample.
        exported: ``BoolTensor[G]``, its map travels: owned by one rank, in a sample
            split over the group, and not the sample's last (a later segment needs it).
    """

    starts: torch.Tensor
    ends: torch.Tensor
    samples: torch.Tensor
    owners: torch.Tensor
    first: torch.Tensor
    last: torch.Tensor
    exported: torch.Tensor

    @property
    def num_segments(self) -> int:
        return self.starts.numel()


def row_segments(shard: RankShard) -> RowSegments:
    """The :class:`RowSegments` of ``shard``'s plan (O(L))."""
    plan = shard.plan
    owner = plan.owner
    L = plan.seq_len
    cu = plan.cu_seqlens.long()
    sample_start = torch.zeros(L, dtype=torch.bool)
    sample_start[cu[:-1][cu[:-1] < L]] = True
    boundary = sample_start.clone()
    boundary[1:] |= owner[1:] != owner[:-1]
    starts = torch.nonzero(boundary).flatten()
    ends = torch.cat([starts[1:], torch.tensor([L])])
    samples = plan.images.sample_ids[starts]
    owners = owner[starts]
    first = starts == cu[samples]
    last = ends == cu[samples + 1]
    split = plan.whole[samples] < 0
    exported = (owners >= 0) & ~last & split
    return RowSegments(starts=starts, ends=ends, samples=samples, owners=owners, first=first, last=last,
                       exported=exported)


@dataclass(frozen=True)
class ScanStep:
    """One segment of a sample in the per-sample composition, in global order."""

    gathered: bool
    """Its map comes from the exchange (another rank's segment), else from this rank's own."""
    index: int
    """Row of the gathered maps, or index among this rank's local segments."""
    reads: int
    """This rank's local segment whose incoming state is the state *before* this segment
    (``-1``: none here); the scan stops after the last one."""


@dataclass(frozen=True, eq=False)
class SegmentLayout:
    """One rank's view of the row's segments (cached per shard by :func:`segment_layout`).

    Attributes:
        rank, cp_size: this rank and P.
        row: the :class:`RowSegments`.
        local: ``LongTensor[n]``, the row segments this rank holds, in local (= global) order.
        local_cu: ``LongTensor[n+1]``, their boundaries among this rank's valid slots.
        valid: ``LongTensor[V]``, local slots that hold a token (not padding), in order:
            segment ``i`` is ``valid[local_cu[i]:local_cu[i+1]]``.
        fresh: ``BoolTensor[n]``, local segments that start their sample.
        export: ``LongTensor[e]``, local segments whose map this rank sends, in order.
        export_sizes: ``tuple[int, ...]``, how many maps each rank sends (rank order).
        scan: per sample holding a local segment that does not start from zero, the
            :class:`ScanStep` s that compose its incoming states.
    """

    rank: int
    cp_size: int
    row: RowSegments
    local: torch.Tensor
    local_cu: torch.Tensor
    valid: torch.Tensor
    fresh: torch.Tensor
    export: torch.Tensor
    export_sizes: tuple[int, ...]
    scan: tuple[tuple[ScanStep, ...], ...]

    @property
    def num_local(self) -> int:
        return self.local.numel()


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def segment_layout(shard: RankShard) -> SegmentLayout:
    """Build (or fetch) this rank's :class:`SegmentLayout` (no communication)."""
    cached = _CACHE.get(shard)
    if cached is not None:
        return cached
    row = row_segments(shard)
    r, P = shard.rank, shard.cp_size
    held = (row.owners == r) | (row.owners < 0)
    local = torch.nonzero(held).flatten()
    lens = (row.ends - row.starts)[local]
    local_cu = torch.zeros(local.numel() + 1, dtype=torch.long)
    torch.cumsum(lens, 0, out=local_cu[1:])
    valid = torch.nonzero(shard.positions >= 0).flatten()
    # the valid slots are the held segments back to back: each rank's slots of a sample keep global order
    expect = torch.cat([torch.arange(int(a), int(b)) for a, b in
                        zip(row.starts[local].tolist(), row.ends[local].tolist(), strict=True)]) \
        if local.numel() else torch.zeros(0, dtype=torch.long)
    if not torch.equal(shard.positions[valid], expect):
        raise AssertionError("vlmcp.mixers: a rank's slots are not its segments in global order")
    exported = torch.nonzero(row.exported).flatten()
    ex_owner = row.owners[exported]
    sizes = tuple(int((ex_owner == o).sum()) for o in range(P))
    offsets = [sum(sizes[:o]) for o in range(P)]
    gathered_at = {}
    for o in range(P):
        for i, j in enumerate(exported[ex_owner == o].tolist()):
            gathered_at[j] = offsets[o] + i
    local_at = {j: i for i, j in enumerate(local.tolist())}
    export = torch.tensor([local_at[j] for j in exported[ex_owner == r].tolist()], dtype=torch.long)
    fresh = row.first[local]
    scan = []
    carried = local[~fresh]
    for s in torch.unique(row.samples[carried]).tolist():
        begin = int(torch.searchsorted(row.samples, s))  # a sample's segments are contiguous
        stop = int(carried[row.samples[carried] == s].max())
        steps = []
        for j in range(begin, stop + 1):
            mine = j in local_at
            reads = local_at[j] if mine and not bool(row.first[j]) else -1
            index = local_at[j] if mine else gathered_at[j]
            steps.append(ScanStep(gathered=not mine, index=index, reads=reads))
        scan.append(tuple(steps))
    layout = SegmentLayout(rank=r, cp_size=P, row=row, local=local, local_cu=local_cu, valid=valid,
                           fresh=fresh, export=export, export_sizes=sizes, scan=tuple(scan))
    _CACHE[shard] = layout
    return layout


def incoming_states(layout: SegmentLayout, own: torch.Tensor, gathered: torch.Tensor,
                    start: Callable[[torch.Tensor], torch.Tensor],
                    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> dict[int, torch.Tensor]:
    """Compose the segment maps of every sample in global order: each local segment's incoming state.

    Args:
        layout: this rank's :class:`SegmentLayout` (its ``scan``).
        own: ``(n, *map)``, this rank's local segments' maps (``layout.local`` order).
        gathered: ``(sum(e), *map)``, the exported maps of every rank (the exchange's output).
        start: a sample's first map -> the state after it (its map from a zero state).
        step: ``(map, state) -> state`` after the segment.

    Returns:
        ``{local segment: its incoming state}`` for every local segment that does not start its
        sample (those start from zero). Differentiable in ``own`` and ``gathered``.
    """
    incoming: dict[int, torch.Tensor] = {}
    for steps in layout.scan:
        state = None
        for i, s in enumerate(steps):
            if s.reads >= 0:
                incoming[s.reads] = state
            if i == len(steps) - 1:
                break
            m = gathered[s.index] if s.gathered else own[s.index]
            state = start(m) if state is None else step(m, state)
    return incoming
