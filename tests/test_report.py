"""The loss-curve and plan pictures: valid, correctly sized, not blank, and right."""

import time

import matplotlib.image as mpimg
import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgb

import vlmcp
from tests import rows
from vlmcp.data import ShapesDataset, pack_row
from vlmcp.report import draw_plan, plot_loss_curve
from vlmcp.report.plan_picture import (
    _global_is_image,
    _global_owner,
    _mask_image,
    _rank_colours,
    _token_colours,
)
from vlmcp.train import MetricsWriter

pytestmark = pytest.mark.timeout(60)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_png(path):
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    return mpimg.imread(path)[..., :3]


def colour_count(pixels, colour, tol=0.02):
    """Pixels of ``colour``; blocks of the picture give thousands, anti-aliased text a few."""
    return int((np.abs(pixels - np.array(to_rgb(colour))).max(axis=-1) < tol).sum())


def test_loss_curve_png(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    with MetricsWriter(metrics) as w:
        for step in range(1, 41):
            w.write({"step": step, "loss": 4.0 * 0.95 ** step, "grad_norm_vision": 0.1 / step,
                     "grad_norm_projector": 0.5, "grad_norm_llm": 2.0, "tokens": 256, "seconds": 0.1})
    out = plot_loss_curve(metrics, tmp_path / "pics" / "loss.png")
    pixels = read_png(out)
    assert pixels.shape == (600, 700, 3)  # figsize (7, 6) at 100 dpi
    assert colour_count(pixels, "tab:blue") > 500
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50


def test_loss_curve_without_records_is_an_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no step with a loss"):
        plot_loss_curve(empty, tmp_path / "x.png")


@pytest.mark.parametrize("cp, strategy, attention", [(2, "replicate", "causal"),
                                                     (3, "shard", "bidirectional")])
def test_plan_png(tmp_path, cp, strategy, attention):
    row = pack_row(ShapesDataset(), 160, 0)
    plan = row.plan(cp, image_strategy=strategy)
    out = draw_plan(plan, tmp_path / "plan.png", image_attention=attention)
    pixels = read_png(out)
    assert pixels.shape == (round(100 * (0.45 * (cp + 1) + 7)), 1000, 3)
    for r in range(cp):
        assert colour_count(pixels, _rank_colours(cp)[r]) > 2000
    replicated_grey = colour_count(pixels, "#4d4d4d")
    assert replicated_grey > 10_000 if strategy == "replicate" else replicated_grey < 2_000


def test_plan_png_is_fast_for_long_rows(tmp_path):
    row = pack_row(ShapesDataset(), 4096, 0)
    plan = row.plan(4)
    start = time.perf_counter()
    read_png(draw_plan(plan, tmp_path / "big.png", max_mask_pixels=512))
    assert time.perf_counter() - start < 10


def test_bad_plan_arguments(tmp_path):
    plan = vlmcp.plan_cp(torch.zeros(8, dtype=torch.bool), 2)
    with pytest.raises(ValueError, match="image_attention"):
        draw_plan(plan, tmp_path / "p.png", image_attention="full")
    with pytest.raises(TypeError, match="CPPlan"):
        draw_plan(plan.for_rank(0), tmp_path / "p.png")


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("strategy", ["replicate", "shard"])
def test_mask_colours_match_a_brute_force_reference(strategy, bidirectional):
    # one text-only sample, padding at P=2, text before and between images, two images back to back
    is_image, cu, ids = rows.make_row([(4, 5), (0, 6), (3, 2), "t2 i2 i1 t1 i2 t3"])
    plan = vlmcp.plan_cp(is_image, 2, cu, image_strategy=strategy, image_ids=ids)
    ranks = _rank_colours(2)
    owner = _global_owner(plan)
    img, sid, image_ids = _global_is_image(plan)
    colours = _token_colours(owner, img, ranks)
    mask, res = _mask_image(plan, owner, image_ids, sid, colours, bidirectional, max_pixels=1000)
    assert res == plan.seq_len
    computed_by = {}  # global query position -> set of ranks holding it
    for shard in plan.shards():
        for p in shard.positions[shard.positions >= 0].tolist():
            computed_by.setdefault(p, set()).add(shard.rank)
    for q in range(plan.seq_len):
        for k in range(plan.seq_len):
            same = sid[q] == sid[k]
            one_image = img[q] and img[k] and int(ids[q]) == int(ids[k])
            visible = same and (k <= q or (bidirectional and one_image))
            if not visible:
                assert tuple(mask[q, k]) == (1.0, 1.0, 1.0)
                continue
            holders = computed_by[q]
            if len(holders) == 2:  # replicated: grey
                assert strategy == "replicate" and img[q]
                assert np.allclose(mask[q, k], to_rgb("#4d4d4d"))
            else:
                (r,) = holders
                base = ranks[r]
                expected = base + (1 - base) * 0.55 if img[q] else base
                assert np.allclose(mask[q, k], expected)
