"""The one log-sum-exp merge of partial attention results (fp32 or wider, never bf16).

Two partial results for the same queries, ``(out_a, lse_a)`` over key set A and
``(out_b, lse_b)`` over a disjoint key set B, combine exactly into attention over
A and B::

    lse = log(exp(lse_a) + exp(lse_b))
    out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)
        = out_a - sigmoid(lse_b - lse_a) * (out_a - out_b)

The sigmoid/logsigmoid form never exponentiates a large number. A query that
saw no key has ``lse = -inf`` and ``out = 0``; merging two such partials keeps
``-inf`` and 0 (the naive form gives ``-inf - -inf = NaN``). That case is told
apart structurally (both log-sum-exps are ``-inf``), not by the value of the
difference: a NaN that comes from the data (a NaN query, key or value gives a NaN
``lse``) must stay NaN, as it does in one process, and never turn into 0. Merging in bf16 makes
the error grow with the number of merges, i.e. with the ring size
(ring-flash-attention issue #42), so the accumulators are float32 (float64 for
float64 inputs) and each block is upcast before it is merged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["accumulator_dtype", "merge_"]


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def merge_(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Merge a block's partial result into the accumulators, in place.

    Args:
        out: ``(H, Lq, D)`` accumulator (float32/float64), updated in place.
        lse: ``(H, Lq)`` accumulator of the same dtype, ``-inf`` where nothing was
            seen yet; updated in place.
        block_out: ``(H, Lq, D)`` the block's normalised output, any float dtype.
        block_lse: ``(H, Lq)`` the block's log-sum-exp, ``-inf`` for rows without keys.
    """
    block_lse = block_lse.to(lse.dtype)
    diff = block_lse - lse
    # both -inf (no key on either side): the block adds nothing, its weight is 0, not NaN.
    # Only that case: a NaN lse from NaN data keeps diff NaN, so out and lse become NaN.
    diff = diff.masked_fill(torch.isneginf(lse) & torch.isneginf(block_lse), float("-inf"))
    out.sub_(torch.sigmoid(diff).unsqueeze(-1) * (out - block_out.to(out.dtype)))
    lse.copy_(torch.maximum(lse, block_lse) - F.logsigmoid(diff.abs()))
