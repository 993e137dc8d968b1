"""Model and optimizer state in a form that does not depend on the CP size.

Most parameters are identical on every CP rank. ``hidden_shard``'s projector slice
is not: each rank holds ``1/P`` of the columns. A checkpoint stores every tensor
full size, keyed by parameter name, so that a run saved at one CP size resumes at
another: saving all-gathers the slices (and their AdamW moments) over the CP
group, loading takes this rank's slice with :func:`vlmcp.grads.local_part`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.grads import local_part, partition_of, restore_grad_tags

__all__ = ["full_state", "load_full_state"]


def _full(param: nn.Parameter, t: torch.Tensor, cp_group: dist.ProcessGroup | None) -> torch.Tensor:
    part = partition_of(param)
    if part is None or t.dim() == 0:
        return t.detach().clone().cpu()
    dim, _, size = part
    pieces = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(pieces, t.detach().contiguous(), group=cp_group)
    return torch.cat(pieces, dim=dim).cpu()


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer,
               cp_group: dist.ProcessGroup | None) -> dict:
    """Full-size ``{"model": {name: tensor}, "optimizer": {...}}``; a collective on every CP rank.

    The optimizer entry keeps ``param_groups`` hyperparameters and the per-parameter
    state keyed by parameter name instead of index.
    """
    restore_grad_tags(model)  # a copied model's slices are still known as slices
    names = {p: n for n, p in model.named_parameters()}
    model_state = {n: _full(p, p.data, cp_group) for n, p in model.named_parameters()}
    opt_state = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state.get(p, {})
            opt_state[names[p]] = {k: _full(p, v, cp_group) if torch.is_tensor(v) else v
                                   for k, v in st.items()}
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return {"model": model_state, "optimizer": {"state": opt_state, "param_groups": hyper}}


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Inverse of :func:`full_state` on a model of any CP size (no communication)."""
    restore_grad_tags(model)
    params = dict(model.named_parameters())
    missing = sorted(set(params) ^ set(state["model"]))
    if missing:
        raise ValueError(f"checkpoint does not match the model: parameters {missing[:5]} differ")
    with torch.no_grad():
        for n, p in params.items():
            full = state["model"][n]
            p.copy_(local_part(p, full.to(p.device, p.dtype)))
    saved_groups = state["optimizer"]["param_groups"]
    if len(saved_groups) == len(optimizer.param_groups):
        for group, hyper in zip(optimizer.param_groups, saved_groups, strict=True):
            group.update(hyper)
    # else a checkpoint of before ``vlmcp train --model`` split decayed and plain parameters: the
    # optimizer's own hyperparameters (the run's config; the rate is set every step) stand
    names = {p: n for n, p in params.items()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            saved = state["optimizer"]["state"].get(names[p], {})
            if saved:
                optimizer.state[p] = {
                    k: (local_part(p, v).to(p.device).clone() if torch.is_tensor(v) and v.dim() > 0
                        else v.clone() if torch.is_tensor(v) else v)
                    for k, v in saved.items()}
