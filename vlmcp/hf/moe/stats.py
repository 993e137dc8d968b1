"""Per-expert token counts of the MoE layers, for the trainer's metrics.

Every EP-sharded experts module adds, at each training forward, the (token, slot) pairs this rank
routed to each global expert (the counts the dispatch exchanges anyway; no extra work). They are the
pairs actually computed: a padding slot and each CP rank's copy of a replicated image token count,
as they cost expert work. A recomputation under activation checkpointing (inside backward) and a
forward without gradients (evaluation) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["ExpertLoad", "expert_load", "local_expert_counts", "record_counts"]

_COUNTS = "_vlmcp_expert_counts"


def record_counts(module: nn.Module, counts: torch.Tensor) -> None:
    """Add ``counts`` (``LongTensor[E]``) to ``module``'s running counts (a training forward only)."""
    if not torch.is_grad_enabled() or torch._C._current_graph_task_id() != -1:
        return  # evaluation, or the recomputation of a checkpointed layer inside backward
    acc = module.__dict__.get(_COUNTS)
    if acc is None or acc.shape != counts.shape or acc.device != counts.device:
        module.__dict__[_COUNTS] = counts.detach().clone()
    else:
        acc.add_(counts.detach())


def _experts(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if getattr(m, "_vlmcp_ep", None) is not None]


def local_expert_counts(model: nn.Module, reset: bool = True) -> torch.Tensor:
    """``LongTensor[L, E]``: this rank's pairs per (MoE layer, global expert) since the last reset.

    For the trainer's one all-reduce of its step figures: append it (as float64) to that tensor and
    sum over the world. Every rank returns the same shape (zeros for a layer without a forward yet).
    """
    mods = _experts(model)
    if not mods:
        return torch.zeros(0, 0, dtype=torch.long)
    num = mods[0]._vlmcp_ep.num_experts
    rows = []
    for m in mods:
        acc = m.__dict__.get(_COUNTS)
        rows.append(torch.zeros(num, dtype=torch.long) if acc is None else acc.detach().cpu().clone())
        if reset and acc is not None:
            acc.zero_()
    return torch.stack(rows)


@dataclass(frozen=True, kw_only=True)
class ExpertLoad:
    """Per-expert token counts of a step over the world."""

    counts: torch.Tensor
    """``LongTensor[L, E]``: pairs per (MoE layer, expert), summed over every rank."""
    max: float
    """The busiest (layer, expert)'s pairs."""
    mean: float
    """Pairs per (layer, expert) on average."""

    @property
    def imbalance(self) -> float:
        """``max / mean`` (1.0: perfectly balanced; 0 when nothing was routed)."""
        return self.max / self.mean if self.mean > 0 else 0.0


def expert_load(model: nn.Module, group: dist.ProcessGroup | None, reset: bool = True) -> ExpertLoad:
    """The step's per-expert token counts summed over ``group`` (the whole world; one all-reduce).

    Args:
        model: the model :func:`vlmcp.hf.parallelize` gave an ``ep_group``.
        group: every rank whose tokens count (the DP x CP world), or None (this rank alone).
        reset: start counting afresh afterwards.
    """
    counts = local_expert_counts(model, reset=reset)
    if group is not None and counts.numel():
        dev = next((p.device for p in model.parameters()), torch.device("cpu"))
        summed = counts.to(dev)
        dist.all_reduce(summed, group=group)
        counts = summed.cpu()
    if not counts.numel():
        return ExpertLoad(counts=counts, max=0.0, mean=0.0)
    return ExpertLoad(counts=counts, max=float(counts.max()), mean=float(counts.double().mean()))
