"""Cross-entropy of a CP rank's logits, normalized over the whole group.

Each rank returns ``sum(its token losses) / (target tokens over the CP group)``, so
the losses of the ranks add up to the mean over the row and every gradient is a
share (Note [vlmcp gradient rules]). Normalizing per rank instead weights a rank's
tokens by how few targets it happens to hold (PITFALLS: Megatron-LM #673).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.nn import functional as F

__all__ = ["CPLoss", "check_group", "cp_cross_entropy", "normalize_over_group"]


class CPLoss(NamedTuple):
    """What :func:`cp_cross_entropy` and :func:`~vlmcp.loss.cp_linear_cross_entropy` return."""

    loss: torch.Tensor
    """Scalar to backpropagate on this rank (its share of the group's mean loss)."""
    mean: torch.Tensor
    """Detached scalar, the mean token loss over the CP group, identical on every rank
    (0 when the group has no target token)."""


def cp_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, group: dist.ProcessGroup | None,
    ignore_index: int = -100
) -> CPLoss:
    """Cross-entropy of this rank's tokens, normalized by the CP group's target count.

    One all-reduce carries both the target count and the summed loss (for logging).

    Args:
        logits: ``(N, vocab)`` for this rank's local tokens (fp16/bf16 are upcast to fp32).
        labels: ``(N,)`` targets, already shifted on the global row; ``ignore_index``
            at padding, image tokens and sample ends.
        group: the CP group, or None for a single process (no communication).
        ignore_index: label value that is not a target.

    Returns:
        :class:`CPLoss` ``(loss, mean)``.

    Raises:
        TypeError: ``group`` is neither a process group nor None.
        ValueError: the shapes do not match.
    """
    check_group(group)
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(
            f"logits must be (N, vocab) and labels (N,), got {tuple(logits.shape)} and "
            f"{tuple(labels.shape)}")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    local = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")
    return normalize_over_group(local, labels, group, ignore_index)


def check_group(group) -> None:
    """``group`` must be a process group (the CP group) or None (one process)."""
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup (the CP group) or None for one "
                        f"process, got {type(group).__name__} {group!r}")


def normalize_over_group(local: torch.Tensor, labels: torch.Tensor, group: dist.ProcessGroup | None,
                         ignore_index: int = -100) -> CPLoss:
    """This rank's summed token loss ``local`` (scalar) -> :class:`CPLoss` over the CP group.

    One all-reduce of ``[target count, loss sum]`` (float64); no target anywhere: zero loss
    and zero gradient.
    """
    stats = torch.stack([(labels != ignore_index).sum().to(torch.float64), local.detach().double()])
    if group is not None:
        dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
    count = stats[0].clamp(min=1)
    loss = local / count.to(local.dtype)
    return CPLoss(loss, (stats[1] / count).to(local.dtype))
