"""Rank functions for the Qwen3.5 tests (importable by name from spawned ranks).

Each function runs a whole grid inside one spawned group. Both the unmodified model and
the CP model run with Qwen3.5's float32 islands in float64 (``float64_exact`` enters
:func:`vlmcp.hf.qwen3_5_float64.float64_qwen3_5`).
"""

from __future__ import annotations

import torch.distributed as dist

from vlmcp.hf import gdn
from vlmcp.hf.verify import HFParityCase, hf_parity, reference_for

# Two images with text between them, a text-only sample, a sample opening with a prompt and an image:
# 820 tokens, every sample longer than several 64-token kernel chunks.
PACKED = ((40, (1, 8, 16), 100, (1, 8, 8), 220), (250,), (20, (1, 8, 8), 120))


def suite(group: dist.ProcessGroup, cases: list[HFParityCase], conv_cases: list[dict]) -> dict:
    """One group's job: the Qwen3.5 parity grid (with, per case, how many Gated DeltaNet calls took the
    Ulysses road), then LFM2's short convolution (tests/gdn_cases.py) on ``conv_cases``, while
    transformers is imported anyway."""
    from tests.gdn_cases import short_conv_grid

    calls, refs, parity = [], {}, []
    saved = gdn.gated_deltanet_ulysses
    gdn.gated_deltanet_ulysses = lambda *a, **k: calls.append(1) or saved(*a, **k)
    try:
        for c in cases:
            key = (c.model, c.dtype, c.seed, c.samples, c.markers)
            if key not in refs:
                refs[key] = reference_for(c)
            before = len(calls)
            parity.append({**hf_parity(group, c, refs[key]), "ulysses_road": len(calls) - before})
    finally:
        gdn.gated_deltanet_ulysses = saved
    return {"parity": parity, "short_conv": short_conv_grid(group, conv_cases)}
