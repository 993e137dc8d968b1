"""Autograd collectives with documented duals (see Note [vlmcp autograd collectives and their duals]).

* :func:`broadcast` <-> reduce-sum to the source.
* :func:`all_gather` (uneven sizes) <-> reduce-scatter.
* :func:`copy_to_group` (identity) <-> all-reduce-sum.
* :func:`all_reduce_sum` <-> identity.
* :func:`all_to_all` <-> the inverse all-to-all.
* :func:`all_to_all_uneven` (rows to each rank, uneven) <-> the same with the splits swapped.
"""

from vlmcp.comm.collectives import (
    all_gather,
    all_reduce_sum,
    all_to_all,
    all_to_all_uneven,
    broadcast,
    copy_to_group,
)

__all__ = ["all_gather", "all_reduce_sum", "all_to_all", "all_to_all_uneven", "broadcast", "copy_to_group"]
