"""Frozen parts and LoRA under CP (issue 24, items 4 and 5): exact against one process in float64.

One spawned group at P=2 runs the grid (tests/finetune_cases.py) on tiny random models: every
vision mode with the ViT and projector frozen, under HF's gradient checkpointing (its input hook
made ``broadcast`` hang: only the source's features required grad), the ViT alone frozen, the
projector frozen (``hidden_shard`` keeps its slice frozen), the LLM frozen; then LoRA (peft) on
the LLM, the ViT and the projector in every vision mode (every adapter's gradient against one
process, its B initialised nonzero), and the LoRA set-ups vlmcp refuses, by name.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from tests import finetune_cases  # noqa: E402
from tests.finetune_cases import FinetuneCase  # noqa: E402
from vlmcp.debug.parity.hf import HFParityCase  # noqa: E402
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
# the projector's adapters include its last layer, which hidden_shard slices (B by rows)
QWEN_LORA = {"rank": 4, "alpha": 8.0, "targets": "all", "vision": "qkv", "projector": "all"}
LLAVA_LORA = {"rank": 4, "alpha": 8.0, "targets": "attn", "projector": "all"}
ALL_LORA = {"rank": 4, "alpha": 8.0, "targets": "all", "vision": "all", "projector": "all"}
LORA_CASES = (
    [_c(mode=m, gc=m in ("broadcast", "hidden_shard"), lora=QWEN_LORA) for m in MODES]
    + [_c(mode="replicate", attention="ulysses", lora={**QWEN_LORA, "targets": "mlp", "vision": None}),
       _c(mode="broadcast", lora={"rank": 2, "alpha": 4.0, "targets": None, "vision": "all"}),  # a frozen LLM
       _c("llava", "scatter", lora=LLAVA_LORA), _c("llava", "hidden_shard", gc=True, lora=LLAVA_LORA),
       # Qwen3-VL: the deepstack mergers' last layers are sliced with their adapters too;
       # Qwen3.5: adapters on the Gated DeltaNet's projections (vlmcp's mixer calls them)
       _c("qwen3_vl", "hidden_shard", lora=ALL_LORA), _c("qwen3_5", "scatter", lora=ALL_LORA)]
)
CASES = FREEZE_CASES + LORA_CASES
DORA = {"peft": {"r": 4, "lora_alpha": 8, "use_dora": True, "target_modules": ["q_proj", "merger.mlp.2"]}}
REFUSALS = [_c(mode="hidden_shard", lora=DORA),
            _c(mode="replicate", lora={**QWEN_LORA, "targets": "q_proj,lm_head"}),
            _c(mode="replicate", lora={**QWEN_LORA, "targets": "q_proj,qq_proj"})]


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
    for row in broadcast:  # the frozen ViT ran once in the group: on the source, no recomputation
        assert row["vit_block_calls"] == row["vit_blocks"] > 0, row


def test_lora_is_exact_in_every_vision_mode(results):
    for row in _rows(results, LORA_CASES):
        _exact(row)
        assert row["lora_params"] > 0 and row["lora_grads"] > 0, row
        assert row["trainable"] == row["lora_params"], row  # peft froze every base weight


def test_lora_on_the_sliced_projector_layer_is_exact_under_hidden_shard(results):
    rows = [r for r in _rows(results, LORA_CASES) if "hidden_shard" in r["case"]]
    assert len(rows) == 3 and all(r["sliced_lora_B"] for r in rows), rows  # B sliced, A whole


def test_lora_on_what_vlmcp_cannot_run_is_refused_by_name(results):
    hidden, head, unknown = results["refused"]
    assert "model.visual.merger.mlp.2" in hidden and "DoRA" in hidden and "hidden_shard" in hidden
    assert "LM head" in head
    assert "'qq_proj' matches no Linear layer" in unknown and "q_proj" in unknown
