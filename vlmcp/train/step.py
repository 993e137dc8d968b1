"""One training step of the reference VLM on one packed row, on one CP rank.

Shared by ``vlmcp train``, ``vlmcp verify`` and ``vlmcp compare`` so that all three
measure the same computation. Labels and positions are computed on the global
row, then sharded (PITFALLS: a chunk's last label lives on another rank).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from vlmcp.data import PackedRow
from vlmcp.layout import RankShard, position_ids
from vlmcp.loss import CPLoss, cp_cross_entropy
from vlmcp.models import VLM

__all__ = ["LocalInputs", "forward_backward", "local_inputs"]


class LocalInputs(NamedTuple):
    """A rank's share of a packed row."""

    input_ids: torch.Tensor
    """``(N,)`` token ids (padding slots 0)."""
    labels: torch.Tensor
    """``(N,)`` next-token targets, ``-100`` where there is none."""
    position_ids: torch.Tensor
    """``(N,)`` RoPE positions within each sample."""


def local_inputs(row: PackedRow, shard: RankShard) -> LocalInputs:
    """Shard a row's ids, labels and positions for ``shard``'s rank."""
    pos = position_ids(row.input_ids.numel(), row.cu_seqlens)
    return LocalInputs(shard.shard(row.input_ids), shard.shard_labels(row.labels), shard.shard(pos))


def forward_backward(
    model: VLM,
    row: PackedRow,
    shard: RankShard,
    group: dist.ProcessGroup | None,
    *,
    backend: str = "ring",
    image_attention: str = "causal",
    loss_scale: float = 1.0,
) -> CPLoss:
    """Forward and backward of this rank's share of ``row``'s loss.

    After it, each parameter's ``.grad`` holds this rank's share (Note [vlmcp gradient
    rules] in :mod:`vlmcp.grads`); :func:`vlmcp.reduce_gradients` turns shares into exact
    gradients.

    Args:
        model: the :class:`VLM` (its vision encoder placed on ``group`` if P > 1).
        row: the packed row (the same on every rank of the CP group).
        shard: this rank's part of the plan of ``row``.
        group: the CP group, or None for a single process.
        backend: attention backend.
        image_attention: ``"causal"`` or ``"bidirectional"``.
        loss_scale: multiplies the loss before backward (the CP size under the torch
            DDP convention).

    Returns:
        :class:`CPLoss`; ``.mean`` is the row's mean token loss, the same on every rank.
    """
    inputs = local_inputs(row, shard)
    logits = model(inputs.input_ids, inputs.position_ids, row.images, shard, group,
                   backend=backend, image_attention=image_attention)
    out = cp_cross_entropy(logits, inputs.labels, group)
    (out.loss * loss_scale).backward()
    return out
