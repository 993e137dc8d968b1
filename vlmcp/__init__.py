"""vlmcp: context parallelism for vision-language models.

Image embeddings stay complete on every rank of a CP group; only text is sharded,
zigzag per sample, so causal attention work stays balanced and the text loss
reaches the projector and the ViT exactly.

Main entry points:

* :func:`plan_cp` -> :class:`CPPlan`; ``plan.for_rank(r)`` -> :class:`RankShard`
  (which global tokens rank r holds; ``shard.shard(x)`` selects them).
* :func:`shift_labels`, :func:`position_ids`, :func:`mrope_position_ids`: targets
  and positions computed on the global row, before sharding.
* :func:`attended_pairs`: exact per-rank attention work of a plan.
* :func:`unshard`: the collective inverse of ``shard`` (for evaluation).
"""

from vlmcp.layout import (
    IGNORE_INDEX,
    CPPlan,
    RankShard,
    TokenKind,
    WorkReport,
    attended_pairs,
    mrope_position_ids,
    plan_cp,
    position_ids,
    shift_labels,
    unshard,
)

__version__ = "0.1.0"

__all__ = [
    "IGNORE_INDEX", "CPPlan", "RankShard", "TokenKind", "WorkReport", "attended_pairs",
    "mrope_position_ids", "plan_cp", "position_ids", "shift_labels", "unshard",
]
