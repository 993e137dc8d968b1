"""The reference VLM's forward (and backward) of one packed row, on one CP rank.

Shared by ``vlmcp train`` (:func:`row_loss`), ``vlmcp verify`` and ``vlmcp compare``
(:func:`forward_backward`) so that all three measure the same computation. Labels and
positions are computed on the global row, then sharded (PITFALLS: a chunk's last label lives
on another rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

from vlmcp.attention import cp_attention
from vlmcp.data import PackedRow
from vlmcp.layout import RankShard, position_ids
from vlmcp.loss import CPLoss
from vlmcp.models import VLM

__all__ = ["LocalInputs", "UspAttention", "forward_backward", "local_inputs", "row_loss"]


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


@dataclass(frozen=True)
class UspAttention:
    """``cp_attention(..., backend="usp", ulysses_size=U)`` as the model's attention callable
    ``(q, k, v, shard, group, image_attention) -> out`` (see :class:`vlmcp.models.llm.DecoderLLM`)."""

    ulysses_size: int
    """U, the Ulysses group size."""

    def __call__(self, q, k, v, shard, group, image_attention):
        return cp_attention(q, k, v, shard, group, "usp", image_attention, ulysses_size=self.ulysses_size)


def row_loss(
    model: VLM,
    row: PackedRow,
    shard: RankShard,
    group: dist.ProcessGroup | None,
    *,
    backend: str = "ring",
    image_attention: str = "causal",
    ulysses_size: int | None = None,
) -> CPLoss:
    """This rank's share of ``row``'s loss, no backward (the training loop's forward).

    The model computes its LM head and loss a chunk of tokens at a time, inside its forward
    (:func:`vlmcp.cp_linear_cross_entropy`; DDP-safe): the full logits never exist.

    Args:
        model: the :class:`VLM` (its vision encoder placed on ``group`` if P > 1).
        row: the packed row (the same on every rank of the CP group).
        shard: this rank's part of the plan of ``row``.
        group: the CP group, or None for a single process.
        backend: attention backend (``"ring"``, ``"ulysses"``, ``"usp"``).
        image_attention: ``"causal"`` or ``"bidirectional"``.
        ulysses_size: ``backend="usp"`` only: the Ulysses group size U.

    Returns:
        :class:`CPLoss`; ``.loss`` is this rank's share, ``.mean`` the row's mean token loss, the
        same on every rank.
    """
    inputs = local_inputs(row, shard)
    attention = UspAttention(ulysses_size) if backend == "usp" else backend
    # with labels the model returns its loss: the head computed a chunk of tokens at a time
    out = model(inputs.input_ids, inputs.position_ids, row.images, shard, group,
                backend=attention, image_attention=image_attention, labels=inputs.labels)
    return CPLoss(*out)  # DDP hands a NamedTuple output back as a plain tuple


def forward_backward(
    model: VLM,
    row: PackedRow,
    shard: RankShard,
    group: dist.ProcessGroup | None,
    *,
    backend: str = "ring",
    image_attention: str = "causal",
    loss_scale: float = 1.0,
    ulysses_size: int | None = None,
) -> CPLoss:
    """:func:`row_loss` and its backward (``vlmcp verify`` and ``vlmcp compare``'s step).

    After it, each parameter's ``.grad`` holds this rank's share (Note [vlmcp gradient
    rules] in :mod:`vlmcp.grads`); :func:`vlmcp.reduce_gradients` turns shares into exact
    gradients. ``loss_scale`` multiplies the loss before backward (the CP size under the torch
    DDP convention); the other arguments are :func:`row_loss`'s.
    """
    out = row_loss(model, row, shard, group, backend=backend, image_attention=image_attention,
                   ulysses_size=ulysses_size)
    (out.loss * loss_scale).backward()
    return out
