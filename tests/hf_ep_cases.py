"""Rank functions for the expert-parallel tests (importable by name from spawned ranks).

Each function runs a whole grid inside one spawned group. The reference is the unmodified
transformers model in one process, in float64: each packed row's samples run alone (HF computes
their positions and merge), the row's token loss is their summed token losses over its target
count, and, where the model's forward adds a router auxiliary loss, ``router_aux_loss_coef`` times
HF's ``load_balancing_loss_func`` of the router logits of the *whole row* (every sample's, per
layer: the row's global statistics); with DP the replicas' rows are averaged.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.nn import functional as F

import vlmcp
import vlmcp.hf
from vlmcp.grads import finish_ddp_gradients, grad_norms, reduce_gradients
from vlmcp.hf.debug.float64 import _load_balancing, float64_exact, float64_norms
from vlmcp.hf.debug.parity import _sample_inputs, compare_gradients
from vlmcp.hf.debug.synthetic import synthetic_row
from vlmcp.hf.debug.tiny import tiny_arch, tiny_config, tiny_model
from vlmcp.hf.inputs import shift_hf_labels
from vlmcp.hf.moe import expert_groups, expert_load, expert_shards, fully_shard_experts, gather_experts
from vlmcp.layout.validate import check_cu_seqlens
from vlmcp.train.groups import dp_cp_groups

ARCHS = ("qwen3_vl_moe", "qwen3_5_moe", "glm4v_moe", "kimi_k25", "gemma4", "minimax_m3_vl", "llama4",
         "mistral4", "nemotron_h_omni")
"""Every MoE adapter vlmcp has (``mistral4``: Mistral3 over a Mistral 4 LM)."""
AUX = ("qwen3_vl_moe", "qwen3_5_moe", "glm4v_moe", "minimax_m3_vl")
"""The architectures whose forward adds a router auxiliary loss (switched on in these tests)."""
TEXT_ONLY = ((12,), (7,))


def ep_model(arch: str) -> torch.nn.Module:
    """The tiny float64 model of ``arch``, its auxiliary loss on where it has one."""
    overrides = {"text_config": {"output_router_logits": True, "router_aux_loss_coef": 0.5}} if arch in AUX else {}
    model = tiny_model(tiny_config(arch, **overrides), torch.float64)
    float64_norms(model)
    return model


def reference_step(model, inputs: dict, labels: torch.Tensor, cu: torch.Tensor | None, scale: float) -> float:
    """The unmodified model's loss of one packed row (token loss + the row's aux loss); backward of
    ``scale`` times it."""
    cu = check_cu_seqlens(cu, inputs["input_ids"].shape[1])
    losses, count, router = [], 0, []
    for s, sample in enumerate(_sample_inputs(model, inputs, cu)):
        a, b = int(cu[s]), int(cu[s + 1])
        tgt = shift_hf_labels(labels[0, a:b], torch.tensor([0, b - a]))
        out = model(**sample)
        losses.append(F.cross_entropy(out.logits[0], tgt, ignore_index=-100, reduction="sum"))
        count += int((tgt != -100).sum())
        if getattr(out, "router_logits", None) is not None:
            router.append(out.router_logits)
    loss = torch.stack(losses).sum() / max(count, 1)
    text = model.config.get_text_config()
    if router and getattr(text, "output_router_logits", False):
        layers = tuple(torch.cat(per_layer, 0) for per_layer in zip(*router, strict=True))
        experts = text.num_experts if hasattr(text, "num_experts") else text.n_routed_experts
        loss = loss + text.router_aux_loss_coef * _load_balancing(layers, experts, text.num_experts_per_tok)
    (loss * scale).backward()
    return float(loss.detach())


def _rows(model, arch: str, dp: int, text_only: bool = False) -> list[tuple]:
    samples = TEXT_ONLY if text_only else tiny_arch(arch).samples
    return [synthetic_row(model, samples, seed=1 + d) for d in range(dp)]


def _reference(arch: str, dp: int, text_only: bool = False):
    ref = ep_model(arch)
    rows = _rows(ref, arch, dp, text_only)
    with float64_exact(torch.float64):
        losses = [reference_step(ref, *row, scale=1.0 / dp) for row in rows]
    return ref, rows, losses


def _ep_case(group, ref, rows, losses, cp: int, ep: int, attention: str, fsdp: bool = False) -> dict:
    """One (layout, backend) against the reference: loss and every gradient, experts sliced."""
    world = dist.get_world_size(group)
    cp_group, dp_group = dp_cp_groups(group, cp)
    ep_group, edp_group = expert_groups(group, ep)
    model = copy.deepcopy(ref)
    for p in model.parameters():
        p.grad = None
    vlmcp.hf.parallelize(model, cp_group, attention=attention, ep_group=ep_group)
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard_experts(model, edp_group, world)
        mesh = init_device_mesh("cpu", (world,))
        ignored = {p for n, p in model.named_parameters() if n in set(vlmcp.ddp_ignored_params(model))}
        for m in model.modules():
            if type(m).__name__ in set(model._no_split_modules):
                fully_shard(m, mesh=mesh, ignored_params=ignored or None)
        fully_shard(model, mesh=mesh, ignored_params=ignored or None)
    inputs, labels, cu = rows[dist.get_rank(dp_group)]
    with float64_exact(torch.float64):
        batch = vlmcp.hf.shard_inputs(model, inputs, cp_group, labels=labels, cu_seqlens=cu)
        res = vlmcp.hf.causal_lm_loss(model, batch, cp_group, chunk_size=4)
        (res.loss * (cp if fsdp else 1)).backward()
    if fsdp:
        finish_ddp_gradients(model, cp_group, dp_group, expert_dp_group=edp_group)
    else:
        reduce_gradients(model, cp_group, dp_group, expert_dp_group=edp_group)
    total = res.loss.detach().clone()
    dist.all_reduce(total, group=cp_group)
    truth = losses[dist.get_rank(dp_group)]
    loss_err = torch.tensor([abs(float(total) - truth) / abs(truth)], dtype=torch.float64)
    dist.all_reduce(loss_err, op=dist.ReduceOp.MAX, group=group)
    err, worst = compare_gradients(model, ref, group)
    load = expert_load(model, group)
    shards = expert_shards(model)
    grads = dict(ref.named_parameters())
    full = gather_experts(model, {n: p.grad for n, p in model.named_parameters() if n in shards})
    expert_err = max((float((g - grads[n].grad).norm() / grads[n].grad.norm()) for n, g in full.items()),
                     default=0.0)
    out = {"case": (cp, world // cp, ep, attention, fsdp), "loss_rel_error": float(loss_err), "grad": err,
           "worst": worst, "experts": len(full), "expert_grad": expert_err, "expert_pairs": int(load.counts.sum()), "imbalance": load.imbalance}
    if not fsdp:
        params = [p for p in model.parameters() if p.requires_grad]
        norm = grad_norms({"all": params}, cp_group, dp_group)["all"]
        true = float(torch.stack([p.grad.double().norm() for p in ref.parameters() if p.grad is not None]).norm())
        out["norm_rel_error"] = abs(norm - true) / true
    return out


def grid(group: dist.ProcessGroup, archs, layouts, backends=("ring", "ulysses"), fsdp: bool = False,
         text_only: bool = False) -> list[dict]:
    """Every (arch, (cp, ep), backend) case; the world is ``cp * dp`` ranks (``dp = world / cp``)."""
    world = dist.get_world_size(group)
    out = []
    for arch in archs:
        dp = world // layouts[0][0]
        ref, rows, losses = _reference(arch, dp, text_only)
        for cp, ep in layouts:
            for attention in backends:
                out.append({"arch": arch, **_ep_case(group, ref, rows, losses, cp, ep, attention, fsdp)})
    return out
