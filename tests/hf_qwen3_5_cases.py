"""Rank functions for the Qwen3.5 tests (importable by name from spawned ranks).

Each function runs a whole grid inside one spawned group. Both the unmodified model and
the CP model run with Qwen3.5's float32 islands in float64 (``float64_exact`` enters
:func:`vlmcp.hf.qwen3_5_float64.float64_qwen3_5`).
"""

from __future__ import annotations

import torch.distributed as dist

from tests.hf_cases import parity_grid
from vlmcp.hf.verify import HFParityCase

# Two images with text between them, a text-only sample, a sample opening with a prompt and an image:
# 820 tokens, every sample longer than several 64-token kernel chunks.
PACKED = ((40, (1, 8, 16), 100, (1, 8, 8), 220), (250,), (20, (1, 8, 8), 120))


def suite(group: dist.ProcessGroup, cases: list[HFParityCase], conv_cases: list[dict]) -> dict:
    """One group's job: the Qwen3.5 parity grid, then LFM2's short convolution (tests/gdn_cases.py) on
    ``conv_cases``, while transformers is imported anyway."""
    from tests.gdn_cases import short_conv_grid

    return {"parity": parity_grid(group, cases), "short_conv": short_conv_grid(group, conv_cases)}
