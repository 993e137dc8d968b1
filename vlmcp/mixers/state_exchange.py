"""The one collective of a recurrent layer under CP: all-gather the owned segments' maps.

Each rank sends the maps of its exported segments (owned text chunks of split samples
that a later segment needs; :attr:`RowSegments.exported`), in global order, and
receives everyone's, in rank order. A map is a fixed number of values per segment,
whatever the segment's length (Gated DeltaNet's ``[M | U]``: ``Hv x K x (K + V)``;
Mamba-2's ``[a | U]``: ``H x (1 + P N)``): the bytes of a layer depend on the number
of segments (samples, images, P), never on L. Backward is the dual, a
reduce-scatter: the gradient of each map summed over every rank that composed it,
returned to its owner (Note [vlmcp autograd collectives and their duals]).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vlmcp.comm import all_gather
from vlmcp.mixers.segments import SegmentLayout

__all__ = ["exchange_bytes", "exchange_maps", "maps_bytes"]


def exchange_maps(maps: torch.Tensor, layout: SegmentLayout, group: dist.ProcessGroup | None) -> torch.Tensor:
    """All-gather the exported maps of every rank; backward reduce-scatters.

    Args:
        maps: ``(e_r, *map)``, this rank's exported maps (``layout.export`` order).
        layout: this rank's :class:`SegmentLayout` (its ``export_sizes`` are every rank's ``e``).
        group: the CP group; None for one process (nothing is exported then).

    Returns:
        ``(sum(e), *map)``, identical on every rank. Backward: rank r receives the
        sum over ranks of the gradient of its rows, ``(e_r, *map)``.
    """
    sizes = layout.export_sizes
    if maps.shape[0] != sizes[layout.rank]:
        raise ValueError(f"exchange_maps: rank {layout.rank} has {maps.shape[0]} maps, the layout says "
                         f"{sizes[layout.rank]}")
    if group is None or max(sizes) == 0:
        return maps
    return all_gather(maps, group, dim=0, sizes=sizes)


def maps_bytes(layout: SegmentLayout, map_numel: int, dtype: torch.dtype) -> int:
    """Bytes each rank receives in the forward all-gather of maps of ``map_numel`` numbers each (the
    flat buffer pads every part to the largest)."""
    sizes = layout.export_sizes
    if max(sizes) == 0 or layout.cp_size == 1:
        return 0
    itemsize = torch.empty((), dtype=dtype).element_size()
    return layout.cp_size * max(sizes) * map_numel * itemsize


def exchange_bytes(layout: SegmentLayout, heads: int, k_dim: int, v_dim: int, dtype: torch.dtype) -> int:
    """The gated delta rule's :func:`maps_bytes`: ``[M | U]`` maps of ``heads x K x (K + V)``."""
    return maps_bytes(layout, heads * k_dim * (k_dim + v_dim), dtype)
