"""Memory estimates before any GPU is rented (``vlmcp plan --model DIR``).

* :func:`estimate_memory`: a CP rank's predicted peak for one training step of a HF VLM, term by
  term (states under FSDP, the language model's and the vision tower's saved activations, the
  loss, the transients), from the model's config alone (:mod:`vlmcp.estimate.peak`);
* :func:`max_seq_len`: the longest row that fits a memory budget;
* :mod:`vlmcp.estimate.towers`: what each block saves per token, per architecture.
"""

from vlmcp.estimate.peak import (
    EstimateSetup,
    MemoryEstimate,
    ModelStates,
    estimate_memory,
    max_seq_len,
    model_states,
)

__all__ = ["EstimateSetup", "MemoryEstimate", "ModelStates", "estimate_memory", "max_seq_len", "model_states"]
