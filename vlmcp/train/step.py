"""One optimizer step's forward, backward and reduction, as named steps, and its one all-reduce.

:func:`train_step` runs, in order::

    set_lr             the rate of this step (vlmcp.train.schedule.lr_at)
    normaliser         each row's weight n and the global batch's N (one all-reduce over DP)
    accumulate         every row's forward (the spec's row_loss) and backward, weighted n * D / N
    reduce_grads       sum over CP, mean over DP (or FSDP's reduce-scatter and its finish)
    figures            this rank's part of the step's figures (StepFigures)
    all_reduce         the figures summed over the world: one collective per step

and returns the :class:`StepResult` every rank then acts on identically (stop on a non-finite
loss, clip by the exact global norm, step the optimizer: :mod:`vlmcp.train.loop`).

Note [vlmcp HF global batch: one normaliser]
--------------------------------------------
The loss of an optimizer step is normalised once over its whole global batch (D replicas x A
accumulated rows), as Megatron's per-token loss and transformers' ``num_items_in_batch`` make
it, so ``--dp 2`` and ``--grad-accum 2`` train identically::

    loss = sum_{d, a} n(d, a) * mean(d, a) / N,    N = sum_{d, a} n(d, a)

``mean(d, a)`` is row ``(d, a)``'s mean token loss over its CP group; ``n(d, a)`` its weight,
which the spec gives before any forward (:meth:`~vlmcp.train.spec.TrainSpec.weight`): a Hugging
Face model's rows weigh their target tokens, read from the labels, so the loss is the token mean
of the global batch; the reference VLM's weigh 1 each, the mean of its rows' means that its runs
have always trained. One all-reduce over the DP group gives N. Row ``(d, a)`` is backpropagated
with the weight ``n(d, a) * D / N``: the gradients accumulate over the A rows, and the DP mean
that :func:`vlmcp.reduce_gradients` (or FSDP) takes afterwards turns the D into the sum. The
reduction runs once per step, after the last row (it is linear, so reducing the accumulated
gradient is reducing each row's). With one row per step the weight is exactly 1.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.grads import finish_ddp_gradients, reduce_gradients
from vlmcp.train.optim import PARTS, squared_norms
from vlmcp.train.schedule import lr_at
from vlmcp.train.spec import Batch, Built, Groups, TrainSpec
from vlmcp.train.stop import StopSignals

__all__ = ["StepFigures", "StepResult", "train_step"]


class StepFigures(NamedTuple):
    """What each rank adds to the step's one all-reduce (a sum over the world). Each value is counted
    once: the rows' figures by the first rank of their CP group only, the squared norms divided by
    the ranks that hold the same gradient (:func:`vlmcp.train.optim.squared_norms`)."""

    squared_norms: torch.Tensor
    """``(3 parts, 3 layouts)`` float64, already divided for the sum over the world."""
    loss_sum: float
    """``sum_rows n * mean`` of this replica's rows."""
    bad: float
    """1 where this rank's loss was not finite."""
    tokens: float
    """Tokens of this replica's rows."""
    targets: float
    """Target tokens of this replica's rows."""
    stop: float
    """1 where a SIGTERM or SIGINT reached this rank by now."""
    sigint: float
    """1 where it was a SIGINT."""

    def all_reduce(self, groups: Groups) -> StepFigures:
        """The figures summed over the world (one collective, field by field into one tensor)."""
        scalars = [name for name in self._fields if name != "squared_norms"]
        flat = torch.cat([self.squared_norms.flatten(),
                          torch.tensor([getattr(self, name) for name in scalars], dtype=torch.float64)])
        flat = flat.to(groups.device)
        dist.all_reduce(flat, group=groups.world)
        flat = flat.cpu()
        sq = flat[:self.squared_norms.numel()].view_as(self.squared_norms)
        rest = flat[self.squared_norms.numel():].tolist()
        return StepFigures(squared_norms=sq, **dict(zip(scalars, rest, strict=True)))


class StepResult(NamedTuple):
    """One optimizer step as every rank sees it after the all-reduce."""

    loss: float
    """The global batch's normalised loss (Note [vlmcp HF global batch: one normaliser])."""
    part_norms: dict[str, float]
    """The exact gradient norm of each part, before clipping."""
    grad_norm: float
    """The exact global gradient norm, before clipping."""
    loss_finite: bool
    """Every rank's loss is finite."""
    tokens: int
    targets: int
    stop: bool
    """Some rank got a SIGTERM or SIGINT before the all-reduce: stop after this step."""
    sigint: bool

    @property
    def finite(self) -> bool:
        """Every rank's loss and the gradient norm are finite: the optimizer may step."""
        return self.loss_finite and math.isfinite(self.grad_norm)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def normaliser(spec: TrainSpec, rows: list, groups: Groups) -> tuple[list[float], float]:
    """Each row's weight and the global batch's N (Note [vlmcp HF global batch: one normaliser])."""
    weights = [float(spec.weight(row)) for row in rows]
    total = torch.tensor([sum(weights)], dtype=torch.float64, device=groups.device)
    dist.all_reduce(total, group=groups.dp)
    return weights, float(total.item())


def accumulate(spec: TrainSpec, built: Built, rows: list, weights: list[float], total: float,
               groups: Groups) -> tuple[float, bool, int, int]:
    """Forward and backward of every row, gradients accumulated; returns ``(sum of n * mean, whether
    every weighted loss was finite, tokens, targets)``."""
    cfg = spec.cfg
    loss_sum, finite, tokens, targets = 0.0, True, 0, 0
    for row, n in zip(rows, weights, strict=True):
        res = spec.row_loss(built.model, row, groups)
        loss = res.loss * (n * cfg.dp / max(total, 1.0))
        finite = finite and bool(torch.isfinite(loss.detach()))
        (loss * cfg.cp if built.fsdp else loss).backward()  # FSDP averages over all D*P ranks
        loss_sum += res.mean * n
        tokens, targets = tokens + res.tokens, targets + res.targets
    return loss_sum, finite, tokens, targets


def reduce_grads(built: Built, groups: Groups) -> None:
    """Shares to exact gradients (Note [vlmcp gradient rules]): sum over CP, mean over DP."""
    if built.fsdp:
        finish_ddp_gradients(built.model, groups.cp, groups.dp)
    else:
        reduce_gradients(built.model, groups.cp, groups.dp)


def figures(model: nn.Module, parts: dict[str, str], cfg, groups: Groups, sums: tuple[float, bool, int, int],
            stop: StopSignals) -> StepFigures:
    """This rank's part of the step's figures; ``stop`` is read last, just before the all-reduce."""
    loss_sum, finite, tokens, targets = sums
    first = float(dist.get_rank(groups.cp) == 0)  # the CP ranks of a replica hold the same rows
    sq = squared_norms(model, parts)
    sq[:, 0] /= cfg.cp * cfg.dp  # the same on every rank
    sq[:, 1] /= cfg.dp  # a hidden_shard slice: the same on every DP rank
    return StepFigures(squared_norms=sq, loss_sum=loss_sum * first, bad=float(not finite),
                       tokens=tokens * first, targets=targets * first, stop=float(stop.flag),
                       sigint=float(stop.interrupted))


def train_step(spec: TrainSpec, built: Built, optimizer: torch.optim.Optimizer, parts: dict[str, str],
               batch: Batch, step: int, groups: Groups, stop: StopSignals) -> StepResult:
    """Step ``step`` (0-based) up to the optimizer step, which the caller takes (see the module
    docstring)."""
    set_lr(optimizer, lr_at(spec.cfg, step))
    optimizer.zero_grad(set_to_none=True)
    weights, total = normaliser(spec, batch.rows, groups)
    sums = accumulate(spec, built, batch.rows, weights, total, groups)
    reduce_grads(built, groups)
    got = figures(built.model, parts, spec.cfg, groups, sums, stop).all_reduce(groups)
    norms = got.squared_norms.sum(1).sqrt()
    return StepResult(loss=got.loss_sum / max(total, 1.0),
                      part_norms=dict(zip(PARTS, norms.tolist(), strict=True)),
                      grad_norm=float(norms.pow(2).sum().sqrt()), loss_finite=not got.bad,
                      tokens=int(round(got.tokens)), targets=int(round(got.targets)), stop=got.stop > 0,
                      sigint=got.sigint > 0)
