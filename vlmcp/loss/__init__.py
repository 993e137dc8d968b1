"""Step 5 of the data flow: token losses of a CP rank, normalized over the whole CP group.

* :func:`cp_cross_entropy` (:mod:`.cross_entropy`): cross-entropy of this rank's logits, each rank's
  share of the group's mean (Note [vlmcp gradient rules]); :class:`CPLoss` is what it returns.
* :func:`cp_linear_cross_entropy` (:mod:`.linear_cross_entropy`): the LM head and the same loss in one
  op, a chunk of tokens at a time, never the ``N x V`` logits (Note [vlmcp chunked linear
  cross-entropy]); :func:`chunk_transient_bytes` is its per-chunk memory.
* :func:`cp_token_logprobs` and :func:`per_sample_sum` (:mod:`.logprobs`): each local target's
  log-probability (from logits, or chunked from hidden states and the head's weight) and each
  packed sample's sum over the whole row, for RL and preference losses (DPO, GRPO).
"""

from vlmcp.loss.cross_entropy import CPLoss, cp_cross_entropy
from vlmcp.loss.linear_cross_entropy import chunk_transient_bytes, cp_linear_cross_entropy
from vlmcp.loss.logprobs import cp_token_logprobs, per_sample_sum

__all__ = ["CPLoss", "chunk_transient_bytes", "cp_cross_entropy", "cp_linear_cross_entropy",
           "cp_token_logprobs", "per_sample_sum"]
