"""Rank functions of the fine-tuning loop's tests (tests/test_train_hf.py), one spawn for a grid.

:func:`global_batch_grid` trains the same two steps of a tiny LLaVA in float64 seven ways on 2
ranks (DP 2; CP 2 with two accumulated rows and ``hidden_shard``, ``broadcast`` or ``scatter``;
FSDP over DP 2; FSDP over CP 2 with ``hidden_shard``; and a resume in the middle of an
accumulating run) and, on rank 0, once more by hand in one process with plain transformers: each
conversation alone, the loss summed over the global batch's targets, ``clip_grad_norm_``, AdamW.
Every run must give that run's losses, gradient norms and weights.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist

from vlmcp.debug.float64 import float64_exact


def _saved(out: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(out, "model.safetensors"))


def _one_process(cfg, index, eval_index, out: str) -> dict:
    """The run of ``cfg`` by hand: plain transformers, one process, one conversation at a time."""
    from transformers import AutoModelForImageTextToText

    from vlmcp.data.hf.encode import encode_conversation
    from vlmcp.data.hf.processor import load_processor
    from vlmcp.data.hf.rows import row_at
    from vlmcp.train.optim import make_optimizer
    from vlmcp.train.schedule import lr_at

    processor = load_processor(cfg.model)
    model = AutoModelForImageTextToText.from_pretrained(cfg.model, dtype=torch.float64)
    model.train()
    optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay)

    def loss_sum(conv):
        enc = encode_conversation(processor, conv, index.video)
        out = model(input_ids=enc.input_ids[None], **enc.pixels)
        targets = enc.labels[1:]
        return torch.nn.functional.cross_entropy(out.logits[0, :-1], targets, ignore_index=-100,
                                                 reduction="sum"), int((targets != -100).sum())

    losses, norms = [], []
    for step in range(cfg.steps):
        rows = [row_at(index, cfg.seed, step * cfg.rows_per_step + j) for j in range(cfg.rows_per_step)]
        convs = [index.conversations[i] for r in rows for i in index.rows[r]]
        optimizer.zero_grad()
        parts = [loss_sum(c) for c in convs]
        total = sum(n for _, n in parts)
        loss = sum(s for s, _ in parts) / total
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)))
        for g in optimizer.param_groups:
            g["lr"] = lr_at(cfg, step)
        optimizer.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        parts = [loss_sum(c) for c in eval_index.conversations]
    eval_loss = float(sum(s for s, _ in parts) / sum(n for _, n in parts))
    model.save_pretrained(out)  # the weights under the names the trainer's save_pretrained gives them
    return {"losses": losses, "grad_norms": norms, "eval_loss": eval_loss, "weights": _saved(out)}


def _metrics(path: str) -> list[dict]:
    from vlmcp.report.metrics import read_metrics

    return read_metrics(path)


def global_batch_grid(group: dist.ProcessGroup, base, index, eval_index, root: str) -> dict:
    """See the module docstring. Returns, on every rank, what each run gave (rank 0 adds the oracle)."""
    from tests.train_cases import hf_rank

    rank = dist.get_rank(group)
    runs = {
        "dp2": dict(cp=1, dp=2),  # every run's global batch: 2 rows
        "cp2_accum2": dict(cp=2, dp=1, grad_accum=2, vision_mode="hidden_shard", eval_every=1),
        "fsdp_dp2": dict(cp=1, dp=2, fsdp=True),
        # the vision modes that run the ViT on some ranks only, evaluating too (a forward under no_grad)
        "cp2_broadcast": dict(cp=2, dp=1, grad_accum=2, vision_mode="broadcast", eval_every=1),
        "cp2_scatter": dict(cp=2, dp=1, grad_accum=2, vision_mode="scatter", eval_every=1),
        # FSDP shards, hidden_shard's slices (kept out of FSDP) and CP shares in one global norm
        "fsdp_cp2_hidden_shard": dict(cp=2, dp=1, grad_accum=2, fsdp=True, vision_mode="hidden_shard"),
    }
    out: dict = {}
    with float64_exact(torch.float64):
        for name, kw in runs.items():
            cfg = dataclasses.replace(base, output_dir=f"{root}/{name}", metrics_jsonl=f"{root}/{name}.jsonl",
                                      **kw)
            summary = hf_rank(group, cfg, index, None, eval_index)
            out[name] = {"losses": summary["losses"], "evals": summary["evals"],
                         "records": _metrics(cfg.metrics_jsonl) if rank == 0 else None}
        # an accumulating run stopped after its step-1 checkpoint, resumed to its end
        stopped = dataclasses.replace(base, cp=2, grad_accum=2, output_dir=f"{root}/stopped",
                                      checkpoint_dir=f"{root}/ckpt", checkpoint_every=1, save_total_limit=1)
        assert hf_rank(group, stopped, index, nan_at_step=2)["stopped"] == "nonfinite"
        resumed = dataclasses.replace(stopped, output_dir=f"{root}/resumed", resume=True)
        summary = hf_rank(group, resumed, index)
        out["resumed"] = {"start_step": summary["start_step"], "losses": summary["losses"],
                          "checkpoints": sorted(os.listdir(f"{root}/ckpt"))}
        dist.barrier(group=group)
        if rank == 0:
            oracle = dataclasses.replace(base, grad_accum=2)  # the runs' global batch: 2 rows
            out["oracle"] = _one_process(oracle, index, eval_index, f"{root}/oracle")
            out["saved"] = {name: _saved(f"{root}/{name}") for name in (*runs, "resumed")}
    return out
