"""Vision placement: complete embeddings on every rank, exact gradients, no hang, clear errors.

The core check (tests/vision_cases.py ``placement_grid``) puts a toy LLM head on the
placed embeddings: rank r's text tokens read every image row, its loss is its
token losses over the CP group's target count, then ``reduce_gradients``. Every
vision, projector and head gradient must equal the single-process gradient of the
whole loss, for every mode, in float64 and float32, with four images, one image
(ranks without an image under ``scatter``) and none.
"""

import itertools

import pytest
import torch

from tests import vision_cases
from tests.vision_cases import IMAGE_SETS, MODES
from vlmcp import plan_cp
from vlmcp.testing import run_on_ranks
from vlmcp.vision import VisionConfig, VisionEncoder, assign_images, check_images_match, vit_cost

GRID_P = [2, 3, 4]


@pytest.mark.parametrize("P", GRID_P)
def test_every_mode_gives_exact_gradients(P):
    results = vision_cases.grid_results(P)
    cases = {(d["mode"], d["dtype"], d["images"]) for d in results[0]}
    assert cases == set(itertools.product(MODES, ["torch.float64", "torch.float32"], IMAGE_SETS))
    for rank in results:
        for d in rank:
            tol = vision_cases.TOL[getattr(torch, d["dtype"].split(".")[1])]
            assert d["errors"]["vision"] <= tol and d["errors"]["head"] <= tol, d


@pytest.mark.parametrize("P", GRID_P)
def test_scatter_rank_without_image_joins_and_stays_exact(P):
    results = vision_cases.grid_results(P)
    one = [[d for d in rank if d["mode"] == "scatter" and d["images"] == "one"] for rank in results]
    owned = [d["own_images"] for rank in one for d in rank]
    assert owned.count(0) == 2 * (P - 1)  # both dtypes; every rank but one encodes nothing
    assert all(d["errors"]["vision"] <= 1e-5 for rank in one for d in rank)


@pytest.mark.parametrize("P", GRID_P)
def test_collectives_per_mode_are_exactly_the_documented_ones(P):
    d_model = vision_cases.VCFG["out_dim"]
    loss_call = ("all_reduce", 16)  # count and summed loss, 2 x float64
    for rank in vision_cases.grid_results(P):
        for d in rank:
            n, b, rows = d["n_tokens"], d["itemsize"], d["max_rows"]
            full = n * d_model * b
            expected = {
                "replicate": [loss_call],
                "broadcast": [("broadcast", full), loss_call, ("reduce", full)],
                "scatter": [("all_gather", rows * d_model * b), loss_call,
                            ("reduce_scatter", P * rows * d_model * b)],
                "hidden_shard": [("all_gather", full // P), loss_call, ("reduce_scatter", full)],
                "allreduce_hook": [loss_call, ("all_reduce", full)],
            }[d["mode"]]
            if n == 0:  # no image anywhere: the vision side communicates nothing
                expected = [loss_call]
            assert [tuple(c) for c in d["calls"]] == expected, (d["mode"], d["images"], d["calls"])


def test_bad_inputs_raise_the_same_error_on_every_rank_before_any_collective():
    results = run_on_ranks(vision_cases.bad_inputs, 2, timeout=60)
    assert results[0] == results[1]
    messages, alive = results[0]
    assert alive == 2
    assert "got 'ring'" in messages["mode"]
    assert "[0, 2), got 2" in messages["src"]
    assert "out_dim=5" in messages["hidden"] and "P=2" in messages["hidden"]
    assert "placed already" in messages["twice"]
    assert "image 1 has size 5x4" in messages["patch"]
    assert "got 3 images but the row has 2 image spans" in messages["count"]
    assert "image 0 gives 6 tokens" in messages["tokens"] and "has 4" in messages["tokens"]
    assert "width 12 differs from the LLM hidden size 16" in messages["width"]
    assert "CP group of 2 ranks" in messages["cp_size"]


def test_assign_images_balances_patches_squared_largest_first():
    assert assign_images([], 3) == []
    assert assign_images([5], 4) == [0]  # ranks 1..3 get nothing
    assert assign_images([4, 4, 4], 2) == [0, 1, 0]  # ties: image order, lowest rank
    assert assign_images([1, 9, 4, 4, 2], 2) == [0, 0, 1, 1, 1]  # 9 | 4, 4 | 2 to r1 | 1 to r0: 10, 10
    with pytest.raises(ValueError, match="num_ranks"):
        assign_images([1], 0)
    with pytest.raises(ValueError, match="costs"):
        assign_images([1, -1], 2)


def _load(costs, owner, rank):
    return sum(c for c, o in zip(costs, owner, strict=True) if o == rank)


def test_assign_images_is_within_the_lpt_bound_of_the_optimum():
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        n, P = int(torch.randint(1, 8, (1,), generator=gen)), int(torch.randint(2, 4, (1,), generator=gen))
        costs = [vit_cost(int(t)) for t in torch.randint(1, 30, (n,), generator=gen)]
        owner = assign_images(costs, P)
        best = min(max(_load(costs, a, r) for r in range(P)) for a in itertools.product(range(P), repeat=n))
        loads = [_load(costs, owner, r) for r in range(P)]
        assert max(loads) <= (4 / 3 - 1 / (3 * P)) * best + 1e-9, (costs, P, owner)


def test_check_images_match_accepts_the_plan_and_names_the_bad_image():
    is_image = torch.tensor([1] * 6 + [0] * 3 + [0] * 4 + [1] * 2 + [0], dtype=torch.bool)
    plan = plan_cp(is_image, 2, torch.tensor([0, 9, 13, 16]))  # sample 1 has no image
    assert check_images_match([torch.zeros(3, 4, 6), torch.zeros(3, 2, 4)], plan, 2) == [6, 2]
    assert check_images_match([], plan_cp(torch.zeros(5, dtype=torch.bool), 2), 2) == []
    with pytest.raises(ValueError, match="image 1 must be a \\(3, H, W\\) tensor"):
        check_images_match([torch.zeros(3, 4, 6), torch.zeros(1, 2, 4)], plan, 2)
    with pytest.raises(ValueError, match="not a multiple of patch_size=2"):
        check_images_match([torch.zeros(3, 4, 6), torch.zeros(3, 3, 4)], plan, 2)


def test_unplaced_encoder_is_an_ordinary_module():
    enc = VisionEncoder(VisionConfig(out_dim=8, patch_size=2, width=16, heads=2))
    images = [torch.randn(3, 4, 6), torch.randn(3, 2, 2)]
    out = enc(images)
    assert out.shape == (6 + 1, 8)
    # Images are encoded independently: full attention inside an image, none across.
    assert torch.allclose(out[:6], enc([images[0]]), atol=1e-6)
    assert enc([]).shape == (0, 8)
    with pytest.raises(ValueError, match="multiples of patch_size=2"):
        enc([torch.randn(3, 4, 5)])
    with pytest.raises(ValueError, match="width=18"):
        VisionConfig(out_dim=8, width=18)


def test_frozen_projector_ranks_without_images_still_join_the_backward():
    # Under scatter the rank without an image has no graph through the ViT; its empty
    # part must still require grad or the image owner waits forever in the reduce-scatter.
    for errs in run_on_ranks(vision_cases.frozen_projector, 3, timeout=60):
        assert errs["scatter"] <= 1e-10 and errs["broadcast"] <= 1e-10
