"""Rank functions for the tests of issue 27's architectures (importable by name from spawned ranks).

GLM-4.5V/4.6V, Mistral 4, Llama 4, ... (``tests/hf_archs.py``: NEW_ARCHS). Each function runs a
whole grid inside one spawned group (spawning costs seconds): :func:`suite` is the P=2 group's job.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.nn import functional as F

import vlmcp
import vlmcp.hf
from tests.hf_cases import parity_grid
from vlmcp.debug.float64 import float64_exact, float64_norms
from vlmcp.debug.parity.hf import compare_gradients
from vlmcp.debug.synthetic import synthetic_row
from vlmcp.debug.tiny import tiny_arch, tiny_config, tiny_model

MOE_AUX = {arch: {"text_config": {"output_router_logits": True, "router_aux_loss_coef": 0.5}}
           for arch in ("glm4v_moe", "minimax_m3_vl")}
"""Architectures whose forward adds a router auxiliary loss, and the overrides that switch it on."""


def moe_aux(group: dist.ProcessGroup | None, arch: str) -> dict:
    """``arch`` with ``output_router_logits``: vlmcp's loss (token loss + the router's aux share) summed over
    the group, and every reduced gradient, against the unmodified model in one process on one sample with
    an image: its mean token loss plus ``router_aux_loss_coef`` times its own ``aux_loss``."""
    model = tiny_model(tiny_config(arch, **copy.deepcopy(MOE_AUX[arch])), torch.float64)
    float64_norms(model)
    inputs, labels, _ = synthetic_row(model, tiny_arch(arch).samples[:1])
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
    ref_loss = float(ref_loss.detach())
    return {"arch": arch, "loss_err": abs(float(total) - ref_loss) / ref_loss, "aux": float(aux.detach()),
            "max_grad_err": err, "worst": worst}


RELABELLED = {"llava": ((5, (1,), 9), (12,), (3, (1,), 4, (1,), 7)), "qwen2_vl": None, "qwen3_vl": None,
              "glm4v": None}
"""Known families under a model type vlmcp has no adapter for (the long tail's path), and their rows
(None: the tiny registry's): LLaVA's images in two samples need the row's own counts."""


def relabelled(group: dist.ProcessGroup | None, archs) -> list[dict]:
    """Per arch, the tiny model with ``config.model_type = "my_" + arch`` (no adapter) against the
    unmodified model: the adapter vlmcp picked and the parity (replicate, ring) on a packed row."""
    from vlmcp.debug.parity.hf import HFParityCase, hf_parity, reference_for

    out = []
    for arch in archs:
        model = tiny_model(arch, torch.float64)
        model.config.model_type = f"my_{arch}"
        samples = RELABELLED[arch] or tiny_arch(arch).samples
        case = HFParityCase(model=f"hf:{arch}", samples=samples)
        r = hf_parity(group, case, reference_for(case, model))
        out.append({**r, "arch": arch, "adapter": type(vlmcp.hf.adapter_for(model)).__name__})
    return out


def suite(group: dist.ProcessGroup, cases, aux_archs, relabel) -> dict:
    """The P=2 group's whole job: the parity grid, the MoE auxiliary losses, the long tail's path."""
    return {"parity": parity_grid(group, cases), "aux": [moe_aux(group, a) for a in aux_archs],
            "relabelled": relabelled(group, relabel)}
