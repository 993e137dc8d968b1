"""The held-out loss (``--eval-every``): every held-out row once, under CP, no gradient.

The spec gives the rows (:meth:`~vlmcp.train.spec.TrainSpec.eval_row`: a model directory's
``--eval-data`` planned like its training data but never shuffled; the reference VLM's
``--eval-rows`` built-in rows of a stream no training run reads) and their loss
(:meth:`~vlmcp.train.spec.TrainSpec.row_loss`, the training forward). DP replica ``d`` takes rows
``d, d + D, d + 2D, ...``; every replica runs the same number of forwards (``ceil(rows / D)``),
the last ones on row 0 with weight 0 where the rows run out, because FSDP's and the vision modes'
collectives need every rank in every forward. The loss is token-weighted over the whole set::

    eval_loss = sum_rows mean_row * targets_row / sum_rows targets_row

``mean_row`` is the CP group's mean token loss of the row and ``targets_row`` its target count
(the same on every rank of the group, so only its first rank adds them); one all-reduce over the
world at the end.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.train.spec import Groups, TrainSpec

__all__ = ["evaluate"]


def evaluate(spec: TrainSpec, model: nn.Module, groups: Groups) -> dict:
    """``{"eval_loss", "eval_tokens", "eval_rows"}`` of the spec's held-out rows (a collective)."""
    cfg, rows = spec.cfg, spec.eval_rows()
    dp_rank, first = dist.get_rank(groups.dp), dist.get_rank(groups.cp) == 0
    total = torch.zeros(2, dtype=torch.float64)  # sum of mean * targets, targets
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for k in range(math.ceil(rows / cfg.dp)):
                g = k * cfg.dp + dp_rank
                res = spec.row_loss(model, spec.eval_row(g if g < rows else 0, groups), groups)
                if g < rows and first:
                    total += torch.tensor([res.mean * res.targets, float(res.targets)], dtype=torch.float64)
    finally:
        model.train(was_training)
    total = total.to(groups.device)
    dist.all_reduce(total, group=groups.world)
    loss_sum, tokens = total.cpu().tolist()
    return {"eval_loss": loss_sum / tokens if tokens else float("nan"), "eval_tokens": int(round(tokens)),
            "eval_rows": rows}
