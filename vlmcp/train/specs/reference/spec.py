"""The reference VLM as a :class:`~vlmcp.train.spec.TrainSpec`: its model, its built-in rows, its loss.

Each step the global batch is the next ``dp * grad_accum`` packed rows of the built-in dataset
(every rank packs the same rows: images are tiny); DP replica ``d`` takes rows ``a * D + d`` for
``a < grad_accum``, so a one-row step takes ``rows[dp_rank]`` as the reference trainer always
has, and the data position after the step (``rows[-1].stop``) does not depend on the CP size.
Each row is planned for the CP group (``--image-strategy``, ``--sample-placement``, the cost
model of this run's shape) and its loss computed by :func:`~.step.row_loss`; every row weighs 1
in the global batch (Note [vlmcp HF global batch: one normaliser]).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.data import VOCAB_SIZE, PackedRow, ShapesConfig, ShapesDataset, pack_rows
from vlmcp.layout import CostModel, RankShard
from vlmcp.models import VLM, LLMConfig, VLMConfig
from vlmcp.train.options import TORCH_DTYPES
from vlmcp.train.spec import Batch, Built, Groups, RowLoss
from vlmcp.train.specs.reference.config import EVAL_SEED, ReferenceTrainConfig
from vlmcp.train.specs.reference.step import row_loss
from vlmcp.vision import VisionConfig, place_vision

__all__ = ["PlannedRow", "ReferenceSpec", "cost_model", "dataset_config", "model_config"]


def model_config(cfg: ReferenceTrainConfig) -> VLMConfig:
    """The reference VLM sized by the run's flags."""
    llm = LLMConfig(vocab_size=VOCAB_SIZE, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads,
                    kv_heads=cfg.kv_heads, mlp_hidden=2 * cfg.hidden)
    vision = VisionConfig(out_dim=cfg.hidden, patch_size=8, width=32, depth=2, heads=2,
                          mlp_hidden=64, projector_hidden=64)
    return VLMConfig(llm=llm, vision=vision)


def dataset_config(cfg: ReferenceTrainConfig, seed: int | None = None) -> ShapesConfig:
    """The built-in dataset of a run (``seed``: another stream of it, for the held-out rows)."""
    return ShapesConfig(seed=cfg.seed if seed is None else seed, patch_size=8)


def cost_model(cfg: ReferenceTrainConfig) -> CostModel:
    """``image_strategy="auto"``'s weights: this run's LLM shape, ``--flops-per-byte``.

    Every rank builds it from the same flags, so every rank makes the same choice
    (a per-rank measured value would let ranks disagree and hang).
    """
    return CostModel.for_transformer(hidden_size=cfg.hidden, mlp_ratio=2.0, kv_heads=cfg.kv_heads,
                                     head_dim=cfg.hidden // cfg.heads,
                                     itemsize=TORCH_DTYPES[cfg.dtype].itemsize,
                                     flops_per_byte=cfg.flops_per_byte,
                                     image_attention=cfg.image_attention)


class PlannedRow(NamedTuple):
    """A packed row and this CP rank's part of its plan."""

    row: PackedRow
    shard: RankShard
    image_strategy: str
    """The layout the plan chose (``auto`` picks per row)."""


@dataclass
class _Rows:
    """This replica's batches, packed and planned step by step (see the module docstring)."""

    spec: ReferenceSpec
    groups: Groups
    steps: int
    position: int

    def __iter__(self):
        cfg, d = self.spec.cfg, dist.get_rank(self.groups.dp)
        for _ in range(self.steps):
            rows = pack_rows(self.spec.dataset, cfg.seq_len, self.position, cfg.rows_per_step)
            mine = [self.spec.plan(rows[a * cfg.dp + d], self.groups) for a in range(cfg.grad_accum)]
            if d == 0:  # the summary's image strategies are DP replica 0's rows
                self.spec.strategies += [r.image_strategy for r in mine]
            self.position = rows[-1].stop
            yield Batch(rows=mine, position=self.position)

    def close(self) -> None:
        pass


@dataclass
class ReferenceSpec:
    """The reference VLM (ViT + projector + a small LLM) on the built-in shapes-and-captions data.

    Built on the launcher from its config alone; :meth:`build` (on each rank, first) makes the
    dataset and the model.
    """

    cfg: ReferenceTrainConfig
    strategies: list[str] = field(default_factory=list)
    """The image strategy of each of DP replica 0's training rows so far."""
    dataset: Any = None
    """The built-in dataset (made by :meth:`build`, on the rank)."""
    costs: CostModel | None = None
    held_out: list[PackedRow] | None = None
    """The packed held-out rows (``--eval-rows``), packed at the first evaluation."""

    def build(self, groups: Groups) -> Built:
        cfg = self.cfg
        if cfg.usp_size is not None:  # every rank, here: new_group is collective over the job
            from vlmcp.attention import usp_groups

            usp_groups(groups.cp, cfg.usp_size, timedelta(seconds=cfg.timeout))
        self.dataset = ShapesDataset(dataset_config(cfg))
        uses_costs = cfg.image_strategy == "auto" or cfg.sample_placement != "split"
        self.costs = cost_model(cfg) if uses_costs else None
        torch.manual_seed(cfg.seed)
        model = VLM(model_config(cfg)).to(device=groups.device, dtype=TORCH_DTYPES[cfg.dtype])
        place_vision(model.vision, mode=cfg.vision_mode, group=groups.cp)
        return Built(model)

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        # one group, every parameter decayed: the optimizer state of the reference VLM's checkpoints
        return torch.optim.AdamW(model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)

    def parts(self, model: nn.Module) -> dict[str, str]:
        part = {id(p): name for name, module in (("vision", model.vision.tower),
                                                 ("projector", model.vision.projector), ("llm", model.llm))
                for p in module.parameters()}
        return {name: part[id(p)] for name, p in model.named_parameters()}

    def plan(self, row: PackedRow, groups: Groups) -> PlannedRow:
        """``row`` planned for the CP group; this rank's part."""
        cfg = self.cfg
        plan = row.plan(cfg.cp, image_strategy=cfg.image_strategy, cost_model=self.costs,
                        sample_placement=cfg.sample_placement)
        return PlannedRow(row, plan.for_rank(dist.get_rank(groups.cp)), plan.image_strategy)

    def batches(self, groups: Groups, start: int, position: int) -> _Rows:
        return _Rows(self, groups, self.cfg.steps - start, position)

    def weight(self, row: PlannedRow) -> float:
        return 1.0

    def row_loss(self, model: nn.Module, row: PlannedRow, groups: Groups) -> RowLoss:
        cfg = self.cfg
        out = row_loss(model, row.row, row.shard, groups.cp, backend=cfg.attention,
                       image_attention=cfg.image_attention, ulysses_size=cfg.usp_size)
        return RowLoss(loss=out.loss, mean=float(out.mean), targets=row.row.num_targets, tokens=cfg.seq_len)

    def eval_rows(self) -> int:
        return self.cfg.eval_rows

    def eval_row(self, k: int, groups: Groups) -> PlannedRow:
        if self.held_out is None:  # rows of a stream training never reads
            held = ShapesDataset(dataset_config(self.cfg, seed=self.cfg.seed + EVAL_SEED))
            self.held_out = pack_rows(held, self.cfg.seq_len, 0, self.cfg.eval_rows)
        return self.plan(self.held_out[k], groups)

    def finish(self, model: nn.Module, groups: Groups, stopped: str | None) -> dict:
        """The reference VLM's output is its checkpoints; the summary adds the parameters' sum on this
        rank (equal on every rank of a replica) and the image strategies of DP replica 0's rows."""
        checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
        return {"param_checksum": checksum, "image_strategies": list(self.strategies)}
