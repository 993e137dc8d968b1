"""The optimizer's shared parts: AdamW with decay on matrices only, the gradients' squared norms by
layout, and clipping by the exact global gradient norm.

The norm is computed once per step, in the step's single all-reduce, from the three layouts a
gradient can have after the reduction (:func:`squared_norms`): the same on every rank (counted
once over the world), a ``hidden_shard`` slice (each CP rank's own columns, counted once per DP
replica) or an FSDP shard (each rank's own rows). Every rank then holds the same norm and scales
its own part of every gradient by the same factor, so the clipped gradients are those of one
process clipping the whole gradient (``torch.nn.utils.clip_grad_norm_``: ``max_norm / (norm +
1e-6)`` when that is below 1).
"""

from __future__ import annotations

import torch
from torch import nn

from vlmcp.grads import GradRule, grad_rule

__all__ = ["PARTS", "clip_gradients", "make_optimizer", "no_decay", "squared_norms"]

PARTS = ("vision", "projector", "llm")


def no_decay(model: nn.Module) -> set[str]:
    """Names of the parameters that get no weight decay: biases, norms' weights and every other
    parameter of fewer than 2 dimensions (transformers' ``Trainer`` excludes biases and norms)."""
    names = set()
    for module_name, module in model.named_modules():
        is_norm = "norm" in type(module).__name__.lower()
        for name, p in module.named_parameters(recurse=False):
            if is_norm or p.dim() < 2 or name == "bias":
                names.add(f"{module_name}.{name}" if module_name else name)
    return names


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, in two groups: decayed matrices, then the rest.

    The groups depend on the model only (not on ``weight_decay``), so a checkpoint's optimizer
    state always fits.
    """
    skip = no_decay(model)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decayed = [p for n, p in trainable if n not in skip]
    plain = [p for n, p in trainable if n in skip]
    groups = [{"params": decayed, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr)


def squared_norms(model: nn.Module, parts: dict[str, str]) -> torch.Tensor:
    """``(3 parts, 3 layouts)`` squared norms of this rank's gradients (float64).

    ``parts`` names each parameter's part (the spec's :meth:`~vlmcp.train.spec.TrainSpec.parts`).
    Rows are :data:`PARTS`; columns the layout: 0 the same on every rank, 1 a ``hidden_shard``
    slice (the same on every DP rank), 2 an FSDP shard (one per rank). Divide column 0 by the
    world size and column 1 by the DP size, sum over the world, and every value is counted once.
    """
    from torch.distributed.tensor import DTensor

    sq = torch.zeros(3, 3, dtype=torch.float64)
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if isinstance(p.grad, DTensor):
            g, col = p.grad.to_local(), 2
        else:
            g, col = p.grad, int(grad_rule(p) is GradRule.PARTITIONED)
        sq[PARTS.index(parts[name]), col] += g.detach().double().pow(2).sum().cpu()
    return sq


def clip_gradients(model: nn.Module, total_norm: float, max_norm: float) -> float:
    """Scale every gradient of ``model`` by ``max_norm / (total_norm + 1e-6)`` when that is below 1.

    Args:
        model: the model (each rank scales its own part: whole gradients, slices or shards).
        total_norm: the exact global norm, the same on every rank.
        max_norm: the limit; 0 never clips.

    Returns:
        The factor applied (1.0 when nothing was clipped).
    """
    if max_norm <= 0:
        return 1.0
    factor = max_norm / (total_norm + 1e-6)
    if factor >= 1.0:
        return 1.0
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(factor)
    return factor
