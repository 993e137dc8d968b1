"""The five vision modes, written once: who runs the ViT, which collective, which dual, which rule.

Note [vlmcp vision placement modes]
-----------------------------------
A vision mode fixes how a CP group computes the complete visual features of one call
(the reference :class:`~vlmcp.vision.tower.VisionEncoder` through :func:`vlmcp.place_vision`,
a Hugging Face ViT through :mod:`vlmcp.hf.vision_placement`); afterwards every rank holds the
features of every *unit*, in unit order. A unit is what the ViT attends over: an image, or
one frame group of a video. :func:`placed_features` is the one implementation; its caller
says how to run the encoder on all units or on a subset, and how to make an empty tensor of
the features' shape::

    mode            who runs ViT + projector        forward -> backward (dual)         rule
    replicate       every rank, all units           - -> -                             SHARE
    broadcast       rank src, all units             broadcast -> reduce-sum to src     SHARE
    scatter         rank r, the units it owns       all-gather rows ->                 SHARE
                    (assign_images, patches^2)      reduce-scatter rows
    hidden_shard    every rank; the projector's     all-gather on the last dim ->      ViT SHARE,
                    last Linear keeps its own       reduce-scatter on the last dim     slice PARTITIONED
                    1/P output columns (column_slice)
    allreduce_hook  every rank, all units           - -> all-reduce of the feature     FULL
                                                    gradient (a hook)

Every rank joins every collective, including a rank that encodes no unit in ``scatter``
(its empty part still requires grad, so it joins the reduce-scatter) and the ranks that only
receive in ``broadcast`` (their placeholder requires grad exactly when the source's output
does: :func:`needs_grad`, read from parameters every rank shares). The decision of what runs
is made from metadata identical on every rank (the unit sizes); every rank must
backpropagate through the returned tensor, because its backward runs the dual.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.comm import all_gather, broadcast
from vlmcp.grads import GradRule, set_grad_rule
from vlmcp.vision.assign import assign_images, vit_cost

__all__ = ["VisionMode", "column_slice", "mode_rule", "needs_grad", "placed_features"]

VisionMode = Literal["replicate", "broadcast", "scatter", "hidden_shard", "allreduce_hook"]

RunUnits = Callable[[Sequence[int] | None], torch.Tensor]
"""``run(None)``: the features of every unit; ``run(index)``: of the listed units, in that order
(``index`` may be empty). Rows are the units' tokens; the last dimension is the hidden size."""


def mode_rule(mode: VisionMode) -> GradRule:
    """The gradient rule of the vision parameters a mode runs (Note [vlmcp gradient rules])."""
    return GradRule.FULL if mode == "allreduce_hook" else GradRule.SHARE


def needs_grad(module: nn.Module) -> bool:
    """Whether the module's output requires grad: the same answer on every rank (parameters)."""
    return torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())


def placed_features(
    mode: VisionMode,
    group: dist.ProcessGroup | None,
    units: Sequence[int],
    run: RunUnits,
    empty: Callable[[int], torch.Tensor],
    *,
    src: int = 0,
    requires_grad: bool,
) -> torch.Tensor:
    """The features of every unit on every rank of ``group``, computed as ``mode`` says.

    Args:
        mode: see Note [vlmcp vision placement modes].
        group: the CP group (None: one process, the encoder runs as is).
        units: tokens of each unit, identical on every rank.
        run: runs the encoder (:data:`RunUnits`); under ``hidden_shard`` its last dimension is
            this rank's slice of the hidden size.
        empty: ``empty(rows)``, an uninitialized tensor of the features' shape with ``rows``
            rows (full hidden size), on the features' device and dtype.
        src: ``broadcast``'s source rank within ``group``.
        requires_grad: whether the encoder's output requires grad (:func:`needs_grad`): the
            receivers' placeholders and an empty ``scatter`` part must agree with it.

    Returns:
        ``(sum(units), ..., hidden)``: every unit's rows in unit order, identical on every rank.
    """
    world = 1 if group is None else dist.get_world_size(group)
    if mode == "replicate" or world == 1:
        return run(None)
    if mode == "allreduce_hook":
        features = run(None)
        if features.requires_grad:
            # The seed's recipe: sum the ranks' feature gradients before the encoder's backward;
            # the vision parameters then hold FULL gradients on every rank.
            features.register_hook(functools.partial(_all_reduce, group=group))
        return features
    if mode == "broadcast":
        if dist.get_rank(group) == src:
            features = run(None)
        else:
            features = empty(sum(units)).requires_grad_(requires_grad)
        return broadcast(features, src, group)
    if mode == "scatter":
        return _scatter(group, units, run, requires_grad)
    if mode == "hidden_shard":
        features = run(None)  # this rank's columns of every unit
        return all_gather(features, group, dim=features.dim() - 1)
    raise ValueError(f"unknown vision mode {mode!r}")


def _all_reduce(grad: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    grad = grad.clone()  # never reduce in place into a gradient autograd may still hold
    dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=group)
    return grad


def _scatter(group: dist.ProcessGroup, units: Sequence[int], run: RunUnits,
             requires_grad: bool) -> torch.Tensor:
    """This rank runs its units (``assign_images`` by cost); the rows of all units are all-gathered
    (rank-major) and put back in unit order."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    owner = assign_images([vit_cost(t) for t in units], world)
    mine = [i for i, o in enumerate(owner) if o == rank]
    rows = [sum(t for t, o in zip(units, owner, strict=True) if o == r) for r in range(world)]
    local = run(mine)  # (rows[rank], ...), maybe 0 rows
    if requires_grad and not local.requires_grad:  # no unit here and a frozen last layer
        local = local.detach().requires_grad_()
    gathered = all_gather(local, group, dim=0, sizes=rows)
    # Unit i's rows start after every earlier rank's rows and after the units its owner ran before it.
    start, seen = [0] * len(units), [sum(rows[:r]) for r in range(world)]
    for i, o in enumerate(owner):
        start[i], seen[o] = seen[o], seen[o] + units[i]
    order = torch.cat([torch.arange(s, s + t) for s, t in zip(start, units, strict=True)])
    return gathered.index_select(0, order.to(gathered.device))


def column_slice(fc: nn.Linear, rank: int, world: int) -> nn.Linear:
    """``hidden_shard``: this rank's ``out_features / world`` output columns of ``fc``, PARTITIONED.

    The slice keeps ``fc``'s ``requires_grad`` (a frozen projector stays frozen).
    """
    n = fc.out_features // world
    part = nn.Linear(fc.in_features, n, bias=fc.bias is not None, device=fc.weight.device,
                     dtype=fc.weight.dtype)
    with torch.no_grad():
        part.weight.copy_(fc.weight[rank * n:(rank + 1) * n])
        if fc.bias is not None:
            part.bias.copy_(fc.bias[rank * n:(rank + 1) * n])
    part.weight.requires_grad_(fc.weight.requires_grad)
    if fc.bias is not None:
        part.bias.requires_grad_(fc.bias.requires_grad)
    for p in part.parameters():
        set_grad_rule(p, GradRule.PARTITIONED, world, shard_dim=0, shard_index=rank)
    return part
