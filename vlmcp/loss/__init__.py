"""Step 5 of the data flow: token losses of a CP rank, normalized over the whole CP group.

* :func:`cp_cross_entropy` (:mod:`.cross_entropy`): cross-entropy of this rank's logits, each rank's
  share of the group's mean (Note [vlmcp gradient rules]); :class:`CPLoss` is what it returns.
"""

from vlmcp.loss.cross_entropy import CPLoss, cp_cross_entropy

__all__ = ["CPLoss", "cp_cross_entropy"]
