"""Rank function for the LFM2-VL image tests (importable by name from spawned ranks)."""

from __future__ import annotations

import torch.distributed as dist

from vlmcp.debug.parity.hf import HFParityCase, hf_parity, reference_for


def parity_grid(group: dist.ProcessGroup, cases: list[HFParityCase]) -> list[dict]:
    """``hf_parity`` of every case, the unmodified model's step computed once (the cases share its row)."""
    ref = reference_for(cases[0])
    return [hf_parity(group, c, ref) for c in cases]
