"""What both parity checks share: the case's step settings, and every gradient under CP against one
process's.

:class:`StepCase` holds how the CP step runs (attention, vision mode, dtype, the layout's
strategies, the seed); each check's case adds its own model and row.

Gradient error of a parameter: ``|g_cp - g| / max(|g|, floor * max_q |g_q|)`` (Frobenius norms, in
float64), or ``|g_cp - g|`` where that denominator is 0. The reference VLM's check compares each
parameter with its own norm (``floor=0``); an HF model's judges a parameter whose true gradient is
about 0 (a key bias, which softmax ignores) against the model's gradient scale (``floor=1e-3``),
not its own rounding noise. The CP side's gradient is this rank's part: a ``hidden_shard`` slice is
compared with the same slice of the reference (:func:`vlmcp.grads.local_part`), an FSDP2 ``DTensor``
gradient whole; a missing gradient counts as zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.grads import local_part

__all__ = ["StepCase", "gradient_errors", "worst_gradient"]

_WRAPPED = "_checkpoint_wrapped_module."  # activation checkpointing's wrapper, absent from the reference


@dataclass(frozen=True)
class StepCase:
    """How one CP step of a parity check runs (the CP side; the single process runs the same model)."""

    attention: str = "ring"
    """``"ring"``, ``"ulysses"`` (or the reference VLM's ``"usp"``)."""
    vision_mode: str = "replicate"
    dtype: str = "float64"
    image_strategy: str = "replicate"
    """The plan's ``image_strategy``: ``"replicate"``, ``"shard"`` or ``"auto"``."""
    sample_placement: str = "split"
    """The plan's ``sample_placement``: ``"split"``, ``"whole"`` or ``"auto"``."""
    seed: int = 0


def _full(g: torch.Tensor) -> torch.Tensor:
    return g.full_tensor() if hasattr(g, "full_tensor") else g


def gradient_errors(model: nn.Module, ref: nn.Module, group: dist.ProcessGroup | None, *,
                    floor: float = 0.0) -> tuple[list[str], torch.Tensor]:
    """Every parameter's gradient error (module docstring), the worst over ``group``'s ranks.

    Args:
        model: the CP model after its step (and ``reduce_gradients``).
        ref: the single-process model after its step, the same parameters by name.
        group: the CP group (its ranks' errors are all-reduced with MAX), or None.
        floor: the share of the largest reference gradient norm below which a norm is not divided by.

    Returns:
        ``(names, errors)``: ``model``'s parameter names (checkpoint wrappers dropped) and
        ``DoubleTensor[len(names)]``, identical on every rank.
    """
    ref_params = dict(ref.named_parameters())
    names, diffs, norms = [], [], []
    for n, p in model.named_parameters():
        name = n.replace(_WRAPPED, "")
        r = ref_params[name].grad
        r = torch.zeros_like(ref_params[name]) if r is None else r
        g = torch.zeros_like(r) if p.grad is None else _full(p.grad)
        r = local_part(p, r) if g.shape != r.shape else r
        names.append(name)
        diffs.append(float((g.double() - r.double()).norm()))
        norms.append(float(r.double().norm()))
    scale = floor * max(norms, default=0.0)
    errors = torch.tensor([d / den if (den := max(nm, scale)) > 0 else d
                           for d, nm in zip(diffs, norms, strict=True)], dtype=torch.float64)
    if group is not None:
        dist.all_reduce(errors, op=dist.ReduceOp.MAX, group=group)
    return names, errors


def worst_gradient(model: nn.Module, ref: nn.Module, group: dist.ProcessGroup | None, *,
                   floor: float = 0.0) -> tuple[float, str]:
    """The largest of :func:`gradient_errors` and its parameter's name."""
    names, errors = gradient_errors(model, ref, group, floor=floor)
    i = int(errors.argmax())
    return float(errors[i]), names[i]
