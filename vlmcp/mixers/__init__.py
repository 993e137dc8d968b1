"""Token mixers that are not softmax attention, under CP: Gated DeltaNet, Mamba-2 (SSD), causal convs.

Main entry points:

* :func:`gated_delta_rule_cp` — the gated delta rule of this rank's tokens over the whole
  row: each segment (owned text chunk, replicated image run) is an affine map of its
  incoming state; the owned maps are all-gathered and composed per sample (Note [vlmcp
  gated delta rule under CP: the segment schedule] in :mod:`.cp`).
* :func:`causal_conv1d_cp` — a depthwise causal conv1d whose segments get their ``k-1``
  predecessors from whoever holds them (Note [vlmcp causal conv1d halo]).
* :func:`gated_deltanet_ulysses` — conv, activation and rule through head shards holding
  the whole row (Note [vlmcp Gated DeltaNet under Ulysses]): bytes grow with L, no
  redundant work.
* :func:`chunk_gated_delta_rule` — the single-process chunked kernel on packed segments
  (initial and final states), the local kernel of all of them.
* :func:`ssd_cp` — Mamba-2's SSD scan of this rank's tokens over the whole row, the same
  segment schedule with Mamba-2's map (a scalar log decay per head and a state; Note [vlmcp
  SSD under CP: the segment schedule]); :func:`mamba2_ulysses` its all-to-all road (Note
  [vlmcp Mamba-2 under Ulysses]); :func:`chunk_ssd` the single-process chunked scan.

Modules: ``chunks`` (packed segments in chunks) -> ``delta_rule`` / ``ssd`` (the math, one
process) -> ``segments`` (the row's segments, per rank, and their composition) ->
``state_exchange`` (the maps' all-gather) -> ``delta_rule_cp`` / ``ssd_cp`` (the ops);
``conv_halo`` (the convolution's halo exchange); ``head_shards`` -> ``deltanet_ulysses`` /
``ssd_ulysses`` (the all-to-all roads).
"""

from vlmcp.mixers.conv_halo import causal_conv1d_cp
from vlmcp.mixers.delta_rule import SegmentMaps, chunk_gated_delta_rule, segment_maps
from vlmcp.mixers.delta_rule_cp import gated_delta_rule_cp
from vlmcp.mixers.deltanet_ulysses import gated_deltanet_ulysses
from vlmcp.mixers.segments import RowSegments, SegmentLayout, row_segments, segment_layout
from vlmcp.mixers.ssd import SSDMaps, chunk_ssd, ssd_segment_maps
from vlmcp.mixers.ssd_cp import ssd_cp, ssd_exchange_bytes
from vlmcp.mixers.ssd_ulysses import mamba2_ulysses
from vlmcp.mixers.state_exchange import exchange_bytes

__all__ = ["RowSegments", "SSDMaps", "SegmentLayout", "SegmentMaps", "causal_conv1d_cp",
           "chunk_gated_delta_rule", "chunk_ssd", "exchange_bytes", "gated_delta_rule_cp",
           "gated_deltanet_ulysses", "mamba2_ulysses", "row_segments", "segment_layout", "segment_maps",
           "ssd_cp", "ssd_exchange_bytes", "ssd_segment_maps"]
