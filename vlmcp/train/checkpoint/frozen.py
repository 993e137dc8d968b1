"""The frozen parameters a checkpoint leaves out, and the check that a resumed run froze the same.

A frozen weight (``requires_grad=False``: ``--freeze``, the base of a LoRA run) is never trained,
so a checkpoint does not store it: it keeps the names and a digest of each (sum and sum of
squares, whole-model values), and ``--resume`` takes the weights from the model it loads again
(``--model``), after :func:`check_frozen` compared the digest. A ``hidden_shard`` slice stays in
the checkpoint even when frozen: it is stored full size, as the run's layout needs.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["check_frozen", "frozen_digest", "frozen_names", "frozen_record"]


def frozen_names(model: nn.Module) -> list[str]:
    """The parameters a checkpoint leaves out: frozen ones, reloaded from ``--model`` on resume
    (a ``hidden_shard`` slice stays in: it is stored full size, as the run's layout needs)."""
    from vlmcp.grads import partition_of

    return [n for n, p in model.named_parameters() if not p.requires_grad and partition_of(p) is None]


def frozen_digest(model: nn.Module, names: list[str], world) -> torch.Tensor:
    """``(len(names), 2)`` float64: each frozen parameter's sum and sum of squares, whole-model
    values (an FSDP shard's are summed over ``world``; a collective there, on every rank)."""
    from torch.distributed.tensor import DTensor

    params = dict(model.named_parameters())
    out = torch.zeros(len(names), 2, dtype=torch.float64)
    sharded = False
    for i, name in enumerate(names):
        p = params[name].detach()
        if isinstance(p, DTensor):
            p, sharded = p.to_local(), True
        p = p.double()
        out[i, 0], out[i, 1] = p.sum().cpu(), p.pow(2).sum().cpu()
    if sharded:
        import torch.distributed as dist

        device = next(iter(params.values())).device
        out = out.to(device if device.type != "meta" else "cpu")
        dist.all_reduce(out, group=world)
        out = out.cpu()
    return out


def frozen_record(model: nn.Module, world) -> dict:
    """What a checkpoint keeps of the frozen parameters it leaves out: names and digest."""
    names = frozen_names(model)
    return {"names": names, "digest": frozen_digest(model, names, world)}


def check_frozen(record: dict, model: nn.Module, world, where) -> list[str]:
    """Raise unless the model's frozen weights (loaded from ``--model``) are those the checkpoint's
    run froze; returns their names (to be taken from the model, not the checkpoint)."""
    names = frozen_names(model)
    if list(record["names"]) != names:
        raise ValueError(f"cannot resume from {where}: it left out other frozen parameters than this run "
                         "freezes")
    now, then = frozen_digest(model, names, world), record["digest"].to(torch.float64)
    bad = ((now - then).abs() > 1e-9 * then.abs().clamp(min=1e-12)).any(1).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"cannot resume from {where}: --model's frozen weights differ from those the run "
                         f"froze ({', '.join(names[i] for i in bad[:3])}{', ...' if len(bad) > 3 else ''}): "
                         "resume with the model directory the run started from")
    return names
