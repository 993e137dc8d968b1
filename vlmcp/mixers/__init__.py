"""Token mixers that are not softmax attention, under CP: Gated DeltaNet and causal convolutions.

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

Modules: ``delta_rule`` (the math, one process) -> ``segments`` (the row's segments, per
rank) -> ``exchange`` (the maps' all-gather) -> ``cp`` (the op); ``conv_halo`` (the
convolution's halo exchange); ``ulysses`` (the all-to-all road).
"""

from vlmcp.mixers.conv_halo import causal_conv1d_cp
from vlmcp.mixers.delta_rule import SegmentMaps, chunk_gated_delta_rule, segment_maps
from vlmcp.mixers.delta_rule_cp import gated_delta_rule_cp
from vlmcp.mixers.deltanet_ulysses import gated_deltanet_ulysses
from vlmcp.mixers.segments import RowSegments, SegmentLayout, row_segments, segment_layout
from vlmcp.mixers.state_exchange import exchange_bytes

__all__ = ["RowSegments", "SegmentLayout", "SegmentMaps", "causal_conv1d_cp", "chunk_gated_delta_rule",
           "exchange_bytes", "gated_delta_rule_cp", "gated_deltanet_ulysses", "row_segments",
           "segment_layout", "segment_maps"]
