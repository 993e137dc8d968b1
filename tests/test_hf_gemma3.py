"""Gemma 3 under vlmcp: sliding-window and full layers interleaved, images bidirectional, exact at P=2 and 3.

A tiny random Gemma 3 built in code (:func:`vlmcp.debug.tiny.tiny_config`: SigLIP 8x8 px images of
4 tokens each, 4 LLM layers alternating ``sliding_attention`` (window 4) and ``full_attention``).
One spawned P=2 group runs the whole grid (ring and Ulysses; every vision mode the projector
allows; replicated and sharded image tokens; whole placement) on a packed row of an image sample,
a text-only sample and a two-image sample, each compared in float64 with the unmodified model
(loss and every gradient).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import vlmcp  # noqa: E402
import vlmcp.hf  # noqa: E402
from tests.hf_cases import parity_grid  # noqa: E402
from vlmcp.debug.float64 import float64_exact, float64_norms  # noqa: E402
from vlmcp.debug.parity.hf import HFParityCase, reference_step  # noqa: E402
from vlmcp.debug.synthetic import synthetic_row  # noqa: E402
from vlmcp.debug.tiny import tiny_arch, tiny_config, tiny_model  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402

PACKED = tiny_arch("gemma3").samples
"""An image after a prompt, a text-only sample, two images with text between (Gemma 3's image
tuples carry no size: every image is ``image_size`` square)."""


def _case(attention, mode, strategy="replicate", placement="split"):
    return HFParityCase(model="hf:gemma3", attention=attention, vision_mode=mode, samples=PACKED,
                        image_strategy=strategy, sample_placement=placement)


CASES = [_case(b, m) for b in ("ring", "ulysses") for m in ("replicate", "scatter")] + [
    _case("ring", "broadcast", "shard"), _case("ulysses", "allreduce_hook", "shard"),
    _case("ring", "replicate", placement="whole")]


@pytest.mark.timeout(240)
def test_parity_p2_ring_ulysses_vision_modes_sharded_images():
    results = run_on_ranks(parity_grid, 2, CASES, timeout=200)[0]
    assert len(results) == len(CASES)
    bad = [f"{r['attention']} {r['vision_mode']} {r['image_strategy']} {r['sample_placement']}: loss "
           f"{r['loss_rel_error']:.1e}, grad {r['max_rel_grad_error']:.1e} ({r['worst_param']})"
           for r in results if not r["passed"]]
    assert not bad, "\n".join(bad)
    for r in results:
        assert r["max_rel_grad_error"] <= 1e-9 and r["vision_params_with_grad"] > 0, r


def _reference_loss(model, inputs, labels, cu) -> float:
    float64_norms(model)
    with float64_exact(torch.float64):
        return float(reference_step(model, inputs, labels, cu))


def test_the_row_is_cut_by_the_window_and_images_are_bidirectional():
    """The parity row would not notice a wrong mask otherwise: without the window, or with causal
    images (no token_type_ids), the unmodified model's loss changes."""
    model = tiny_model("gemma3", torch.float64)
    row = synthetic_row(model, PACKED)
    base = _reference_loss(model, *row)
    no_window = tiny_model(tiny_config("gemma3", text_config=dict(
        layer_types=["full_attention"] * 4)), torch.float64)
    inputs, labels, cu = row
    causal = {k: v for k, v in inputs.items() if k != "token_type_ids"}
    assert abs(_reference_loss(no_window, *row) - base) > 1e-6
    assert abs(_reference_loss(tiny_model("gemma3", torch.float64), causal, labels, cu) - base) > 1e-6


def test_sliding_layers_accepted_and_hidden_shard_refused():
    model = vlmcp.hf.parallelize(tiny_model("gemma3", torch.float64), None)
    layers = model.model.language_model.layers
    assert all(getattr(layer.self_attn, "_vlmcp_cp_attention", False) for layer in layers)
    assert [layer.self_attn.sliding_window for layer in layers] == [4, None, 4, None]
    with pytest.raises(ValueError, match="hidden_shard"):
        vlmcp.hf.parallelize(tiny_model("gemma3", torch.float64), None, vision_mode="hidden_shard")


def test_token_type_ids_must_mark_the_image_tokens():
    model = vlmcp.hf.parallelize(tiny_model("gemma3", torch.float64), None)
    inputs, labels, cu = synthetic_row(model, PACKED)
    inputs["token_type_ids"] = inputs["token_type_ids"].roll(1, -1)
    with pytest.raises(ValueError, match="token_type_ids must be 1 exactly at the image tokens"):
        vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)


def test_images_back_to_back_are_refused():
    """HF joins adjacent image runs into one bidirectional block; vlmcp's images would be two."""
    model = vlmcp.hf.parallelize(tiny_model("gemma3", torch.float64), None)
    inputs, labels, cu = synthetic_row(model, ((3, (1,), (1,), 4),))
    ids = inputs["input_ids"][0]
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[8:10] = False  # the first image's <end_of_image> and the second's <start_of_image>
    assert ids[8:10].tolist() == [122, 121]
    inputs = {k: v[:, keep] if k != "pixel_values" else v for k, v in inputs.items()}
    labels = labels[:, keep]
    cu = torch.tensor([0, int(keep.sum())], dtype=torch.int32)
    with pytest.raises(ValueError, match="two images back to back"):
        vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)


P3_CASES = [_case("ring", "replicate"), _case("ulysses", "scatter"), _case("ring", "broadcast", "shard")]


@pytest.mark.timeout(240)
def test_parity_p3_ring_ulysses():
    results = run_on_ranks(parity_grid, 3, P3_CASES, timeout=200)[0]
    assert len(results) == len(P3_CASES)
    for r in results:
        assert r["passed"] and r["max_rel_grad_error"] <= 1e-9 and r["vision_params_with_grad"] > 0, r
