"""Hybrid language models under vlmcp, exact against the unmodified model: Qwen3.5 (Gated DeltaNet + gated
attention, Qwen3-VL's ViT) and LFM2-VL's short convolutions.

A tiny random Qwen3.5 (:func:`vlmcp.debug.tiny.tiny_model`: three Gated DeltaNet layers, then one
gated attention layer) on a packed row of 820 tokens (two images with text between, a text-only
sample, a prompt and an image). One spawned group per P (2, 3, 4) runs the grid of
tests/hf_qwen3_5_cases.py; loss and every parameter gradient in float64 against the model as HF ships
it, each sample alone. The P=2 and P=3 groups also run LFM2's short convolution module and a tiny
LFM2-VL on packed text rows (its images: tests/test_hf_lfm2_vl.py).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import vlmcp  # noqa: E402
import vlmcp.hf  # noqa: E402
from tests import hf_qwen3_5_cases  # noqa: E402
from tests.hf_qwen3_5_cases import PACKED  # noqa: E402
from tests.test_gdn_cp import PACKED as PACKED_CONV  # noqa: E402
from tests.test_gdn_cp import TINY as TINY_CONV  # noqa: E402
from vlmcp.debug.parity.hf import HFParityCase  # noqa: E402
from vlmcp.debug.synthetic import synthetic_row  # noqa: E402
from vlmcp.debug.tiny import tiny_model  # noqa: E402
from vlmcp.hf.layers import gdn  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402


def _case(attention="ring", mode="replicate", placement="split", dtype="float64"):
    return HFParityCase(model="hf:qwen3_5", attention=attention, vision_mode=mode, dtype=dtype,
                        samples=PACKED, sample_placement=placement)


# The Gated DeltaNet path does not depend on the vision mode: the three modes with ring, one with
# each other road (Ulysses: the all-to-all road at P=2, state passing at P=3), whole/auto placement.
MODES = ("replicate", "scatter", "broadcast")
P2_CASES = ([_case("ring", m) for m in MODES]
            + [_case("ulysses", "scatter"), _case("ring", "replicate", "whole"),
               _case("ring", "broadcast", "auto"), _case("ring", "replicate", dtype="float32")])
P3_CASES = [_case("ring", m) for m in MODES] + [_case("ulysses", "replicate")]
# P=4 on a model with 8 attention heads and 4 + 8 Gated DeltaNet heads (hf_qwen3_5_cases.WIDE_HEADS):
# state passing under ring, the all-to-all road under Ulysses.
P4_CASES = [_case("ring", "scatter"), _case("ulysses", "replicate")]
GRIDS = {2: P2_CASES, 3: P3_CASES, 4: P4_CASES}


# float32: A_log's gradient sums every token's decay gradient, with cancellation; CP composes the state in
# another order, so its relative float32 noise (1e-5 here) is above hf_parity's 1e-5 default.
TOL = {"float64": 1e-9, "float32": 1e-4}


def _failures(results):
    return [f"{r['attention']} {r['vision_mode']} {r['dtype']} {r['sample_placement']}: loss "
            f"{r['loss_rel_error']:.1e}, grad {r['max_rel_grad_error']:.1e} ({r['worst_param']})"
            for r in results if max(r["max_rel_grad_error"], r["loss_rel_error"]) > TOL[r["dtype"]]]


CONV_CASES = {4: [],
              2: [{"samples": PACKED_CONV, "dtype": "float64"}, {"samples": TINY_CONV, "dtype": "float64"},
                  {"samples": PACKED_CONV, "dtype": "float64", "placement": "auto"}],
              3: [{"samples": PACKED_CONV, "dtype": "float64"}, {"samples": TINY_CONV, "dtype": "float64"},
                  {"samples": PACKED_CONV, "dtype": "float64", "strategy": "shard"}]}


LFM2_ATTENTIONS = {2: ["ring", "ulysses"], 3: ["ring"], 4: []}  # 4 attention heads: Ulysses at P=2 only


@pytest.fixture(scope="module")
def groups():
    return {P: run_on_ranks(hf_qwen3_5_cases.suite, P, cases, CONV_CASES[P], LFM2_ATTENTIONS[P],
                            hf_qwen3_5_cases.WIDE_HEADS if P == 4 else None, timeout=240)[0]
            for P, cases in GRIDS.items()}


@pytest.mark.parametrize("P", sorted(GRIDS))
def test_parity(groups, P):
    cases = GRIDS[P]
    results = groups[P]["parity"]
    assert len(results) == len(cases)
    assert not _failures(results), "\n".join(_failures(results))
    for r in results:
        assert r["vision_params_with_grad"] > 0 and r["cp"] == P, r
        # Ulysses: the all-to-all road where P divides the key and value heads (2 and 4; P=4: 4 and 8) in
        # the 3 Gated DeltaNet layers, else state passing (P=3)
        assert r["ulysses_road"] == (3 if r["attention"] == "ulysses" and P != 3 else 0), r


@pytest.mark.parametrize("P", [2, 3])
def test_lfm2_short_conv_matches_transformers(groups, P):
    """LFM2's ``Lfm2ShortConv`` under CP (vlmcp.hf.layers.short_conv: the conv halo, no state) against
    transformers'
    module on each sample alone: outputs, and the gradients of its input and every parameter summed over
    ranks, on packed rows with replicated images, chunks shorter than the halo, auto and shard layouts."""
    results = groups[P]["short_conv"]
    assert len(results) == len(CONV_CASES[P])
    for r in results:
        errs = {k: v for k, v in r.items() if k == "out" or k.startswith("grad_")}
        # out, x, and the weight and bias of conv, in_proj and out_proj
        assert len(errs) == 8 and max(errs.values()) <= 1e-13, r


@pytest.mark.parametrize("P", [2, 3])
def test_lfm2_vl_text_rows_match_the_unmodified_model(groups, P):
    """LFM2-VL with its short convolutions under CP: loss and every gradient on a packed text row."""
    results = groups[P]["lfm2"]
    assert [r["attention"] for r in results] == LFM2_ATTENTIONS[P]
    for r in results:
        assert r["loss_rel_error"] <= 1e-12 and r["max_rel_grad_error"] <= 1e-9, r


# --- one process -------------------------------------------------------------------------------


def test_adapter_and_layers():
    model = tiny_model("qwen3_5")
    adapter = vlmcp.hf.adapter_for(model)
    assert adapter.name == "qwen3_5" and adapter.projector_last == "model.visual.merger.linear_fc2"
    assert adapter.deepstack_output is None
    assert isinstance(model.get_submodule(adapter.projector_last), torch.nn.Linear)
    assert model.config.text_config.layer_types == ["linear_attention"] * 3 + ["full_attention"]


def test_gdn_forward_needs_the_layout_and_attention_goes_through_vlmcp():
    """parallelize prepares the three Gated DeltaNet layers through the token-mixer registry (no layout: an
    error, not a silent shard-local recurrence) and the gated attention layer calls vlmcp attention."""
    import vlmcp.hf.attention as hf_attention

    model = tiny_model("qwen3_5", torch.float64)
    vlmcp.hf.parallelize(model, None)
    layers = model.model.language_model.layers
    assert all(m.linear_attn.forward.__func__ is gdn.cp_forward for m in layers[:3])
    assert getattr(layers[3].self_attn, "_vlmcp_cp_attention", False)
    inputs, labels, cu = synthetic_row(model, ((4, (1, 4, 4), 9),))
    with pytest.raises(RuntimeError, match="no CP layout"):
        model.model.language_model.layers[0].linear_attn(torch.zeros(1, 5, 48, dtype=torch.float64))
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    calls = []
    saved = hf_attention.cp_attention
    hf_attention.cp_attention = lambda *a, **k: calls.append(1) or saved(*a, **k)
    try:
        model(**batch.model_inputs)
    finally:
        hf_attention.cp_attention = saved
    assert len(calls) == 1
