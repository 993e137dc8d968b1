"""Step 1 of the data flow: plan which tokens each CP rank holds.

See Note [vlmcp layout: replicated image prefix, per-sample zigzag text] in
:mod:`vlmcp.layout.plan`.
"""

from vlmcp.layout.gather import unshard
from vlmcp.layout.labels import IGNORE_INDEX, shift_labels
from vlmcp.layout.plan import CPPlan, ImageStrategy, RankShard, TokenKind, plan_cp
from vlmcp.layout.positions import mrope_position_ids, position_ids
from vlmcp.layout.work import WorkReport, attended_pairs, keys_per_query

__all__ = [
    "IGNORE_INDEX", "CPPlan", "ImageStrategy", "RankShard", "TokenKind", "WorkReport",
    "attended_pairs", "keys_per_query", "mrope_position_ids", "plan_cp", "position_ids",
    "shift_labels", "unshard",
]
