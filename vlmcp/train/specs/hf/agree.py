"""The CP group agrees on which conversations of its row were skipped, before sharding.

:func:`agree_on_skips` makes the decision; :class:`DecodeSkips` records it for the
warnings and the run's summary.

Every rank of a CP group builds the same row itself (Note [vlmcp data: HF rows, epochs
and who decodes the images]). A conversation whose image fails to decode is left out of
the row; when the failure is in the bytes (a truncated file) every rank sees it, but a
flaky read on one rank would leave the group with different rows: different tokens,
cu_seqlens and images under one set of collectives, so wrong gradients or a hang. So
before :func:`vlmcp.hf.shard_inputs` the group reduces its skips::

    rank 0 skipped {2}     --all-reduce MAX of [skip bits, -skip bits]-->   union {2, 5}
    rank 1 skipped {2, 5}                                                 intersection {2}

    union != intersection: rank 0 rebuilds its row without {2, 5}; round again
    (a rebuild may fail on another conversation); stop when they are equal, on every rank.

The decision to stop comes from the reduced tensor, the same on every rank, so the ranks
always run the same number of rounds. One round (one all-reduce of ``2 * S`` integers, S
conversations in the row) in the common case.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.distributed as dist

from vlmcp.data.hf.rows import DataIndex, HFRow
from vlmcp.data.hf.schema import Skipped

__all__ = ["DecodeSkips", "agree_on_skips"]

_ELSEWHERE = "another rank of the CP group could not decode its image"


def agree_on_skips(row: HFRow, planned: list[int], rebuild: Callable[[HFRow, frozenset[int]], HFRow],
                   group: dist.ProcessGroup, device: torch.device) -> HFRow:
    """``row``, rebuilt where needed so every rank of ``group`` skips the same conversations.

    Args:
        row: this rank's row (:func:`vlmcp.data.hf.rows.build_row`).
        planned: the row's conversations as planned (``DataIndex.rows[row.index]``), the
            same list on every rank of the group.
        rebuild: ``rebuild(row, exclude)`` builds the row again without ``exclude``
            (:meth:`vlmcp.data.hf.rows.RowLoader.rebuild`).
        group: the CP group (collective: every rank calls it with the same row index).
        device: where the reduction runs (the backend's device).

    Returns:
        A row whose ``skipped`` is the union of every rank's skips, the same on every rank.
    """
    while True:
        bits = torch.zeros(2, len(planned), dtype=torch.int64)
        bits[0, [planned.index(i) for i in row.skipped]] = 1
        bits[1] = -bits[0]
        bits = bits.to(device)
        dist.all_reduce(bits, op=dist.ReduceOp.MAX, group=group)
        union, everywhere = bits[0].cpu(), -bits[1].cpu()
        if torch.equal(union, everywhere):
            return row
        exclude = frozenset(planned[k] for k in union.nonzero().flatten().tolist())
        if exclude != frozenset(row.skipped):
            row = rebuild(row, exclude)


class DecodeSkips:
    """A rank's record of the conversations its CP group left out at training, and why.

    Args:
        index: the planned dataset (names the conversations).
        warn: print a warning (stderr) the first time a conversation is skipped; the
            trainer sets it on the first rank of each CP group.
    """

    def __init__(self, index: DataIndex, warn: bool) -> None:
        self.index, self.warn = index, warn
        self.seen: dict[int, Skipped] = {}

    def note(self, row: HFRow) -> None:
        """Record ``row``'s agreed skips (:func:`agree_on_skips`)."""
        why = {f.where: f.reason for f in row.failures}
        for i in row.skipped:
            if i in self.seen:
                continue
            where = self.index.conversations[i].where
            reason = why.get(where, _ELSEWHERE)
            self.seen[i] = Skipped(where, reason)
            if self.warn:
                print(f"vlmcp train: warning: {where}: {reason}; the conversation is skipped",
                      file=sys.stderr, flush=True)

    def gather(self, group: dist.ProcessGroup) -> list[Skipped]:
        """Every rank's record, one entry per conversation in data order (a collective over ``group``)."""
        every: list[dict[int, Skipped]] = [{} for _ in range(dist.get_world_size(group))]
        dist.all_gather_object(every, self.seen, group=group)
        merged: dict[int, Skipped] = {}
        for seen in every:
            for i, s in seen.items():  # a rank that saw the failure names the image and the error
                if i not in merged or merged[i].reason == _ELSEWHERE:
                    merged[i] = s
        return [merged[i] for i in sorted(merged)]
