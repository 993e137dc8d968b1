"""transformers' float32 islands, lifted for float64 parity (the reference and the CP model alike).

* :func:`float64_exact` (:mod:`.islands`): while active, every float32 island of every loaded
  transformers module (:data:`ISLANDS`, Note [vlmcp float64 parity: float32 islands]) computes in
  float64; :func:`float64_norms` makes one model's RMSNorm instances compute in their input dtype.
* :func:`in_dtype` (:mod:`.rewrite`): a function with its ``torch.float32`` and ``.float()`` read as
  another dtype, how most islands are lifted.
"""

from vlmcp.debug.float64.islands import ISLANDS, float64_exact, float64_norms
from vlmcp.debug.float64.rewrite import in_dtype

__all__ = ["ISLANDS", "float64_exact", "float64_norms", "in_dtype"]
