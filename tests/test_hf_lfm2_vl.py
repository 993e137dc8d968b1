"""LFM2-VL with images under vlmcp, exact against the unmodified model.

A tiny random LFM2-VL (:func:`vlmcp.debug.tiny.tiny_config`: short convolutions in layers 0 and 2,
attention in 1 and 3; a SigLIP2 NaFlex ViT, its images at their own patch grids) on a packed row
of two images with text between, a text-only sample and a sample with one image. Loss and every
parameter gradient in float64 (SigLIP2's float32 position resize kept in float64 by
:func:`vlmcp.debug.parity.hf.float64_exact`), one spawned group per P.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import vlmcp.hf  # noqa: E402
from tests import hf_lfm2_vl_cases  # noqa: E402
from vlmcp.debug.parity.hf import HFParityCase  # noqa: E402
from vlmcp.debug.synthetic import synthetic_row  # noqa: E402
from vlmcp.debug.tiny import tiny_model  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402

# images as (h, w) patch grids: 6, 16 and 4 tokens; 275 tokens in all
SAMPLES = ((30, (4, 6), 20, (8, 8), 40), (57,), (6, (4, 4), 90))


def _case(attention="ring", mode="replicate"):
    return HFParityCase(model="hf:lfm2_vl", attention=attention, vision_mode=mode, samples=SAMPLES)


# 4 attention heads: Ulysses at P=2 only
GRIDS = {2: [_case("ring", "replicate"), _case("ring", "scatter"), _case("ulysses", "broadcast")],
         3: [_case("ring", "replicate"), _case("ring", "scatter")]}


@pytest.fixture(scope="module")
def groups():
    return {P: run_on_ranks(hf_lfm2_vl_cases.parity_grid, P, cases, timeout=240)[0]
            for P, cases in GRIDS.items()}


@pytest.mark.parametrize("P", sorted(GRIDS))
def test_images_match_the_unmodified_model(groups, P):
    results = groups[P]
    assert [(r["attention"], r["vision_mode"]) for r in results] == [(c.attention, c.vision_mode)
                                                                       for c in GRIDS[P]]
    for r in results:
        assert r["cp"] == P and r["vision_params_with_grad"] > 0, r
        assert r["loss_rel_error"] <= 1e-12 and r["max_rel_grad_error"] <= 1e-9, r


# --- one process -------------------------------------------------------------------------------


def test_token_counts_are_the_models():
    """``image_tokens`` from spatial_shapes alone equals what ``get_image_features`` gives, odd grids too."""
    model = tiny_model("lfm2_vl", torch.float64)
    adapter = vlmcp.hf.adapter_for(model)
    assert adapter.name == "lfm2_vl"
    shapes = torch.tensor([[3, 5], [4, 4], [2, 6], [5, 2]])
    n = int(shapes.prod(-1).max())
    pixels = {"pixel_values": torch.randn(4, n, 12, dtype=torch.float64),
              "pixel_attention_mask": (torch.arange(n)[None] < shapes.prod(-1)[:, None]).int(),
              "spatial_shapes": shapes}
    with torch.no_grad():
        features = model.model.get_image_features(**pixels).pooler_output
    assert adapter.image_tokens(model, pixels) == [f.shape[0] for f in features] == [2, 4, 3, 2]


def test_select_and_concat_images_round_trip():
    """Images taken apart by sample and packed again (padded to the longest) are the row's own."""
    model = tiny_model("lfm2_vl", torch.float64)
    adapter = vlmcp.hf.adapter_for(model)
    inputs, _, _ = synthetic_row(model, SAMPLES)
    pixels = {k: inputs[k] for k in adapter.pixel_keys}
    assert pixels["spatial_shapes"].tolist() == [[4, 6], [8, 8], [4, 4]]
    parts = [adapter.select_images(pixels, [0, 1]), adapter.select_images(pixels, [2])]
    again = adapter.concat_images(parts)
    assert all(torch.equal(again[k], pixels[k]) for k in adapter.pixel_keys)
    dummy = adapter.dummy_images(model)
    assert adapter.image_tokens(model, dummy) == [1]
