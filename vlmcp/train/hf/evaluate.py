"""The held-out loss of ``vlmcp train --model --eval-data``: every row once, under CP, no grad.

The eval rows are planned like the training rows (same processor, ``--seq-len``, packing) but
never shuffled. DP replica ``d`` takes rows ``d, d + D, d + 2D, ...``; every replica runs the
same number of forwards (``ceil(rows / D)``), the last ones on row 0 with weight 0 where the
rows run out, because FSDP's and the vision modes' collectives need every rank in every
forward. The loss is token-weighted over the whole set::

    eval_loss = sum_rows mean_row * targets_row / sum_rows targets_row

``mean_row`` is the CP group's mean token loss of the row (:func:`vlmcp.hf.causal_lm_loss`) and
``targets_row`` its target count, read from the row's own labels (the same on every rank of the
group); one all-reduce over the world at the end.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from vlmcp.data.hf.rows import DataIndex, build_row
from vlmcp.hf.inputs import shift_hf_labels
from vlmcp.layout.labels import IGNORE_INDEX
from vlmcp.train.hf.agree import agree_on_skips

__all__ = ["evaluate", "target_count"]


def target_count(row) -> int:
    """Target tokens of a packed row (its next-token labels that are not ``-100``)."""
    return int((shift_hf_labels(row.labels[0], row.cu_seqlens) != IGNORE_INDEX).sum())


def evaluate(run, index: DataIndex) -> dict:
    """``{"eval_loss", "eval_tokens", "eval_rows"}`` of ``index`` on the model of ``run`` (a collective).

    ``run`` is the trainer's state (:class:`vlmcp.train.hf.loop._Run`): model, processor, groups.
    """
    import vlmcp.hf

    cfg, model = run.cfg, run.model
    rows = len(index.rows)
    rebuild = lambda row, exclude: build_row(run.processor, index, row.index, exclude)
    total = torch.zeros(2, dtype=torch.float64)  # sum of mean * targets, targets
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for k in range(math.ceil(rows / cfg.dp)):
                g = k * cfg.dp + run.dp_rank
                row = build_row(run.processor, index, g if g < rows else 0)
                row = agree_on_skips(row, index.rows[row.index], rebuild, run.cp_group, run.device)
                inputs = {key: v.to(run.device) for key, v in row.inputs.items()}
                batch = vlmcp.hf.shard_inputs(model, inputs, run.cp_group, labels=row.labels.to(run.device),
                                              cu_seqlens=row.cu_seqlens,
                                              sample_placement=cfg.sample_placement,
                                              image_strategy=cfg.image_strategy)
                chunk = cfg.loss_chunk_size if cfg.loss == "chunked" else None
                res = vlmcp.hf.causal_lm_loss(model, batch, run.cp_group, chunk_size=chunk)
                if g < rows:
                    n = target_count(row)
                    total += torch.tensor([float(res.mean) * n, float(n)], dtype=torch.float64)
    finally:
        model.train(was_training)
    total = (total / cfg.cp).to(run.device)  # every rank of a CP group holds the same sums
    dist.all_reduce(total, group=run.group)
    loss_sum, tokens = total.cpu().tolist()
    return {"eval_loss": loss_sum / tokens if tokens else float("nan"), "eval_tokens": int(round(tokens)),
            "eval_rows": rows}
