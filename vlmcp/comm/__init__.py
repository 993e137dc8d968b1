"""Autograd collectives with documented duals (see Note [vlmcp autograd collectives and their duals]).

* :func:`broadcast` <-> reduce-sum to the source.
* :func:`all_gather` (uneven sizes) <-> reduce-scatter.
* :func:`copy_to_group` (identity) <-> all-reduce-sum.
* :func:`all_reduce_sum` <-> identity.
* :func:`all_to_all` <-> the inverse all-to-all.
"""

from vlmcp.comm.collectives import all_gather, all_reduce_sum, all_to_all, broadcast, copy_to_group

__all__ = ["all_gather", "all_reduce_sum", "all_to_all", "broadcast", "copy_to_group"]
