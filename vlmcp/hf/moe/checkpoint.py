"""Full experts for checkpoints: gather before saving, slice after loading (at any EP size).

An EP-sharded parameter has the same name and the same local shape ``(El, ...)`` on every EP rank,
but holds different experts. Saved as is, a checkpoint would keep one EP rank's experts and drop
the others' without an error (torch DCP, under FSDP2, takes same-named, same-shaped tensors for one
replicated tensor and writes one copy). So a checkpoint holds every expert tensor *full*,
``(E_tot, ...)``, identical on every rank (replicated, so DCP's dedup is right), keyed by the
parameter's name:

* :func:`gather_experts` before saving: the parameters (or their optimizer moments, keyed by
  parameter name) all-gathered over each EP group (an FSDP shard over the expert-DP group first);
* :func:`slice_experts` after loading: this rank's ``(El, ...)`` at the current EP size, in the
  parameter's own layout (a DTensor of the same placements under FSDP, without communication);
  a tensor whose first dimension is not ``E_tot`` (one EP rank's slice saved under the full name)
  is refused by name;
* :func:`load_experts`: :func:`slice_experts` copied into the parameters.

A run saved at one EP size resumes at any other (E=1: the full tensors are the parameters).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.hf.moe.shard import ExpertShard, expert_shards

__all__ = ["expert_shapes", "gather_experts", "load_experts", "slice_experts"]


def _dtensor():
    from torch.distributed.tensor import DTensor

    return DTensor


def _params(model: nn.Module) -> dict[str, nn.Parameter]:
    return {n.replace("_checkpoint_wrapped_module.", ""): p for n, p in model.named_parameters()}


def expert_shapes(model: nn.Module) -> dict[str, torch.Size]:
    """``{parameter name: full shape (E_tot, ...)}`` of every EP-sharded parameter (to allocate a load)."""
    params = _params(model)
    return {n: torch.Size((s.num_experts, *params[n].shape[1:])) for n, s in expert_shards(model).items()}


def _full(name: str, t: torch.Tensor, shard: ExpertShard) -> torch.Tensor:
    local = t.full_tensor() if isinstance(t, _dtensor()) else t  # FSDP: over the expert-DP group first
    if local.dim() == 0 or local.shape[0] != shard.num_local:
        raise ValueError(f"{name}: expected this EP rank's {shard.num_local} experts on dim 0, got shape "
                         f"{tuple(local.shape)}")
    pieces = [torch.empty_like(local) for _ in range(shard.size)]
    dist.all_gather(pieces, local.detach().contiguous(), group=shard.group)
    return torch.cat(pieces, 0)


def gather_experts(model: nn.Module,
                   tensors: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Every EP-sharded entry of ``tensors`` at full size ``(E_tot, ...)``; the others as given.

    A collective: every rank of the world calls it with the same names in the same order (one
    all-gather over the entry's EP group per expert tensor, after ``full_tensor()`` of an FSDP shard).

    Args:
        model: the model :func:`vlmcp.hf.parallelize` gave an ``ep_group``.
        tensors: ``{parameter name: this rank's tensor}``: the parameters' values (default), or an
            optimizer's per-parameter state (``exp_avg``, ...) keyed by parameter name.

    Returns:
        ``{name: tensor}`` in the given order, expert entries full and the same on every rank.
    """
    shards = expert_shards(model)
    if tensors is None:
        tensors = {n: p.detach() for n, p in _params(model).items()}
    return {n: _full(n, t, shards[n]) if n in shards and torch.is_tensor(t) and t.dim() else t
            for n, t in tensors.items()}


def slice_experts(model: nn.Module, full: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This rank's part of every full expert entry of ``full``; the others as given (no communication).

    An expert entry comes back in its parameter's layout: ``(El, ...)``, or under FSDP a DTensor
    with the parameter's mesh and placements (this rank's own chunk of it).

    Raises:
        ValueError: an expert entry whose shape is not the full ``(E_tot, ...)`` (a checkpoint holding
            one EP rank's experts under the full name), naming it.
    """
    shards, params = expert_shards(model), _params(model)
    out = {}
    for name, t in full.items():
        shard = shards.get(name)
        if shard is None or not torch.is_tensor(t) or t.dim() == 0:
            out[name] = t
            continue
        if isinstance(t, _dtensor()):
            t = t.full_tensor()
        want = (shard.num_experts, *params[name].shape[1:])
        if tuple(t.shape) != want:
            raise ValueError(f"{name} has shape {tuple(t.shape)} in the checkpoint, expected the full "
                             f"{want}: was it saved without vlmcp.hf.moe.gather_experts (one EP rank's "
                             "experts)?")
        part = t[shard.first:shard.first + shard.num_local]
        p = params[name]
        if isinstance(p, _dtensor()):
            from torch.distributed.tensor import distribute_tensor

            part = distribute_tensor(part.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
        out[name] = part
    return out


def load_experts(model: nn.Module, full: Mapping[str, torch.Tensor]) -> list[str]:
    """Copy the full expert tensors of ``full`` into this rank's slices of the parameters (names returned).

    Every EP-sharded parameter must be in ``full`` (else it is named); other entries are ignored.
    """
    shards, params = expert_shards(model), _params(model)
    missing = sorted(set(shards) - set(full))
    if missing:
        raise ValueError(f"the checkpoint has no full experts for {missing[:3]}")
    parts = slice_experts(model, {n: full[n] for n in shards})
    with torch.no_grad():
        for name, part in parts.items():
            p = params[name]
            dst = p.to_local() if isinstance(p, _dtensor()) else p
            src = part.to_local() if isinstance(part, _dtensor()) else part
            dst.copy_(src.to(dst.device, dst.dtype))
    return list(parts)
