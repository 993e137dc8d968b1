"""Gradient parity of a Hugging Face VLM: CP on P ranks against the unmodified model.

The reference is the model exactly as HF ships it, run on one process *per sample*
(each sample of a packed row alone, HF computing its own positions and merge); its
loss is the sum of the samples' token losses over the row's target count. The CP
side is the two-call integration (:func:`vlmcp.hf.parallelize`,
:func:`vlmcp.hf.shard_inputs`), :func:`vlmcp.cp_cross_entropy` and
:func:`vlmcp.reduce_gradients`. ``vlmcp verify --model`` and the tests run
:func:`hf_parity` on every rank of a spawned group.

Gradient error of a parameter: ``|g_cp - g| / max(|g|, 1e-3 * max_q |g_q|)`` (Frobenius
norms, :func:`~vlmcp.debug.parity.compare.gradient_errors`), so a parameter whose true gradient
is about 0 (a key bias, which softmax ignores) is judged against the model's gradient scale, not
its own rounding noise.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

import vlmcp
from vlmcp.debug.float64 import float64_exact, float64_norms
from vlmcp.debug.parity.compare import StepCase, worst_gradient
from vlmcp.debug.tiny import DEFAULT_SAMPLES
from vlmcp.hf.adapters import adapter_for
from vlmcp.hf.inputs import shard_inputs, shift_hf_labels
from vlmcp.hf.parallel import parallelize
from vlmcp.hf.visual_tokens import row_visuals
from vlmcp.layout.validate import check_cu_seqlens

__all__ = ["HFParityCase", "Reference", "compare_gradients", "cp_step", "hf_parity", "load_model",
           "reference_for", "reference_step"]

TOLERANCE = {"float64": 1e-9, "float32": 1e-5}
GRADIENT_FLOOR = 1e-3
"""A gradient norm under this share of the model's largest is judged against that share."""
DTYPES = {"float64": torch.float64, "float32": torch.float32}

def _sample_inputs(model, inputs: dict, cu: torch.Tensor) -> list[dict]:
    adapter = adapter_for(model)
    pixels = {k: inputs[k] for k in adapter.pixel_keys if inputs.get(k) is not None}
    videos = {k: inputs[k] for k in adapter.video_keys if inputs.get(k) is not None} if adapter.takes_videos \
        else {}
    given = inputs.get("mm_token_type_ids")
    rv = row_visuals(model, adapter, inputs["input_ids"][0].cpu(), None if given is None else given[0].cpu(),
                     pixels, videos, cu)
    out = []
    one = cu.numel() == 2  # a single sample takes every image and video, as is
    for s in range(cu.numel() - 1):
        a, b = int(cu[s]), int(cu[s + 1])
        sample = {k: v[:, a:b] for k, v in inputs.items()
                  if k in ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")}
        if rv.images_per_sample[s] and pixels:
            sample.update(pixels if one else adapter.select_images(pixels, rv.images_per_sample[s]))
        if rv.videos_per_sample[s]:
            sample.update(videos if one else adapter.select_videos(videos, rv.videos_per_sample[s]))
        out.append(sample)
    return out


def reference_step(model: nn.Module, inputs: dict, labels: torch.Tensor,
                   cu_seqlens: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
    """Forward + backward of the unmodified ``model``, each sample alone; returns the row's mean loss.

    ``scale`` multiplies the loss before backward (a DP mean over rows: 1/D each).
    """
    cu = check_cu_seqlens(cu_seqlens, inputs["input_ids"].shape[1])
    losses, count = [], 0
    for s, sample in enumerate(_sample_inputs(model, inputs, cu)):
        a, b = int(cu[s]), int(cu[s + 1])
        tgt = shift_hf_labels(labels[0, a:b], torch.tensor([0, b - a]))
        logits = model(**sample).logits[0]
        losses.append(F.cross_entropy(logits, tgt, ignore_index=-100, reduction="sum"))
        count += int((tgt != -100).sum())
    loss = torch.stack(losses).sum() / max(count, 1)
    (loss * scale).backward()
    return loss.detach()


def cp_step(model: nn.Module, inputs: dict, labels: torch.Tensor, cu_seqlens: torch.Tensor | None,
            group: dist.ProcessGroup | None, loss_scale: float = 1.0, reduce: bool = True,
            sample_placement: str = "split", image_strategy: str = "replicate") -> torch.Tensor:
    """One CP forward + backward (+ ``reduce_gradients``); returns the group's mean loss."""
    return _cp_step(model, inputs, labels, cu_seqlens, group, loss_scale, reduce, sample_placement,
                    image_strategy)[0]


def _cp_step(model, inputs, labels, cu_seqlens, group, loss_scale=1.0, reduce=True, sample_placement="split",
             image_strategy="replicate"):
    batch = shard_inputs(model, inputs, group, labels=labels, cu_seqlens=cu_seqlens,
                         sample_placement=sample_placement, image_strategy=image_strategy)
    out = model(**batch.model_inputs)
    loss, mean = vlmcp.cp_cross_entropy(out.logits[0], batch.labels, group)
    (loss * loss_scale).backward()
    if reduce:
        vlmcp.reduce_gradients(model, group)
    return mean, batch


def compare_gradients(model: nn.Module, ref: nn.Module, group: dist.ProcessGroup | None) -> tuple[float, str]:
    """Worst gradient error over parameters and ranks (see the module docstring) and its parameter."""
    return worst_gradient(model, ref, group, floor=GRADIENT_FLOOR)


@dataclass(frozen=True)
class HFParityCase(StepCase):
    """One CP-vs-unmodified-model comparison."""

    model: str = "hf:qwen2_vl"
    """``hf:ARCH`` (a tiny random model, :mod:`vlmcp.debug.tiny`) or a local model directory."""
    gradient_checkpointing: bool = False
    samples: tuple = field(default=DEFAULT_SAMPLES)
    markers: bool = True
    """Qwen-VL: wrap images in vision start/end tokens (text before every image)."""


def load_model(spec: str, dtype: torch.dtype, seed: int = 0) -> nn.Module:
    """``hf:ARCH`` -> :func:`vlmcp.debug.tiny.tiny_model`; a directory -> ``from_pretrained`` (offline)."""
    if spec.startswith("hf:"):
        from vlmcp.debug.tiny import tiny_model

        return tiny_model(spec[3:], dtype, seed=seed)
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(spec, dtype=dtype, local_files_only=True,
                                                        attn_implementation="sdpa")
    return model.eval()


@dataclass(frozen=True, eq=False)
class Reference:
    """The unmodified model after its step on the case's row (shared by cases that differ only in CP)."""

    model: nn.Module
    loss: torch.Tensor
    row: tuple


def reference_for(case: HFParityCase, model: nn.Module | None = None) -> Reference:
    """Build the case's model and row and run the unmodified model's step.

    Args:
        case: the comparison (its dtype, seed and samples).
        model: the model to run instead of loading ``case.model`` (a variant of it, e.g. a
            tiny config with more heads), already in the case's dtype; it becomes the reference.
    """
    dtype = DTYPES[case.dtype]
    ref = load_model(case.model, dtype, case.seed) if model is None else model
    if dtype == torch.float64:
        float64_norms(ref)
    row = _row(ref, case)
    with float64_exact(dtype):
        loss = reference_step(ref, *row)
    return Reference(model=ref, loss=loss, row=row)


def hf_parity(group: dist.ProcessGroup | None, case: HFParityCase,
              reference: Reference | None = None) -> dict[str, Any]:
    """Run ``case`` on this rank; the comparison dict (identical on every rank).

    ``reference`` (from :func:`reference_for` of a case with the same model, dtype, seed
    and row) saves recomputing the single-process step.
    """
    reference = reference if reference is not None else reference_for(case)
    ref = reference.model
    model = copy.deepcopy(ref)
    for p in model.parameters():
        p.grad = None
    inputs, labels, cu = reference.row
    if case.gradient_checkpointing:
        model.train()
        model.gradient_checkpointing_enable()
    parallelize(model, group, attention=case.attention, vision_mode=case.vision_mode)
    with float64_exact(DTYPES[case.dtype]):
        loss, batch = _cp_step(model, inputs, labels, cu, group, sample_placement=case.sample_placement,
                               image_strategy=case.image_strategy)
    err, worst = compare_gradients(model, ref, group)
    ref_loss = float(reference.loss)
    loss_err = abs(float(loss) - ref_loss) / max(abs(ref_loss), 1e-300)
    tol = TOLERANCE[case.dtype]
    vision = [p for n, p in model.named_parameters() if "visual" in n or "vision" in n or "projector" in n]
    return {**asdict(case), "samples": [list(s) for s in case.samples],
            "cp": 1 if group is None else dist.get_world_size(group), "loss": float(loss),
            "ref_loss": ref_loss, "loss_rel_error": loss_err, "max_rel_grad_error": err,
            "worst_param": worst, "whole": batch.shard.plan.whole.tolist(),
            "strategy": batch.shard.plan.image_strategy,
            "image_tokens_per_rank": [int(s.is_image.sum()) for s in batch.shard.plan.shards()],
            "params_checked": sum(1 for _ in model.parameters()),
            "vision_params_with_grad": sum(p.grad is not None for p in vision),
            "tolerance": tol, "passed": bool(err <= tol and loss_err <= tol)}


def _row(model, case: HFParityCase):
    from vlmcp.debug.synthetic import synthetic_row

    return synthetic_row(model, case.samples, seed=case.seed, markers=case.markers)
