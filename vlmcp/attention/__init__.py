"""Step 4 of the data flow: context-parallel attention over the planned layout.

Main entry points:

* :func:`cp_attention` — exact attention of this rank's tokens over the whole row,
  ``backend="ring"`` (Note [vlmcp ring attention schedule] in :mod:`.ring`) or
  ``"ulysses"`` (:mod:`.ulysses`) or ``"usp"``, Ulysses inside groups of U ranks and
  ring across them (:mod:`.usp`; subgroups from :func:`usp_groups`); replicated image
  K/V never travel.
* :func:`reference_attention` — dense single-process attention on the global row,
  the ground truth for tests and checks.
* :func:`varlen_attention` — single-process packed-row attention at kernel speed.
* :func:`block_kind` / :class:`MaskKind` — the per-block mask decision (pure function).

Modules: ``masks`` (block structure) -> ``kernels`` (local kernels, all device
handling) -> ``merge`` (fp32 log-sum-exp merge) -> ``blockwise`` (run blocks) ->
``comm`` (ring P2P) -> ``ring`` / ``ulysses`` / ``usp`` (schedules; ``usp_groups`` its
subgroups) -> ``cp`` (entry, checks).
"""

from vlmcp.attention.blockwise import varlen_attention
from vlmcp.attention.dispatch import cp_attention
from vlmcp.attention.kernels import select_kernel
from vlmcp.attention.masks import MaskKind, block_kind
from vlmcp.attention.merge import merge_
from vlmcp.attention.reference import reference_attention, reference_mask
from vlmcp.attention.usp_groups import UspGroups, usp_groups

__all__ = ["MaskKind", "UspGroups", "block_kind", "cp_attention", "merge_", "reference_attention",
           "reference_mask", "select_kernel", "usp_groups", "varlen_attention"]
