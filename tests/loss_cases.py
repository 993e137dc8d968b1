"""Rank functions for the chunked-loss tests (importable by name from spawned ranks).

Each function runs a whole grid inside one spawned group (spawning costs seconds).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.nn import functional as F

import vlmcp
import vlmcp.hf
from vlmcp.debug.float64 import float64_exact, float64_norms
from vlmcp.debug.parity.hf import compare_gradients, reference_step
from vlmcp.debug.synthetic import synthetic_row
from vlmcp.debug.tiny import tiny_arch, tiny_config, tiny_model
from vlmcp.train.groups import dp_cp_groups

ARCHS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v", "qwen3_5", "lfm2_vl", "gemma3",
         "llava", "llava_next", "llava_onevision", "internvl", "smolvlm", "idefics3", "mistral3", "kimi_k25",
         "nemotron_h_omni")
"""Every architecture of the README's table (one tiny model each)."""
QWEN_ROW = ((5, (1, 4, 4), 9), (12,))
VARIANTS = {  # arch -> (config overrides, label rule): the grid's special cases, each on one architecture
    "qwen2_5_vl": ({"tie_word_embeddings": True}, None),
    "gemma3": ({"text_config": {"final_logit_softcapping": 3.0}}, None),  # read by Gemma3ForCausalLM only
    "llava": ({}, "first"),
    "qwen3_vl_moe": ({"text_config": {"output_router_logits": True, "router_aux_loss_coef": 0.5}}, None),
}
"""Qwen2.5-VL with tied embeddings; Gemma 3 with ``final_logit_softcapping`` set (its VLM forward does
not apply it, so the chunked loss must not either); LLaVA with targets in the first sample's first
tokens only (under P >= 2 some ranks have none); Qwen3-VL-MoE with its router's auxiliary loss."""


def arch_row(arch: str) -> tuple:
    """A sample with an image between a prompt and its answer, then a text-only sample (the first two
    samples of ``vlmcp verify``'s row, in the architecture's image terms)."""
    return tiny_arch(arch).samples[:2]


def _build(arch: str):
    overrides, rule = VARIANTS.get(arch, ({}, None))
    model = tiny_model(tiny_config(arch, **copy.deepcopy(overrides)) if overrides else arch, torch.float64)
    inputs, labels, cu = synthetic_row(model, arch_row(arch))
    if rule == "first":  # only the first sample's first targets: under P >= 2 some ranks have none
        labels = labels.clone()
        labels[0, 4:] = -100
    return model, (inputs, labels, cu)


def _step(model, row, group, chunk_size):
    with float64_exact(torch.float64):
        batch = vlmcp.hf.shard_inputs(model, row[0], group, labels=row[1], cu_seqlens=row[2])
        res = vlmcp.hf.causal_lm_loss(model, batch, group, chunk_size=chunk_size)
        res.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return res, grads, int((batch.labels != -100).sum())


def hf_grid(group: dist.ProcessGroup | None, archs: list[str], chunk_size: int = 3) -> list[dict]:
    """Per model: ``causal_lm_loss`` chunked against the full-logits path on this rank (loss share,
    group mean and every parameter's local gradient share, before any reduction)."""
    out = []
    for name in archs:
        model, row = _build(name)
        vlmcp.hf.parallelize(model, group)
        full, g_full, targets = _step(model, row, group, None)
        chunked, g_chunked, _ = _step(model, row, group, chunk_size)
        errs = {n: float((g_chunked[n] - g).norm() / max(float(g.norm()), 1e-300)) for n, g in g_full.items()
                if n in g_chunked}
        worst = max(errs, key=errs.get)
        # the head's weight by name (tied: the embedding's; Nemotron-H-Omni's head is its language model's)
        lm_head = model.get_submodule(vlmcp.hf.adapter_for(model).lm_head)
        head = next(n for n, p in model.named_parameters() if p is lm_head.weight)
        out.append({"name": name, "loss_err": abs(float(full.loss.detach()) - float(chunked.loss.detach())),
                    "mean_err": abs(float(full.mean) - float(chunked.mean)), "mean": float(full.mean),
                    "max_grad_err": errs[worst], "worst": worst, "same_params": set(g_full) == set(g_chunked),
                    "head": head, "head_err": errs.get(head), "targets": targets, "params": len(g_full),
                    "tied": lm_head.weight is model.get_input_embeddings().weight})
    return out


def moe_against_hf(group: dist.ProcessGroup | None) -> dict:
    """Qwen3-VL-MoE with ``output_router_logits``: the CP loss (token loss + the router's aux share)
    summed over the group, and every reduced gradient, against the unmodified model in one process
    on one sample: its mean token loss plus ``router_aux_loss_coef`` times its own ``aux_loss``
    (HF's ``loss`` itself upcasts the logits to float32, so it is no float64 reference)."""
    model, (inputs, labels, _) = _build("qwen3_vl_moe")
    float64_norms(model)
    ref = copy.deepcopy(model)
    with float64_exact(torch.float64):
        ref_out = ref(**inputs)
        targets = vlmcp.hf.shift_hf_labels(labels[0], torch.tensor([0, labels.shape[1]]))
        aux = model.config.text_config.router_aux_loss_coef * ref_out.aux_loss
        ref_loss = F.cross_entropy(ref_out.logits[0], targets) + aux
        ref_loss.backward()
    vlmcp.hf.parallelize(model, group)
    with float64_exact(torch.float64):
        batch = vlmcp.hf.shard_inputs(model, inputs, group, labels=labels)
        res = vlmcp.hf.causal_lm_loss(model, batch, group, chunk_size=4)
        res.loss.backward()
    total = res.loss.detach().clone()
    if group is not None:
        dist.all_reduce(total, group=group)
    vlmcp.reduce_gradients(model, group)
    err, worst = compare_gradients(model, ref, group)
    ref_loss, aux = float(ref_loss.detach()), float(aux.detach())
    return {"loss_err": abs(float(total) - ref_loss) / ref_loss, "aux": aux,
            "aux_dtype": str(ref_out.aux_loss.dtype), "max_grad_err": err, "worst": worst}


def op_grid(group: dist.ProcessGroup | None) -> list[dict]:
    """``cp_linear_cross_entropy`` on this rank's slice of a global row (rank 1 has no target) against
    one process's ``cp_cross_entropy`` of the full logits: loss sum over the group, mean, and the
    gradients (hidden rows owned here; weight and bias summed over the group), in float64."""
    rank = 0 if group is None else dist.get_rank(group)
    world = 1 if group is None else dist.get_world_size(group)
    out = []
    for bias, softcap, chunk in ((False, None, 5), (True, 2.5, 3), (True, None, 64)):
        g = torch.Generator().manual_seed(7)
        n, h, v = 12 * world, 8, 40
        hidden = torch.randn(n, h, generator=g, dtype=torch.float64)
        weight = torch.randn(v, h, generator=g, dtype=torch.float64)
        b = torch.randn(v, generator=g, dtype=torch.float64) if bias else None
        labels = torch.randint(0, v, (n,), generator=g)
        labels[::4] = -100
        labels[12:24] = -100  # rank 1's rows: no target there
        leaves = [t.clone().requires_grad_() for t in (hidden, weight) + ((b,) if bias else ())]
        z = F.linear(leaves[0], leaves[1], leaves[2] if bias else None)
        if softcap:
            z = softcap * torch.tanh(z / softcap)
        ref = vlmcp.cp_cross_entropy(z, labels, None)
        ref.loss.backward()
        mine = [t.clone().requires_grad_() for t in (hidden, weight) + ((b,) if bias else ())]
        rows = slice(12 * rank, 12 * (rank + 1))
        local_h = mine[0][rows]
        res = vlmcp.cp_linear_cross_entropy(local_h, mine[1], labels[rows], group,
                                            bias=mine[2] if bias else None, chunk_size=chunk, softcap=softcap)
        res.loss.backward()
        total = res.loss.detach().clone()
        shared = torch.cat([t.grad.flatten() for t in mine[1:]])
        if group is not None:
            dist.all_reduce(total, group=group)
            dist.all_reduce(shared, group=group)
        want = torch.cat([t.grad.flatten() for t in leaves[1:]])
        out.append({"case": (bias, softcap, chunk), "loss_err": abs(float(total - ref.loss.detach())),
                    "mean_err": abs(float(res.mean - ref.mean)),
                    "hidden_err": float((mine[0].grad[rows] - leaves[0].grad[rows]).abs().max()),
                    "shared_err": float((shared - want).abs().max()),
                    "local_targets": int((labels[rows] != -100).sum())})
    return out


def suite(group: dist.ProcessGroup | None, archs: list[str]) -> dict:
    """A P-group's whole job: the op against one process, every model chunked against full logits,
    the MoE aux loss against the model's own, autocast bf16 against one process."""
    return {"op": op_grid(group), "hf": hf_grid(group, archs), "moe": moe_against_hf(group),
            "autocast": autocast_grid(group)}


def fsdp_head(group: dist.ProcessGroup, cases: list[tuple[str, str]]) -> list[dict]:
    """FSDP2 over DP=2 x CP=2 (loss scaled by P), the head sharded: in the root's unit (``"root"``, as
    ``vlmcp train --fsdp`` does) or in its own (``"own"``); every gradient, the head's included,
    against the unmodified model in one process (the DP mean of two rows' losses)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    cp_group, dp_group = dp_cp_groups(group, 2)
    dp_rank = dist.get_rank(dp_group)
    mesh = init_device_mesh("cpu", (dist.get_world_size(group),))
    out = []
    for arch, head in cases:
        ref = tiny_model(arch, torch.float64)
        float64_norms(ref)
        model = copy.deepcopy(ref)
        rows = [synthetic_row(ref, arch_row(arch), seed=1), synthetic_row(ref, ((17,), (6,)), seed=2)]
        with float64_exact(torch.float64):
            ref_losses = [reference_step(ref, *row, scale=0.5) for row in rows]
        vlmcp.hf.parallelize(model, cp_group)
        blocks = set(model._no_split_modules)
        for m in model.modules():
            if type(m).__name__ in blocks:
                fully_shard(m, mesh=mesh)
        if head == "own":
            fully_shard(model.lm_head, mesh=mesh)
        fully_shard(model, mesh=mesh)
        inputs, labels, cu = rows[dp_rank]
        with float64_exact(torch.float64):
            batch = vlmcp.hf.shard_inputs(model, inputs, cp_group, labels=labels, cu_seqlens=cu)
            res = vlmcp.hf.causal_lm_loss(model, batch, cp_group, chunk_size=4)
            (res.loss * 2).backward()
        vlmcp.finish_ddp_gradients(model, cp_group, dp_group)
        mean = res.mean.clone()
        dist.all_reduce(mean, group=dp_group)
        err, worst = compare_gradients(model, ref, group)
        head_err, _ = compare_gradients(_only(model, "lm_head."), _only(ref, "lm_head."), group)
        truth = sum(float(x) for x in ref_losses) / 2
        out.append({"case": (arch, head), "loss_rel_error": abs(float(mean) / 2 - truth) / truth,
                    "max_rel_grad_error": err, "worst_param": worst, "head_err": head_err,
                    "head_is_dtensor": type(model.lm_head.weight).__name__ == "DTensor"})
    return out


class _only(torch.nn.Module):
    """A module whose parameters are ``model``'s named with ``prefix`` (for compare_gradients)."""

    def __init__(self, model, prefix):
        super().__init__()
        self._params = [(n, p) for n, p in model.named_parameters() if n.startswith(prefix)]

    def named_parameters(self, *args, **kwargs):
        return iter(self._params)


def autocast_grid(group: dist.ProcessGroup | None, archs=("qwen2_vl", "qwen2_5_vl", "llava")) -> list[dict]:
    """A ``torch.autocast`` bf16 step under CP (the chunked loss) against the unmodified model's
    autocast bf16 step in one process (each sample alone), float32 parameters; ``bf16_err`` is the
    autocast reference's own error against float32, the scale of bf16 rounding."""
    out = []
    for arch in archs:
        ref = tiny_model(arch, torch.float32)
        fp32 = copy.deepcopy(ref)
        model = copy.deepcopy(ref)
        row = synthetic_row(ref, arch_row(arch), dtype=torch.float32)
        reference_step(fp32, *row)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ref_loss = reference_step(ref, *row)
        vlmcp.hf.parallelize(model, group)
        batch = vlmcp.hf.shard_inputs(model, row[0], group, labels=row[1], cu_seqlens=row[2])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            res = vlmcp.hf.causal_lm_loss(model, batch, group, chunk_size=8)
        res.loss.backward()
        vlmcp.reduce_gradients(model, group)
        err, worst = compare_gradients(model, ref, group)
        bf16_err, _ = compare_gradients(ref, fp32, None)
        out.append({"arch": arch, "loss_err": abs(float(res.mean) - float(ref_loss)) / float(ref_loss),
                    "max_grad_err": err, "worst": worst, "bf16_err": bf16_err})
    return out
