"""The seed's summary table, measured: a naive CP layout against vlmcp's, on one model and row.

Layouts, each one training step of the reference VLM on the same packed row:

* ``single process``: the reference (no CP).
* ``naive``: Megatron's zigzag over the merged row (``image_strategy="shard"``) with
  attention limited to each rank's own tokens, as a CP without a cross-rank K/V
  exchange computes it; gradients summed over CP.
* ``vlmcp shard + ring``: the same merged-row zigzag with ring attention (Megatron /
  LongVILA done right): exact, but no rank holds the complete image features.
* ``vlmcp replicate``: the seed's design (complete image embeddings on every rank,
  text zigzagged per sample, ring attention).

Everything in the table is measured: whether every rank holds all image tokens,
ViT and projector gradient norms, loss and worst relative gradient error against
the single process, and saved-for-backward bytes per rank (the largest rank).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from vlmcp.attention import varlen_attention
from vlmcp.debug.meters.saved_tensors import SavedTensorMeter
from vlmcp.grads import grad_norms, reduce_gradients
from vlmcp.layout import RankShard
from vlmcp.models import VLM, VLMConfig
from vlmcp.train.specs.reference.step import forward_backward
from vlmcp.vision import place_vision

__all__ = ["LAYOUTS", "compare_rank", "local_only_attention", "markdown_table"]

LAYOUTS = {  # name: (image_strategy, attention backend or None for the naive local-only one)
    "naive (zigzag merged row, no KV exchange)": ("shard", None),
    "vlmcp shard + ring": ("shard", "ring"),
    "vlmcp replicate + ring (the seed)": ("replicate", "ring"),
}


def local_only_attention(q, k, v, shard: RankShard, group, image_attention: str) -> torch.Tensor:
    """Attention among this rank's own tokens only: what a CP without K/V exchange computes.

    Local sample segments are in global order with padding last, so causal attention on
    the local order is the true mask restricted to local keys.
    """
    ids, img = shard.image_index, shard.is_image
    local_ids = torch.full_like(ids, -1)
    local_ids[img] = torch.unique(ids[img], return_inverse=True)[1]  # renumbered 0.. in local order
    out, _ = varlen_attention(q, k, v, shard.cu_seqlens.long(), img, image_attention, image_ids=local_ids)
    return out * (~shard.is_pad).to(out.dtype)[:, None, None]


def _step(model, row, plan, group, backend):
    rank = 0 if group is None else dist.get_rank(group)
    shard = plan.for_rank(rank)
    with SavedTensorMeter(model.parameters()) as meter:
        out = forward_backward(model, row, shard, group, backend=backend)
    if group is not None:
        reduce_gradients(model, group)
    complete = int(shard.is_image.sum()) == int(plan.image_lens.sum())
    return out, meter.bytes, complete


def compare_rank(group: dist.ProcessGroup, cfg: VLMConfig, row, dtype: str = "float64") -> list[dict]:
    """Measure every layout of :data:`LAYOUTS` and the single process; rows identical on all ranks."""
    P, dt = dist.get_world_size(group), getattr(torch, dtype)
    torch.manual_seed(0)
    ref = VLM(cfg).to(dt)
    base = copy.deepcopy(ref)
    ref_out, ref_bytes, _ = _step(ref, row, row.plan(1), None, "ring")
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    parts = lambda m: {"vit": list(m.vision.tower.parameters()),  # noqa: E731
                       "projector": list(m.vision.projector.parameters())}
    ref_norms = grad_norms(parts(ref), None)
    table = [{"layout": "single process", "cp": 1, "images_complete": True, "vit_grad_norm": ref_norms["vit"],
              "projector_grad_norm": ref_norms["projector"], "loss": float(ref_out.mean),
              "loss_error": 0.0, "max_rel_grad_error": 0.0, "saved_bytes": ref_bytes}]
    for name, (strategy, backend) in LAYOUTS.items():
        model = copy.deepcopy(base)
        place_vision(model.vision, mode="replicate", group=group)
        plan = row.plan(P, image_strategy=strategy)
        out, saved, complete = _step(model, row, plan, group, backend or local_only_attention)
        err = max(float((p.grad - ref_grads[n]).double().norm() / ref_grads[n].double().norm())
                  for n, p in model.named_parameters() if ref_grads[n].norm() > 0)
        norms = grad_norms(parts(model), group)
        stats = torch.tensor([saved, float(not complete), err], dtype=torch.float64)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=group)
        table.append({"layout": name, "cp": P, "images_complete": not bool(stats[1]),
                      "vit_grad_norm": norms["vit"], "projector_grad_norm": norms["projector"],
                      "loss": float(out.mean), "loss_error": abs(float(out.mean) - float(ref_out.mean)),
                      "max_rel_grad_error": float(stats[2]), "saved_bytes": int(stats[0])})
    return table


def markdown_table(rows: list[dict]) -> str:
    """The comparison as a markdown table (saved bytes also relative to one process)."""
    single = rows[0]["saved_bytes"]
    head = ("layout", "P", "image features complete on each rank", "ViT grad norm", "projector grad norm",
            "loss", "loss error", "max rel. grad error", "saved activations / rank")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(
            f"| {r['layout']} | {r['cp']} | {'yes' if r['images_complete'] else 'no'} | "
            f"{r['vit_grad_norm']:.4g} | {r['projector_grad_norm']:.4g} | {r['loss']:.5f} | "
            f"{r['loss_error']:.1e} | {r['max_rel_grad_error']:.1e} | "
            f"{r['saved_bytes'] / 2**20:.2f} MiB ({r['saved_bytes'] / single:.2f}x) |")
    return "\n".join(lines)
