"""A Hugging Face model directory as a :class:`~vlmcp.train.spec.TrainSpec` (``vlmcp train --model``).

Each step, every CP group takes ``--grad-accum`` packed rows (the global batch of D replicas is
the next ``D * grad_accum`` rows of the sequence; Note [vlmcp data: HF rows, epochs and who
decodes the images]), built ahead by a :class:`~vlmcp.data.hf.rows.RowLoader`. A row's loss
shards it with :func:`vlmcp.hf.shard_inputs` and runs the model's forward with the loss of
:func:`vlmcp.hf.causal_lm_loss`: the LM head and the cross-entropy a chunk of tokens at a time
(``--loss full``: the model's logits and :func:`vlmcp.cp_cross_entropy`), the forward's saved
tensors on the host with ``--offload-activations``. A row weighs its target tokens, read from its
labels (Note [vlmcp HF global batch: one normaliser]). With ``--fsdp`` the model is FSDP2-sharded
over all D*P ranks (:mod:`~vlmcp.train.specs.hf.model`) and its checkpoints are DCP directories.

A conversation whose image fails to decode at training is left out of its row, the same on every
rank of the CP group (:func:`~vlmcp.train.specs.hf.agree.agree_on_skips`, before sharding); the
first rank of the group warns once per conversation, naming ``file:line`` and the image, and the
summary counts them (``decode_skipped``). The final model is written like a checkpoint
(:mod:`~vlmcp.train.specs.hf.final_model`).
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.data.hf.rows import DataIndex, HFRow, RowLoader, build_row
from vlmcp.train.faults import stall_guard
from vlmcp.train.optim import make_optimizer
from vlmcp.train.spec import Batch, Built, Groups, RowLoss
from vlmcp.train.specs.hf.agree import DecodeSkips, agree_on_skips
from vlmcp.train.specs.hf.config import HFTrainConfig
from vlmcp.train.specs.hf.final_model import save_trained_model
from vlmcp.train.specs.hf.finetune import describe_trainable
from vlmcp.train.specs.hf.model import hf_parts, load_parallel_model

__all__ = ["HFSpec", "check_same_plan", "target_count"]


def target_count(row: HFRow) -> int:
    """Target tokens of a packed row (its next-token labels that are not ``-100``)."""
    from vlmcp.hf.inputs import shift_hf_labels
    from vlmcp.layout.labels import IGNORE_INDEX

    return int((shift_hf_labels(row.labels[0], row.cu_seqlens) != IGNORE_INDEX).sum())


def check_same_plan(index: DataIndex, group: dist.ProcessGroup, device: torch.device) -> None:
    """Every rank must have planned the same rows (under torchrun each rank reads --data itself)."""
    digest = hashlib.sha256(repr((index.lengths, index.rows, index.seq_len)).encode()).digest()
    mine = torch.tensor([float(int.from_bytes(digest[:6], "big"))], dtype=torch.float64, device=device)
    lo, hi = mine.clone(), mine.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
    if lo != hi:
        raise ValueError("ranks planned different rows from --data: is it the same file (and are the "
                         "images the same) on every node?")


@dataclass
class _Rows:
    """This replica's batches: rows from the loader, their skips agreed over the CP group."""

    spec: HFSpec
    groups: Groups
    loader: RowLoader
    steps: int
    position: int

    def __iter__(self):
        spec, cfg = self.spec, self.spec.cfg
        for _ in range(self.steps):
            rows = []
            for _ in range(cfg.grad_accum):
                row = self.loader.next()
                row = agree_on_skips(row, spec.index.rows[row.index], self.loader.rebuild, self.groups.cp,
                                     self.groups.device)
                spec.skips.note(row)
                rows.append(row)
            self.position += cfg.rows_per_step
            yield Batch(rows=rows, position=self.position)

    def close(self) -> None:
        self.loader.close()


@dataclass
class HFSpec:
    """A Hugging Face VLM on its planned conversations.

    Built on the launcher from the config and the planned data (``index``, the same on every
    rank; ``eval_index``: ``--eval-data``), ``steps`` resolved from ``--epochs``; :meth:`build`
    (on each rank, first) loads the processor and the model.
    """

    cfg: HFTrainConfig
    index: DataIndex
    eval_index: DataIndex | None = None
    processor: Any = None
    skips: DecodeSkips | None = None
    """The conversations this rank's CP group left out at training (made by :meth:`build`)."""

    def __post_init__(self) -> None:
        self.cfg = self.cfg.with_steps(len(self.index.rows))

    def __getstate__(self) -> dict:
        # every rank loads its own processor (build): the launcher's is not sent
        return {**self.__dict__, "processor": None}

    def build(self, groups: Groups) -> Built:
        from vlmcp.data.hf.processor import load_processor

        cfg = self.cfg
        check_same_plan(self.index, groups.world, groups.device)
        self.processor = load_processor(cfg.model)
        model = load_parallel_model(cfg, groups.cp, cfg.world_size, groups.device)
        trainable = describe_trainable(cfg, model)
        if trainable and dist.get_rank(groups.world) == 0:
            print(trainable, flush=True)
        self.skips = DecodeSkips(self.index, warn=dist.get_rank(groups.cp) == 0)
        return Built(model, fsdp=cfg.fsdp)

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return make_optimizer(model, self.cfg.lr, self.cfg.weight_decay)

    def parts(self, model: nn.Module) -> dict[str, str]:
        return hf_parts(model)

    def batches(self, groups: Groups, start: int, position: int) -> _Rows:
        cfg = self.cfg
        loader = RowLoader(self.processor, self.index, seed=cfg.seed, dp=cfg.dp,
                           dp_rank=dist.get_rank(groups.dp), start=position,
                           steps=(cfg.steps - start) * cfg.grad_accum)
        return _Rows(self, groups, loader, cfg.steps - start, position)

    def weight(self, row: HFRow) -> float:
        return float(target_count(row))

    def row_loss(self, model: nn.Module, row: HFRow, groups: Groups) -> RowLoss:
        import vlmcp.hf

        cfg = self.cfg
        inputs = {k: v.to(groups.device) for k, v in row.inputs.items()}
        batch = vlmcp.hf.shard_inputs(model, inputs, groups.cp, labels=row.labels.to(groups.device),
                                      cu_seqlens=row.cu_seqlens, sample_placement=cfg.sample_placement,
                                      image_strategy=cfg.image_strategy)
        chunk = cfg.loss_chunk_size if cfg.loss == "chunked" else None
        with vlmcp.hf.offload_activations() if cfg.offload_activations else contextlib.nullcontext():
            res = vlmcp.hf.causal_lm_loss(model, batch, groups.cp, chunk_size=chunk)
        return RowLoss(loss=res.loss, mean=float(res.mean), targets=target_count(row), tokens=row.tokens)

    def eval_rows(self) -> int:
        return 0 if self.eval_index is None else len(self.eval_index.rows)

    def eval_row(self, k: int, groups: Groups) -> HFRow:
        index = self.eval_index
        rebuild = lambda row, exclude: build_row(self.processor, index, row.index, exclude)  # noqa: E731
        row = build_row(self.processor, index, k)
        return agree_on_skips(row, index.rows[row.index], rebuild, groups.cp, groups.device)

    def finish(self, model: nn.Module, groups: Groups, stopped: str | None) -> dict:
        """Every rank's decode skips (``decode_skipped``, a ``Skipped`` per conversation, in data order)
        and, when the run finished, the saved model's directory (``model_dir``; None otherwise)."""
        decode_skipped = self.skips.gather(groups.world)
        model_dir = None
        if stopped is None:
            with stall_guard("saving the model"):
                model_dir = str(save_trained_model(self.cfg, model, self.processor, groups.world, groups.cp))
        return {"model_dir": model_dir, "decode_skipped": decode_skipped}
