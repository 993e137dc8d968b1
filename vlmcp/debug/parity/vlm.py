"""Gradient parity of one training step: CP on P ranks against one process.

``vlmcp verify`` and the end-to-end tests run :func:`parity_case` on every rank of a
spawned CP group. Each rank builds the reference VLM twice from the same seed:
once as a single-process model (plan with ``cp_size=1``, ``group=None``), once
placed on the CP group; both take one step on the same packed row. After
:func:`vlmcp.reduce_gradients` every CP gradient must equal the single-process one
(``hidden_shard``'s partitioned projector slice against the matching columns), each
parameter's relative error against its own norm (:func:`~vlmcp.debug.parity.compare.gradient_errors`).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from vlmcp.data import VOCAB_SIZE, PackedRow, random_row
from vlmcp.debug.parity.compare import StepCase, gradient_errors
from vlmcp.grads import grad_norms, reduce_gradients
from vlmcp.models import VLM, LLMConfig, VLMConfig
from vlmcp.train.options import TORCH_DTYPES
from vlmcp.train.specs.reference.step import forward_backward
from vlmcp.vision import VisionConfig, place_vision

__all__ = ["ParityCase", "builtin_row", "parity_case", "verify_model_config"]

TOLERANCE = {"float64": 1e-10, "float32": 1e-5, "bfloat16": None}  # bf16: see parity_case


def verify_model_config(patch_size: int = 8) -> VLMConfig:
    """A model whose widths divide by 2, 3 and 4 (hidden_shard, Ulysses at those P)."""
    llm = LLMConfig(vocab_size=VOCAB_SIZE, hidden=48, layers=2, heads=12, kv_heads=3, mlp_hidden=64)
    vision = VisionConfig(out_dim=48, patch_size=patch_size, width=24, depth=2, heads=2,
                          mlp_hidden=48, projector_hidden=36)
    return VLMConfig(llm=llm, vision=vision)


def builtin_row(seed: int = 0, patch_size: int = 8) -> PackedRow:
    """3 packed samples, chat-like: a prompt, an image (2x3 patches) and 13 text; 9 text only;
    2 text, an image (3x3), 6 text, two images back to back (2x2, 1x2) and 11 text."""
    samples = [[4, (16, 24), 13], [9], [2, (24, 24), 6, (16, 16), (8, 16), 11]]
    return random_row(samples, patch_size, torch.Generator().manual_seed(seed))


@dataclass(frozen=True)
class ParityCase(StepCase):
    """One CP-vs-single-process comparison of the reference VLM."""

    dtype: str = "float32"
    image_attention: str = "causal"
    ulysses_size: int | None = None
    """``attention="usp"`` only: the Ulysses group size U."""


def _single_process(model: VLM, row: PackedRow, case: ParityCase):
    plan = row.plan(1, image_strategy=case.image_strategy)
    backend = "ring" if case.attention == "usp" else case.attention  # one process: no Ulysses group
    return forward_backward(model, row, plan.for_rank(0), None, backend=backend,
                            image_attention=case.image_attention)


def parity_case(group: dist.ProcessGroup, case: ParityCase, row: PackedRow | None = None,
                cfg: VLMConfig | None = None) -> dict:
    """Run ``case`` on this rank; return the comparison (identical keys on every rank).

    float64 and float32 compare CP with a single process in the same dtype (relative
    gradient error within :data:`TOLERANCE`). bfloat16 follows flash-attention's rule:
    both the CP and the bfloat16 single-process gradients are compared with a float64
    single process on the same (bf16-rounded) weights, and CP must stay within twice
    the single process's error.

    Returns:
        A dict with ``loss_abs_error``, ``max_rel_grad_error``, ``worst_param``,
        ``params_checked``, ``vision_grad_norm`` (of the exact CP gradient),
        ``ref_vision_grad_norm``, ``projector_grad_norm``, ``loss``, ``tolerance``,
        ``passed`` and the case (bfloat16 adds ``single_process_rel_grad_error``).
    """
    dtype = TORCH_DTYPES[case.dtype]
    row = row if row is not None else builtin_row(case.seed)
    cfg = cfg if cfg is not None else verify_model_config()
    torch.manual_seed(case.seed)
    ref = VLM(cfg).to(dtype)
    model = copy.deepcopy(ref)
    truth = copy.deepcopy(ref).double() if dtype == torch.bfloat16 else ref
    ref_out = _single_process(ref, row, case)
    truth_out = _single_process(truth, row, case) if truth is not ref else ref_out

    P, rank = dist.get_world_size(group), dist.get_rank(group)
    place_vision(model.vision, mode=case.vision_mode, group=group)
    plan = row.plan(P, image_strategy=case.image_strategy, sample_placement=case.sample_placement)
    out = forward_backward(model, row, plan.for_rank(rank), group, backend=case.attention,
                           image_attention=case.image_attention, ulysses_size=case.ulysses_size)
    reduce_gradients(model, group)

    names, errors = gradient_errors(model, truth, group)  # per parameter, the worst rank's
    norms = grad_norms({"vision": list(model.vision.parameters()),
                        "projector": list(model.vision.projector.parameters())}, group)
    ref_vision = grad_norms({"vision": list(truth.vision.parameters())}, None)["vision"]
    result = {
        **asdict(case),
        "cp": P,
        "loss": float(out.mean),
        "loss_abs_error": abs(float(out.mean) - float(truth_out.mean)),
        "max_rel_grad_error": float(errors.max()),
        "worst_param": names[int(errors.argmax())],
        "params_checked": len(names),
        "vision_grad_norm": norms["vision"],
        "ref_vision_grad_norm": ref_vision,
        "projector_grad_norm": norms["projector"],
        "tolerance": TOLERANCE[case.dtype],
    }
    if truth is not ref:
        # bfloat16, per parameter: CP within twice the bf16 single process's error against
        # float64 (flash-attention's rule), plus a floor of half a bf16 rounding step (2^-9)
        # for parameters it gets (nearly) exactly: a CP gradient sums P bf16-computed shares
        _, single = gradient_errors(ref, truth, None)
        result["single_process_rel_grad_error"] = float(single.max())
        result["tolerance"] = "2 x the bf16 single process's error per parameter, + 2^-9"
        bad = errors > 2 * single + 2.0 ** -9
        grads_ok = not bool(bad.any())
        result["failing_params"] = {names[i]: (float(errors[i]), float(single[i]))
                                    for i in torch.nonzero(bad).flatten().tolist()}
        single_loss = abs(float(ref_out.mean) - float(truth_out.mean))
        loss_ok = result["loss_abs_error"] <= 2 * single_loss + 1e-3 * abs(float(truth_out.mean))
    else:
        grads_ok = result["max_rel_grad_error"] <= result["tolerance"]
        loss_ok = result["loss_abs_error"] <= result["tolerance"] * max(1.0, result["loss"])
    result["passed"] = bool(grads_ok and loss_ok and result["vision_grad_norm"] > 0
                            and result["params_checked"] == sum(1 for _ in ref.parameters()))
    return result
