"""Step 1 of the data flow: plan which tokens each CP rank holds.

Main entry points: :func:`plan_cp` (``image_strategy="replicate"``, ``"shard"`` or
``"auto"``), :func:`choose_image_strategy` and :class:`CostModel` (what ``"auto"``
picks and why), :func:`attended_pairs` (exact per-rank attention work).

See Note [vlmcp layout: replicated images anywhere, per-sample zigzag text] in
:mod:`vlmcp.layout.plan`, Note [vlmcp zigzag cut points: equal chunks or equal causal
work] in :mod:`vlmcp.layout.cuts` and Note [vlmcp cost model: replicate or shard image
tokens] in :mod:`vlmcp.layout.cost`.
"""

from vlmcp.layout.choose import choose_image_strategy, choose_plan, plan_cp
from vlmcp.layout.cost import CostEstimate, CostModel, estimate_cost
from vlmcp.layout.gather import unshard
from vlmcp.layout.images import RowImages
from vlmcp.layout.labels import IGNORE_INDEX, shift_labels
from vlmcp.layout.plan import CPPlan, ImageStrategy, RankShard, TokenKind
from vlmcp.layout.positions import mrope_position_ids, position_ids
from vlmcp.layout.work import ImageAttention, WorkReport, attended_pairs, keys_per_query

__all__ = [
    "IGNORE_INDEX", "CPPlan", "CostEstimate", "CostModel", "ImageAttention", "ImageStrategy",
    "RankShard", "RowImages", "TokenKind", "WorkReport", "attended_pairs", "choose_image_strategy",
    "choose_plan", "estimate_cost", "keys_per_query", "mrope_position_ids", "plan_cp",
    "position_ids", "shift_labels", "unshard",
]
