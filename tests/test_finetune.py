"""Frozen parts and LoRA under CP (issue 24, items 4 and 5): exact against one process in float64.

One spawned group at P=2 runs the grid (tests/finetune_cases.py) on tiny random models: every
vision mode with the ViT and projector frozen, under HF's gradient checkpointing (its input hook
made ``broadcast`` hang: only the source's features required grad), the ViT alone frozen, the
projector frozen (``hidden_shard`` keeps its slice frozen), the LLM frozen.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from tests import finetune_cases  # noqa: E402
from tests.finetune_cases import FinetuneCase  # noqa: E402
from vlmcp.hf.debug.parity import HFParityCase  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402

MODES = ("replicate", "allreduce_hook", "broadcast", "scatter", "hidden_shard")
TOL = 1e-9


def _c(arch="qwen2_vl", mode="replicate", attention="ring", gc=False, freeze=(), lora=None):
    return FinetuneCase(HFParityCase(model=f"hf:{arch}", attention=attention, vision_mode=mode,
                                     gradient_checkpointing=gc), freeze=tuple(freeze), lora=lora)


FREEZE_CASES = (
    [_c(mode=m, gc=True, freeze=("vision", "projector")) for m in MODES]
    + [_c(mode=m, freeze=("vision",)) for m in ("broadcast", "hidden_shard")]
    + [_c(mode=m, attention="ulysses", freeze=("projector",)) for m in ("hidden_shard", "scatter")]
    + [_c("llava", "broadcast", gc=True, freeze=("vision", "projector")),
       _c("llava", "hidden_shard", freeze=("projector", "llm"))]
)
CASES = FREEZE_CASES
REFUSALS = []


@pytest.fixture(scope="module")
def results():
    return run_on_ranks(finetune_cases.suite, 2, list(CASES), list(REFUSALS), timeout=300)[0]


def _rows(results, cases):
    names = {c.name for c in cases}
    rows = [r for r in results["parity"] if r["case"] in names]
    assert len(rows) == len(cases)
    return rows


def _exact(row):
    assert row["loss_rel_error"] <= TOL and row["max_rel_grad_error"] <= TOL, row
    assert row["trainable_kept"], row  # parallelize re-enabled nothing (hidden_shard's slice included)
    assert row["frozen_with_grad"] == [], row


def test_frozen_parts_are_exact_in_every_vision_mode(results):
    for row in _rows(results, FREEZE_CASES):
        _exact(row)


def test_a_frozen_vit_runs_no_backward_and_broadcast_does_not_hang(results):
    for case, row in zip(FREEZE_CASES, _rows(results, FREEZE_CASES), strict=True):
        if "vision" in case.freeze:
            assert row["vit_ran"] and not row["vit_backward"], row
        else:
            assert row["vit_ran"] and row["vit_backward"], row
    broadcast = [r for r in _rows(results, FREEZE_CASES) if " broadcast gc=True" in r["case"]]
    assert len(broadcast) == 2  # qwen2_vl and llava, each of which hung before
