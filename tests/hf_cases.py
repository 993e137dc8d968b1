"""Rank functions for the Hugging Face tests (importable by name from spawned ranks).

Each function runs a whole grid inside one spawned group (spawning costs seconds).
"""

from __future__ import annotations

import copy
from functools import partial

import torch
import torch.distributed as dist

import vlmcp
import vlmcp.hf
from vlmcp.debug.float64 import float64_exact, float64_norms
from vlmcp.debug.parity.hf import (
    HFParityCase,
    compare_gradients,
    cp_step,
    hf_parity,
    reference_for,
    reference_step,
)
from vlmcp.debug.synthetic import synthetic_row
from vlmcp.debug.tiny import tiny_model
from vlmcp.grads import finish_ddp_gradients
from vlmcp.train.groups import dp_cp_groups

# The rows: prompt text before the image; two images in one sample with text
# between; a packed row of three samples, one of them text-only (Qwen grids; LLaVA
# images are fixed-size whatever the tuple says). Qwen images carry their vision
# start/end markers, as the chat template writes them.
PROMPT_FIRST = ((5, (1, 4, 4), 9),)
TWO_IMAGES = ((3, (1, 4, 8), 4, (1, 4, 4), 7),)
PACKED = ((5, (1, 4, 4), 9), (12,), (3, (1, 4, 8), 4, (1, 4, 4), 7))
# Whole-sample placement: four short samples (three with an image, one text-only) and one
# longer sample with an image. At P=2 "whole" puts the long one on rank 0 and the short
# ones on rank 1; "auto" keeps the long one split (its image on both ranks) and places
# the short ones whole, two per rank. LONE_IMAGE under "whole" leaves rank 1 no image
# token at all: it must still join every vision collective and its dual.
MIXED = ((3, (1, 4, 4), 5), (4, (1, 4, 4), 3), (6,), (2, (1, 4, 4), 6), (40, (1, 4, 4), 80))
LONE_IMAGE = ((3, (1, 4, 4), 5), (12,))
ROWS = {"prompt_first": PROMPT_FIRST, "two_images": TWO_IMAGES, "packed": PACKED, "mixed": MIXED,
        "lone_image": LONE_IMAGE}


def parity_grid(group: dist.ProcessGroup, cases: list[HFParityCase]) -> list[dict]:
    """``hf_parity`` of every case, in order (rank 0's dicts equal every rank's)."""
    refs = {}
    out = []
    for c in cases:  # one single-process step per (model, dtype, row): the CP settings vary
        key = (c.model, c.dtype, c.seed, c.samples, c.markers)
        if key not in refs:
            refs[key] = reference_for(c)
        out.append(hf_parity(group, c, refs[key]))
    return out


def suite(group: dist.ProcessGroup, cases: list[HFParityCase]) -> dict:
    """The P=2 group's whole job: the parity grid, the bad-input errors, the adapter-less VLM."""
    return {"parity": parity_grid(group, cases), "bad_inputs": bad_inputs(group),
            "placeholder": placeholder_parity(group, PROMPT_FIRST)}


def fsdp_grid(group: dist.ProcessGroup, cases: list[tuple[str, str, str]]) -> list[dict]:
    """FSDP2 over DP=2 x CP=2 with the loss scaled by P, against the unmodified model.

    Each case is ``(arch, attention, vision_mode)``. DP replica 0 trains on the packed
    row, replica 1 on a text-only row (its ViT gets no real gradient: the dummy pass
    keeps FSDP's gradient collectives matched). The reference is the DP mean of the two
    rows' single-process losses.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    cp_group, dp_group = dp_cp_groups(group, 2)
    dp_rank = dist.get_rank(dp_group)
    mesh = init_device_mesh("cpu", (dist.get_world_size(group),))
    out = []
    for arch, attention, mode in cases:
        ref = tiny_model(arch, torch.float64)
        float64_norms(ref)
        model = copy.deepcopy(ref)
        rows = [synthetic_row(ref, PACKED, seed=1),
                synthetic_row(ref, ((17,), (6,)), seed=2)]
        with float64_exact(torch.float64):
            ref_losses = [reference_step(ref, *row, scale=0.5) for row in rows]
        vlmcp.hf.parallelize(model, cp_group, attention=attention, vision_mode=mode)
        names = set(vlmcp.ddp_ignored_params(model))  # hidden_shard's slice stays out of FSDP
        ignored = {p for n, p in model.named_parameters() if n in names}
        blocks = set(model._no_split_modules)
        for m in model.modules():
            if type(m).__name__ in blocks:
                fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh, ignored_params=ignored or None)
        inputs, labels, cu = rows[dp_rank]
        with float64_exact(torch.float64):
            loss = cp_step(model, inputs, labels, cu, cp_group, loss_scale=2.0, reduce=False)
        finish_ddp_gradients(model, cp_group, dp_group)
        mean = loss.clone()
        dist.all_reduce(mean, group=dp_group)
        err, worst = compare_gradients(model, ref, group)
        truth = sum(float(x) for x in ref_losses) / 2
        vision_grads = [p.grad is not None for n, p in model.named_parameters()
                        if "vision" in n or "visual" in n]
        refused = ""
        if mode == "replicate":  # the modes where some rank skips the ViT are refused under FSDP
            state = vlmcp.hf.parallel_state(model)
            object.__setattr__(state, "vision_mode", "scatter")
            refused = _raises(partial(vlmcp.hf.shard_inputs, model, inputs, cp_group, labels=labels,
                                      cu_seqlens=cu), "does not work under FSDP")
            object.__setattr__(state, "vision_mode", mode)
        out.append({"case": (arch, attention, mode), "refused": refused,
                    "loss_rel_error": abs(float(mean) / 2 - truth) / truth,
                    "max_rel_grad_error": err, "worst_param": worst, "vision_grads": sum(vision_grads)})
    return out


def _raises(fn, *words) -> str:
    try:
        fn()
    except (ValueError, TypeError, NotImplementedError) as e:
        msg = str(e)
        missing = [w for w in words if w not in msg]
        return f"message lacks {missing}: {msg}" if missing else "ok"
    return "no error"


def bad_inputs(group: dist.ProcessGroup) -> dict[str, str]:
    """Each bad input raises its clear error on every rank, before any collective."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = tiny_model("qwen2_vl", torch.float32)
    vlmcp.hf.parallelize(model, group)
    inputs, labels, cu = synthetic_row(model, PACKED)
    res = {}
    short = dict(inputs, input_ids=inputs["input_ids"].masked_fill(
        torch.arange(inputs["input_ids"].shape[1]) == int((inputs["input_ids"][0] == 120).nonzero()[0]), 7))
    res["image tokens"] = _raises(lambda: vlmcp.hf.shard_inputs(model, short, group, labels=labels,
                                                                cu_seqlens=cu),
                                  "image features and image tokens do not match")
    res["labels"] = _raises(lambda: vlmcp.hf.shard_inputs(model, inputs, group, labels=labels[:, :-1],
                                                          cu_seqlens=cu), "labels", "input_ids")
    bad_cu = cu.clone()
    bad_cu[-1] -= 1
    res["cu_seqlens"] = _raises(lambda: vlmcp.hf.shard_inputs(model, inputs, group, labels=labels,
                                                              cu_seqlens=bad_cu), "cu_seqlens must end at")
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2))
    res["architecture"] = _raises(lambda: vlmcp.hf.parallelize(llama, group), "unsupported architecture",
                                  "llava", "qwen2_5_vl", "qwen2_vl")
    other = tiny_model("llava", torch.float32)
    other.config.model_type = "my_vlm"  # an unregistered placeholder-merge VLM
    res["no adapter"] = _raises(lambda: vlmcp.hf.parallelize(other, group, vision_mode="scatter"),
                                "vision_mode='scatter' needs a vlmcp adapter")
    res["group"] = _raises(lambda: vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu),
                           "not the group")
    fresh = tiny_model("llava", torch.float32)
    res["not parallelized"] = _raises(lambda: vlmcp.hf.shard_inputs(fresh, inputs, group), "parallelize")
    return res


def placeholder_parity(group: dist.ProcessGroup, samples) -> tuple[float, float]:
    """A VLM without an adapter (LLaVA under another model_type) in ``replicate``: (loss, grad) errors."""
    ref = tiny_model("llava", torch.float64)
    ref.config.model_type = "my_vlm"
    float64_norms(ref)
    model = copy.deepcopy(ref)
    row = synthetic_row(ref, samples)
    ref_loss = reference_step(ref, *row)
    vlmcp.hf.parallelize(model, group)
    assert type(vlmcp.hf.parallel_state(model).adapter) is vlmcp.hf.PlaceholderAdapter
    loss = cp_step(model, *row, group)
    err, _ = compare_gradients(model, ref, group)
    return abs(float(loss) - float(ref_loss)) / float(ref_loss), err
