"""Rank functions for the Qwen3.5 tests (importable by name from spawned ranks).

Each function runs a whole grid inside one spawned group. Both the unmodified model and
the CP model run with Qwen3.5's float32 islands in float64 (``float64_exact`` lifts
Qwen3.5's islands: Note [vlmcp float64 parity: float32 islands]).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vlmcp.debug.float64 import float64_exact, float64_norms
from vlmcp.debug.parity.hf import (
    DTYPES,
    HFParityCase,
    Reference,
    hf_parity,
    reference_for,
    reference_step,
)
from vlmcp.debug.synthetic import synthetic_row
from vlmcp.debug.tiny import tiny_config, tiny_model
from vlmcp.hf.layers import gdn

# Two images with text between them, a text-only sample, a sample opening with a prompt and an image:
# 820 tokens, every sample longer than several 64-token kernel chunks.
PACKED = ((40, (1, 8, 16), 100, (1, 8, 8), 220), (250,), (20, (1, 8, 8), 120))


WIDE_HEADS = {"num_attention_heads": 8, "linear_num_key_heads": 4, "linear_num_value_heads": 8}
"""The P=4 model's text config: every head count divisible by 4, so Ulysses takes P=4 (the attention, and
the Gated DeltaNet's all-to-all road) where the default tiny Qwen3.5's 6 heads would refuse it."""


def _reference(case: HFParityCase, text_config: dict | None) -> Reference:
    if not text_config:
        return reference_for(case)
    config = tiny_config(case.model.removeprefix("hf:"), text_config=text_config)
    return reference_for(case, tiny_model(config, DTYPES[case.dtype], seed=case.seed))


LFM2_TEXT = ((30,), (57,), (3,), (120,))
"""LFM2-VL rows: text only (its images: tests/test_hf_lfm2_vl.py)."""


def tiny_lfm2_vl():
    """A float64 LFM2-VL (:func:`vlmcp.debug.tiny.tiny_config`): short convolutions in layers 0 and 2,
    attention
    (4 heads) in 1 and 3."""
    return tiny_model("lfm2_vl", torch.float64)


def lfm2_text_parity(group: dist.ProcessGroup, attentions: list[str]) -> list[dict]:
    """LFM2-VL (short convolutions + attention) on a packed text row: ``hf_parity`` per attention backend."""
    ref = tiny_lfm2_vl()
    float64_norms(ref)
    row = synthetic_row(ref, LFM2_TEXT)
    with float64_exact(torch.float64):
        loss = reference_step(ref, *row)
    return [hf_parity(group, HFParityCase(model="hf:lfm2_vl", attention=a, samples=LFM2_TEXT),
                      Reference(model=ref, loss=loss, row=row)) for a in attentions]


def suite(group: dist.ProcessGroup, cases: list[HFParityCase], conv_cases: list[dict],
          lfm2_attentions: list[str], text_config: dict | None = None) -> dict:
    """One group's job: the Qwen3.5 parity grid (with, per case, how many Gated DeltaNet calls took the
    Ulysses road), then LFM2's short convolution module (tests/gdn_cases.py) on ``conv_cases`` and
    LFM2-VL's text parity, while transformers is imported anyway. ``text_config``: overrides of the tiny
    Qwen3.5's text config (:data:`WIDE_HEADS`), for every case of the grid."""
    from tests.gdn_cases import short_conv_grid

    calls, refs, parity = [], {}, []
    saved = gdn.gated_deltanet_ulysses
    gdn.gated_deltanet_ulysses = lambda *a, **k: calls.append(1) or saved(*a, **k)
    try:
        for c in cases:
            key = (c.model, c.dtype, c.seed, c.samples, c.markers)
            if key not in refs:
                refs[key] = _reference(c, text_config)
            before = len(calls)
            parity.append({**hf_parity(group, c, refs[key]), "ulysses_road": len(calls) - before})
    finally:
        gdn.gated_deltanet_ulysses = saved
    return {"parity": parity, "short_conv": short_conv_grid(group, conv_cases),
            "lfm2": lfm2_text_parity(group, lfm2_attentions)}
