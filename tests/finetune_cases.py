"""Rank functions for frozen parts and LoRA under CP (tests/test_finetune.py), one spawned group.

Each case freezes parts of (or puts LoRA on) a tiny model, runs the unmodified model's step on
one process (every sample alone, float64) and the CP step on the group, and compares the loss
and every parameter's gradient, frozen ones included (``None`` on both sides).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vlmcp.debug.float64 import float64_exact
from vlmcp.debug.parity.hf import (
    DTYPES,
    HFParityCase,
    _cp_step,
    compare_gradients,
    load_model,
    reference_for,
)
from vlmcp.hf.adapters import adapter_for, submodule
from vlmcp.hf.freeze import freeze
from vlmcp.hf.parallel import parallelize
from vlmcp.hf.peft import unwrap_peft


@dataclass(frozen=True)
class FinetuneCase:
    """One comparison: ``parity`` (model, mode, attention, gradient checkpointing), what is frozen, LoRA."""

    parity: HFParityCase
    freeze: tuple[str, ...] = ()
    lora: dict | None = None
    """``vlmcp.hf.peft.apply_lora`` keywords, ``{"peft": LoraConfig keywords}``, or None."""

    @property
    def name(self) -> str:
        c = self.parity
        return (f"{c.model} {c.attention} {c.vision_mode} gc={c.gradient_checkpointing} "
                f"freeze={','.join(self.freeze) or '-'} lora={self.lora}")


def _prepare(case: FinetuneCase, model):
    if case.lora is not None and "peft" in case.lora:  # a LoraConfig of the user's own
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(**case.lora["peft"]))
    elif case.lora is not None:
        from vlmcp.hf.peft import apply_lora

        torch.manual_seed(1)
        model = apply_lora(model, **case.lora)
        for name, p in model.named_parameters():  # nonzero B: the adapter's gradients all matter
            if "lora_B" in name:
                with torch.no_grad():
                    p.normal_(0, 0.05)
    freeze(model, case.freeze)
    return model


def _vit_outputs(model) -> tuple[list, list]:
    """Record whether each ViT block's output requires grad (a frozen ViT must run no backward)."""
    inner = unwrap_peft(model)
    adapter = adapter_for(inner)
    seen, handles = [], []
    blocks = [m for m in submodule(inner, adapter.vision_module_paths(inner)[0]).modules()
              if type(m).__name__.endswith(("VisionBlock", "EncoderLayer"))]
    for b in blocks:
        handles.append(b.register_forward_hook(
            lambda m, a, out: seen.append(bool((out[0] if isinstance(out, tuple) else out).requires_grad))))
    return seen, handles


def finetune_parity(group: dist.ProcessGroup, case: FinetuneCase) -> dict:
    c = case.parity
    dtype = DTYPES[c.dtype]
    ref = _prepare(case, load_model(c.model, dtype, c.seed))
    reference = reference_for(c, ref)  # float64_norms(ref) too
    model = copy.deepcopy(ref)
    for p in model.parameters():
        p.grad = None
    trainable_before = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    if c.gradient_checkpointing:
        model.train()
        model.gradient_checkpointing_enable()  # HF hooks the ViT patch embedding to require grad
    parallelize(model, group, attention=c.attention, vision_mode=c.vision_mode)
    trainable_after = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    seen, handles = _vit_outputs(model)
    inputs, labels, cu = reference.row
    with float64_exact(dtype):
        loss, _ = _cp_step(model, inputs, labels, cu, group)
    for h in handles:
        h.remove()
    err, worst = compare_gradients(model, ref, group)
    calls = torch.tensor([float(len(seen))], dtype=torch.float64)
    dist.all_reduce(calls, group=group)  # ViT block forwards over the group (recomputation included)
    frozen_with_grad = [n for n, p in model.named_parameters() if not p.requires_grad and p.grad is not None]
    ref_loss = float(reference.loss)
    return {"case": case.name, "loss_rel_error": abs(float(loss) - ref_loss) / abs(ref_loss),
            "max_rel_grad_error": err, "worst_param": worst,
            "trainable_kept": trainable_before == trainable_after, "trainable": len(trainable_after),
            "frozen_with_grad": frozen_with_grad, "vit_backward": any(seen), "vit_ran": bool(seen),
            "vit_block_calls": int(calls), "vit_blocks": len(handles),
            "lora_grads": sum(1 for n, p in model.named_parameters() if "lora_" in n and p.grad is not None
                              and float(p.grad.abs().sum()) > 0),
            "lora_params": sum(1 for n, _ in model.named_parameters() if "lora_" in n),
            "sliced_lora_B": _sliced_lora(model)}


def _sliced_lora(model) -> bool:
    """Under hidden_shard: the projector's last layers (deepstack's too) kept their adapters, B sliced
    and A whole."""
    from vlmcp.grads import partition_of

    inner = unwrap_peft(model)
    adapter = adapter_for(inner)
    for path in (adapter.projector_last, *adapter.deepstack_projectors(inner)):
        last = submodule(inner, path)
        if not hasattr(last, "lora_B"):
            return False
        b, a = last.lora_B["default"].weight, last.lora_A["default"].weight
        w = last.base_layer.weight
        if not (partition_of(b) is not None and partition_of(w) is not None and partition_of(a) is None
                and b.shape[0] == w.shape[0] == last.out_features and a.shape[1] == w.shape[1]):
            return False
    return True


def _refusal(fn) -> str:
    try:
        fn()
    except (ValueError, NotImplementedError) as err:
        return str(err)
    return ""


def suite(group: dist.ProcessGroup, cases: list[FinetuneCase], refusals: list[FinetuneCase]) -> dict:
    """The whole grid, then the cases that must be refused (their messages)."""
    out = {"parity": [finetune_parity(group, c) for c in cases], "refused": []}
    for case in refusals:
        def run(case=case):
            model = _prepare(case, load_model(case.parity.model, torch.float64, 0))
            parallelize(model, group, attention=case.parity.attention, vision_mode=case.parity.vision_mode)
        out["refused"].append(_refusal(run))
    return out
