"""``TrainSpec``: what a model family gives the one training loop (after torchtitan's ``TrainSpec``).

The loop (:mod:`vlmcp.train.loop`) owns everything both families share: the learning rate, the
global batch's normaliser, backward, the gradient reduction, the exact global norm and clipping,
the step's one all-reduce, the optimizer step, metrics, evaluation, checkpoints, SIGTERM/SIGINT and
the final summary. A spec owns only its model's parts, called in this order on every rank::

    build(groups)            -> Built        the model, parallelized: CP attention, vision mode, FSDP
    optimizer(model)         -> Optimizer    over the trainable parameters
    parts(model)             -> {name: part} vision / projector / llm, for the per-part norms
    batches(groups, start, position)         this replica's rows, step by step (a Batches)
    weight(row)              -> float        the row's share of the global batch's normaliser
    row_loss(model, row, groups) -> RowLoss  the loss of one row on this CP rank
    eval_rows() / eval_row(k, groups)        the held-out rows, if any
    finish(model, groups, stopped) -> dict   the final save and the spec's own summary entries

The two specs: :class:`~vlmcp.train.specs.reference.spec.ReferenceSpec` (the built-in VLM on its
packed built-in rows) and :class:`~vlmcp.train.specs.hf.spec.HFSpec` (a Hugging Face model
directory on planned conversations). A spec is built on the launcher and pickled to every rank
(it carries its config and its planned data); a test wraps a real one to inject a fault.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.train.config import TrainConfig

__all__ = ["Batch", "Batches", "Built", "Groups", "RowLoss", "TrainSpec"]


class Groups(NamedTuple):
    """The process groups of a training rank and the device its collectives run on."""

    world: dist.ProcessGroup
    """All D x P ranks."""
    cp: dist.ProcessGroup
    """This rank's CP group (P consecutive ranks: one row)."""
    dp: dist.ProcessGroup
    """This rank's DP group (the D ranks holding the same CP position)."""
    device: torch.device
    """CUDA under NCCL (NCCL reduces CUDA tensors only), else the CPU."""


class Built(NamedTuple):
    """A spec's model, ready to train."""

    model: nn.Module
    """Parallelized: CP attention, the vision mode, and FSDP where ``fsdp``."""
    fsdp: bool = False
    """FSDP2 over the world: the loss is scaled by P and the gradients finished by
    :func:`vlmcp.grads.finish_ddp_gradients` instead of :func:`vlmcp.reduce_gradients`."""


class RowLoss(NamedTuple):
    """The loss of one row on this CP rank (:meth:`TrainSpec.row_loss`)."""

    loss: torch.Tensor
    """The scalar to backpropagate: this rank's share of the row's token-mean loss (share semantics,
    Note [vlmcp gradient rules])."""
    mean: float
    """The row's mean token loss over the CP group, the same on every rank of it."""
    targets: int
    """The row's target tokens (next-token labels that are not ``-100``)."""
    tokens: int
    """The row's tokens."""


class Batch(NamedTuple):
    """One optimizer step's rows of this DP replica."""

    rows: list[Any]
    """``grad_accum`` rows, whatever the spec's :meth:`TrainSpec.row_loss` takes."""
    position: int
    """The data position after the whole global batch (what a checkpoint stores)."""


class Batches(Protocol):
    """A spec's data source: one :class:`Batch` per step, from the position the run starts at."""

    def __iter__(self) -> Iterator[Batch]: ...

    def close(self) -> None:
        """Stop any background work (a thread building rows ahead)."""


class TrainSpec(Protocol):
    """A model family in the one loop; see the module docstring for the order of the calls."""

    cfg: TrainConfig
    """The run (a subclass of :class:`~vlmcp.train.config.TrainConfig` with the spec's own fields)."""

    def build(self, groups: Groups) -> Built:
        """The model on ``groups.device``, parallelized over ``groups`` (collective: every rank)."""

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """The optimizer over the trainable parameters (its param groups are part of a checkpoint)."""

    def parts(self, model: nn.Module) -> dict[str, str]:
        """Every parameter's part, ``vision``, ``projector`` or ``llm``, by name."""

    def batches(self, groups: Groups, start: int, position: int) -> Batches:
        """This replica's batches of steps ``start`` to ``cfg.steps``, from data position ``position``."""

    def weight(self, row: Any) -> float:
        """The row's weight ``n`` in the global batch's normaliser, known before any forward (Note [vlmcp
        HF global batch: one normaliser]): its target tokens for a token mean, 1 for a mean of rows."""

    def row_loss(self, model: nn.Module, row: Any, groups: Groups) -> RowLoss:
        """The forward of ``row`` on this CP rank, no backward (the loop weights and backpropagates it;
        under ``torch.no_grad`` it is the evaluation's forward)."""

    def eval_rows(self) -> int:
        """How many held-out rows there are (0: none, the run evaluates nothing)."""

    def eval_row(self, k: int, groups: Groups) -> Any:
        """Held-out row ``k``, built the same on every rank of the CP group (collective over it)."""

    def finish(self, model: nn.Module, groups: Groups, stopped: str | None) -> dict:
        """After the last step, on every rank: the final save (when ``stopped`` is None) and the spec's
        own summary entries (collective)."""
