"""Rank functions for the Qwen3-VL (deepstack) and GLM-4.1V tests (importable by name from spawned ranks).

Each function runs a whole grid inside one spawned group (spawning costs seconds).
A case may override Qwen3-VL's ``deepstack_visual_indexes`` (``levels``): ``(0, 1)``
adds one level after each of LLM layers 0 and 1, and the LLM then has three layers (a
level added after the last layer reaches only image tokens' logits, which have no target).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

import vlmcp
import vlmcp.hf
import vlmcp.vision.modes as vision_modes
from vlmcp.debug.float64 import float64_exact, float64_norms
from vlmcp.debug.parity.hf import (
    DTYPES,
    HFParityCase,
    Reference,
    _sample_inputs,
    hf_parity,
    reference_step,
)
from vlmcp.debug.synthetic import synthetic_row
from vlmcp.debug.tiny import tiny_config, tiny_model


def _model(arch: str, dtype: torch.dtype, seed: int = 0, levels: tuple[int, ...] | None = None):
    config = tiny_config(arch) if levels is None else tiny_config(
        arch, vision_config={"deepstack_visual_indexes": list(levels)},
        text_config={"num_hidden_layers": len(levels) + 1})
    model = tiny_model(config, dtype, seed=seed)
    if dtype == torch.float64:
        float64_norms(model)
    return model


def _reference(case: HFParityCase, levels) -> Reference:
    dtype = DTYPES[case.dtype]
    ref = _model(case.model.removeprefix("hf:"), dtype, case.seed, levels)
    row = synthetic_row(ref, case.samples, seed=case.seed, markers=case.markers)
    with float64_exact(dtype):
        loss = reference_step(ref, *row)
    return Reference(model=ref, loss=loss, row=row)


def _deepstack_grad_norms(model) -> list[float]:
    """Per deepstack level, the norm of its merger's gradient in the single-process step."""
    mergers = getattr(model.model.visual, "deepstack_merger_list", [])
    return [float(torch.stack([p.grad.norm() for p in m.parameters()]).norm()) for m in mergers]


Case = tuple[HFParityCase, tuple[int, ...] | None]
"""A parity case and its ``deepstack_visual_indexes`` (None: the tiny config's ``[0]``)."""


def parity_grid(group: dist.ProcessGroup, cases: list[Case]) -> list[dict]:
    """``hf_parity`` of every ``(case, levels)``, plus the reference's deepstack gradient norms."""
    refs, out = {}, []
    for case, levels in cases:
        key = (case.model, case.dtype, case.seed, case.samples, case.markers, levels)
        if key not in refs:
            refs[key] = _reference(case, levels)
        res = hf_parity(group, case, refs[key])
        out.append({**res, "levels": levels, "deepstack_grad_norms": _deepstack_grad_norms(refs[key].model)})
    return out


def _capture(model, layers: list[int]):
    """Pre-hooks recording the hidden states entering ``layers`` (the index past the last: the norm)."""
    lm = model.model.language_model
    seen: dict[int, torch.Tensor] = {}
    handles = []
    for i in layers:
        module = lm.layers[i] if i < len(lm.layers) else lm.norm
        handles.append(module.register_forward_pre_hook(
            lambda mod, args, i=i: seen.__setitem__(i, args[0][0].detach().clone())))
    return seen, handles


def deepstack_rows(group: dist.ProcessGroup, cases: list[tuple[str, str, str, str]]) -> list[dict]:
    """Hidden states after each deepstack layer, gathered over the CP group, against one process.

    Each case is ``(attention, vision_mode, row, sample_placement)`` on a tiny Qwen3-VL
    with two levels (after LLM layers 0 and 1). The single-process side runs each sample
    alone; the CP side's local rows are put back at their global positions (replicated
    image rows from every rank that holds them, which must agree). Also returned:
    how much deepstack changed the reference at image and at text rows.
    """
    from tests.hf_cases import ROWS

    rank = dist.get_rank(group)
    base = _model("qwen3_vl", torch.float64, levels=(0, 1))
    out = []
    for attention, mode, row_name, placement in cases:
        inputs, labels, cu = synthetic_row(base, ROWS[row_name])
        ids = inputs["input_ids"][0]
        is_image = ids == base.config.image_token_id
        # one process: per sample, the states entering layer 1 and the final norm (after levels 0 and 1),
        # and the output of layer 0 before deepstack (layer 0's forward output)
        ref = copy.deepcopy(base)
        seen, handles = _capture(ref, [1, 2])
        pre0: list[torch.Tensor] = []
        handles.append(ref.model.language_model.layers[0].register_forward_hook(
            lambda mod, args, output, pre0=pre0: pre0.append(output[0].detach().clone())))
        want = {1: [], 2: []}
        with torch.no_grad(), float64_exact(torch.float64):
            for sample in _sample_inputs(ref, inputs, cu):
                ref(**sample)
                for i in want:
                    want[i].append(seen[i])
        for h in handles:
            h.remove()
        want = {i: torch.cat(v) for i, v in want.items()}
        before = torch.cat(pre0)
        # CP: this rank's rows at their global positions
        model = copy.deepcopy(base)
        vlmcp.hf.parallelize(model, group, attention=attention, vision_mode=mode)
        seen, handles = _capture(model, [1, 2])
        with torch.no_grad(), float64_exact(torch.float64):
            batch = vlmcp.hf.shard_inputs(model, inputs, group, labels=labels, cu_seqlens=cu,
                                          sample_placement=placement)
            model(**batch.model_inputs)
        for h in handles:
            h.remove()
        gathered = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, (batch.shard.positions, {i: seen[i] for i in (1, 2)}))
        err, copies = {}, 0.0
        for i in (1, 2):
            got = torch.full_like(want[i], float("nan"))
            for positions, states in gathered:
                keep = positions >= 0
                prev, new = got[positions[keep]], states[i][keep]
                both = ~prev.isnan().any(-1)  # a replicated row seen on an earlier rank
                if both.any():
                    copies = max(copies, float((prev[both] - new[both]).abs().max()))
                got[positions[keep]] = new
            err[i] = float((got - want[i]).norm() / want[i].norm())
        delta = (want[1] - before).norm(dim=-1)
        out.append({"case": (attention, mode, row_name, placement), "rank": rank,
                    "err_after_layer0": err[1], "err_after_layer1": err[2], "replica_disagreement": copies,
                    "deepstack_at_image_rows": float(delta[is_image].min()),
                    "deepstack_at_text_rows": float(delta[~is_image].max()),
                    "image_tokens_per_rank": [int(s.is_image.sum()) for s in batch.shard.plan.shards()]})
    return out


def collectives(group: dist.ProcessGroup, modes: list[str]) -> list[dict]:
    """Per vision mode, on a two-level Qwen3-VL: the vision wrapper's collectives and their input shapes.

    Also the widths of every projector's last Linear after ``parallelize`` (``hidden_shard``
    cuts them). The all-reduce is the hook's, in backward; the others run in forward.
    """
    from tests.hf_cases import PACKED

    base = _model("qwen3_vl", torch.float64, levels=(0, 1))
    inputs, labels, cu = synthetic_row(base, PACKED)
    saved = {n: getattr(vision_modes, n) for n in ("all_gather", "broadcast", "_all_reduce")}
    out = []
    for mode in modes:
        calls = []

        def counted(name, fn, calls=calls):
            def wrapper(x, *args, **kwargs):
                calls.append((name, tuple(x.shape)))
                return fn(x, *args, **kwargs)
            return wrapper

        model = copy.deepcopy(base)
        vlmcp.hf.parallelize(model, group, vision_mode=mode)
        visual = model.model.visual
        widths = [visual.merger.linear_fc2.out_features] + [m.linear_fc2.out_features
                                                           for m in visual.deepstack_merger_list]
        try:
            for n, fn in saved.items():
                setattr(vision_modes, n, counted(n, fn))
            batch = vlmcp.hf.shard_inputs(model, inputs, group, labels=labels, cu_seqlens=cu)
            loss, _ = vlmcp.cp_cross_entropy(model(**batch.model_inputs).logits[0], batch.labels, group)
            loss.backward()
        finally:
            for n, fn in saved.items():
                setattr(vision_modes, n, fn)
        out.append({"mode": mode, "calls": calls, "widths": widths})
    return out


def dummy_vision(group: dist.ProcessGroup, modes: list[str]) -> list[dict]:
    """Per vision mode, a text-only row with ``dummy_vision``: the loss without it, and the vision grads.

    Returns the loss difference and how many vision parameters got no gradient or a nonzero one.
    """
    base = _model("qwen3_vl", torch.float64, levels=(0, 1))
    inputs, labels, cu = synthetic_row(base, ((9,), (14,)))  # no image anywhere
    out = []
    for mode in modes:
        losses, bad = [], 0
        for dummy in (False, True):
            model = copy.deepcopy(base)
            vlmcp.hf.parallelize(model, group, vision_mode=mode, dummy_vision=dummy)
            batch = vlmcp.hf.shard_inputs(model, inputs, group, labels=labels, cu_seqlens=cu)
            loss, mean = vlmcp.cp_cross_entropy(model(**batch.model_inputs).logits[0], batch.labels, group)
            loss.backward()
            losses.append(float(mean))
            if dummy:
                bad = sum(p.grad is None or bool(p.grad.any()) for p in model.model.visual.parameters())
        deep = sum(1 for _ in model.model.visual.deepstack_merger_list.parameters())
        out.append({"mode": mode, "loss_diff": abs(losses[0] - losses[1]), "vision_params_not_zero": bad,
                    "deepstack_params": deep})
    return out


def suite(group: dist.ProcessGroup, cases, row_cases, modes) -> dict:
    """The P=2 group's whole job: parity grid, gathered deepstack rows, collective counts, dummy ViT pass."""
    return {"parity": parity_grid(group, cases), "rows": deepstack_rows(group, row_cases),
            "collectives": collectives(group, modes), "dummy": dummy_vision(group, modes)}
