"""Rank functions for the any-resolution HF tests (importable by name from spawned ranks).

InternVL, LLaVA-OneVision/NeXT, SmolVLM/Idefics3 and Mistral3 (``tests/hf_archs.py``: ANYRES_ARCHS).
Each architecture has its own rows, in its adapter's image tuples
(:mod:`vlmcp.debug.synthetic.anyres`):

* ``packed`` (the tiny registry's verification row, ``vlmcp verify``'s): an
  image sample with text before and after, a text-only sample, and a sample with two
  images and text between (InternVL: multi-tile images; OneVision: a
  tiled image shrunk by ``anyres_max``, then a two-image sample sent untiled; SmolVLM:
  split images with a masked global tile; Mistral3: images of several sizes);
* ``mixed``: four short samples (three with an image, one text-only) and a long one,
  for ``whole`` and ``auto`` placement (``auto`` keeps the long one split, its image
  replicated; Mistral3's ``[IMG_BREAK]`` text between an image's rows is sharded).

Each function runs a whole grid inside one spawned group (spawning costs seconds).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

import vlmcp
import vlmcp.hf
from tests.hf_cases import parity_grid
from vlmcp.debug.float64 import float64_exact, float64_norms
from vlmcp.debug.synthetic import synthetic_row
from vlmcp.debug.tiny import tiny_arch, tiny_model
from vlmcp.grads import grad_rule

MIXED = {
    "internvl": ((3, (1,), 5), (4, (2,), 3), (6,), (2, (1,), 6), (40, (2,), 80)),
    "llava_onevision": ((3, (8, 8), 5), (4, (16, 5), 3), (6,), (2, (6, 20), 6), (120, (8, 8), 240)),
    "smolvlm": ((3, (1, 1), 5), (4, (2, 1), 3), (6,), (2, (1, 1), 6), (40, (1, 2), 80)),
    "mistral3": ((3, (1, 2), 5), (4, (2, 2), 3), (6,), (2, (2, 1), 6), (40, (3, 2), 80)),
}
ROWS = {arch: {"packed": tiny_arch(arch).samples, "mixed": rows} for arch, rows in MIXED.items()}
ROWS["llava_next"] = ROWS["llava_onevision"]
ROWS["idefics3"] = ROWS["smolvlm"]

def _vision_params(model) -> list[tuple[str, torch.nn.Parameter]]:
    """Every parameter on the vision side: ViT, projector, LLaVA-NeXT's image_newline."""
    lm = vlmcp.hf.parallel_state(model).adapter.language_model
    return [(n, p) for n, p in model.named_parameters()
            if not n.startswith(lm + ".") and not n.startswith("lm_head.")]


def dummy_vision(group: dist.ProcessGroup, cases: list[tuple[str, str]]) -> list[dict]:
    """Per ``(arch, mode)``, a text-only row with ``dummy_vision``: the loss against no dummy pass, the
    vision parameters (ViT, projector, image_newline) a real image step trains that got no gradient,
    and those whose gradient is not an exact zero."""
    from vlmcp.debug.parity.hf import reference_step

    out = []
    for arch, mode in cases:
        base = tiny_model(arch, torch.float64)
        ref = copy.deepcopy(base)
        reference_step(ref, *synthetic_row(ref, ROWS[arch]["packed"][:1]))
        trained = {n for n, p in ref.named_parameters() if p.grad is not None}
        inputs, labels, cu = synthetic_row(base, ((9,), (14,)))  # no image anywhere
        losses = []
        for dummy in (False, True):
            model = copy.deepcopy(base)
            vlmcp.hf.parallelize(model, group, vision_mode=mode, dummy_vision=dummy)
            batch = vlmcp.hf.shard_inputs(model, inputs, group, labels=labels, cu_seqlens=cu)
            loss, mean = vlmcp.cp_cross_entropy(model(**batch.model_inputs).logits[0], batch.labels, group)
            loss.backward()
            losses.append(float(mean))
        params = _vision_params(model)
        out.append({"case": (arch, mode), "loss_diff": abs(losses[0] - losses[1]),
                    "trained": sum(n in trained for n, _ in params),
                    "no_grad": [n for n, p in params if n in trained and p.grad is None],
                    "not_zero": [n for n, p in params if p.grad is not None and bool(p.grad.any())]})
    return out


def newline(group: dist.ProcessGroup, modes: list[str]) -> list[dict]:
    """LLaVA-OneVision's ``image_newline`` per vision mode: its gradient rule and width after
    ``parallelize``, whether DDP/FSDP must leave it alone (``ddp_ignored_params``), and its
    gradient against one process after a step on the packed row."""
    ref = tiny_model("llava_onevision", torch.float64)
    float64_norms(ref)
    inputs, labels, cu = synthetic_row(ref, ROWS["llava_onevision"]["packed"])
    from vlmcp.debug.parity.hf import reference_step

    with float64_exact(torch.float64):
        reference_step(ref, inputs, labels, cu)
    truth = ref.model.image_newline.grad
    out = []
    for mode in modes:
        model = copy.deepcopy(ref)
        model.zero_grad(set_to_none=True)
        vlmcp.hf.parallelize(model, group, vision_mode=mode)
        p = model.model.image_newline
        rule, width = grad_rule(p).value, p.shape[-1]
        kept_from_ddp = "model.image_newline" in vlmcp.ddp_ignored_params(model)
        with float64_exact(torch.float64):
            batch = vlmcp.hf.shard_inputs(model, inputs, group, labels=labels, cu_seqlens=cu)
            loss, _ = vlmcp.cp_cross_entropy(model(**batch.model_inputs).logits[0], batch.labels, group)
            loss.backward()
        vlmcp.reduce_gradients(model, group)
        g = model.model.image_newline.grad
        n, r = width, dist.get_rank(group)
        want = truth if width == truth.numel() else truth[r * n:(r + 1) * n]
        out.append({"mode": mode, "rule": rule, "width": width, "kept_from_ddp": kept_from_ddp,
                    "err": float((g - want).norm() / want.norm()), "norm": float(want.norm())})
    return out


def suite(group: dist.ProcessGroup, cases, dummy_cases, newline_modes) -> dict:
    """The P=2 group's whole job: the parity grid, the dummy ViT pass, LLaVA-OneVision's newline."""
    return {"parity": parity_grid(group, cases), "dummy": dummy_vision(group, dummy_cases),
            "newline": newline(group, newline_modes)}
