"""image_strategy="auto": the cost model against exact accounting, hand numbers, and its decisions."""

import dataclasses
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import vlmcp
from tests import rows
from vlmcp.attention.exchange import ring_bytes_sent
from vlmcp.cli import main
from vlmcp.layout import CostModel, attended_pairs, choose_image_strategy, estimate_cost
from vlmcp.testing import run_on_ranks

pytestmark = pytest.mark.timeout(60)

# A narrow float32 LLM with full-width K/V: communication is dear against its compute,
# so small images stay replicated (the threshold of the Note is ~6,700 image tokens).
NARROW = CostModel.for_transformer(hidden_size=512, mlp_ratio=4, kv_heads=8, head_dim=64, itemsize=4)


def make_row(samples):
    """samples: ``(image_tokens, text_tokens)`` pairs or spec strings -> (is_image, cu_seqlens)."""
    is_image, cu, _ = rows.make_row(samples)
    return is_image, cu


def choose(samples, P, model=None):
    is_image, cu = make_row(samples)
    return choose_image_strategy(is_image, P, cu, model)


def exact_cost(plan, model):
    """The busiest rank's cost from work.py's pair count and the ring's byte count, rank by rank."""
    work = attended_pairs(plan, model.image_attention)
    costs = []
    for shard in plan.shards():
        fwd, bwd = ring_bytes_sent(shard, model.kv_heads, model.head_dim, model.itemsize)
        costs.append(float(model.flops_per_pair) * work.total_pairs[shard.rank]
                     + float(model.flops_per_token) * shard.num_tokens
                     + float(model.flops_per_byte) * (fwd + bwd))
    return max(costs)


@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_estimate_prices_interleaved_rows_exactly(attention):
    """Images after text: their queries' pairs with the travelling text are on every rank's bill."""
    samples = ["t12 i40 t3 i24 t90", "t300", "t20 i64 t7"]
    is_image, cu = make_row(samples)
    model = dataclasses.replace(NARROW, image_attention=attention)
    for P in (2, 3, 4):
        for strategy in ("replicate", "shard"):
            plan = vlmcp.plan_cp(is_image, P, cu, image_strategy=strategy)
            assert estimate_cost(plan, model).cost == pytest.approx(exact_cost(plan, model), rel=1e-12)


def test_estimate_matches_a_hand_computation():
    # One sample [I I | t t t t], P = 2; 1 pair = 1, 1 token = 10, 1 byte = 0.5; K/V of 1 x 1
    # in 1 byte: a token's K and V are 2 B, its dK and dV (float32) 8 B.
    # replicate: both ranks hold I I (keys 1 + 2); rank 0 gets text offsets 2, 5 (keys 3 + 6),
    #   rank 1 offsets 3, 4 (keys 4 + 5): 12 pairs, 4 slots each. A rank sends its own 2 text
    #   tokens' K/V forward (4 B) and again backward (4 B), and the peer's dK/dV (16 B): 24 B.
    #   cost = 12 + 10 * 4 + 0.5 * 24 = 64 on both ranks.
    # shard: 6 tokens do not divide into 2P = 4 chunks, so they are cut by work: the pairs
    #   (0, 5), (1, 4), (2, 3) weigh 7 each; rank 0 takes one pair (offsets 0, 5: keys 1 + 6) and
    #   2 pads, rank 1 the middle (offsets 1..4: keys 2 + 3 + 4 + 5 = 14). Rank 1 sends its 4
    #   tokens' K/V twice (8 + 8 B) and rank 0's dK/dV (16 B): 32 B, cost 14 + 40 + 16 = 70.
    #   Rank 0: 4 + 4 + 32 B, cost 7 + 40 + 20 = 67.
    model = CostModel(flops_per_pair=1, flops_per_token=10, flops_per_byte=0.5,
                      kv_heads=1, head_dim=1, itemsize=1)
    strategy, est = choose([(2, 4)], 2, model)
    rep, shard = est["replicate"], est["shard"]
    assert (rep.pairs, rep.local_tokens, rep.bytes_sent, rep.cost) == (12, 4, 24, 64.0)
    assert (shard.busiest_rank, shard.pairs, shard.local_tokens, shard.bytes_sent) == (1, 14, 4, 32)
    assert (shard.attention_flops, shard.token_flops, shard.comm_flops, shard.cost) == (14, 40, 16, 70.0)
    assert strategy == "replicate"  # padding leaves shard's rank 1 the busier
    assert model.bytes_per_ring_token == 2 * 2 + 2 * 4


def test_default_weights_are_the_documented_derivation():
    d = 4096
    assert CostModel() == CostModel.for_transformer(hidden_size=d)
    assert CostModel().flops_per_pair == 14 * d  # 4d forward, 3.5x with flash backward
    assert CostModel().flops_per_token == 78 * d * d  # 3 x ((4 + 6 * 3.5) d^2 + 4 d * d/4)
    m = 8 / 3  # without GQA the token weight is 3 x (8 + 6m) d^2
    mha = CostModel.for_transformer(hidden_size=1024, mlp_ratio=m, kv_heads=16, head_dim=64)
    assert mha.flops_per_token == pytest.approx(3 * (8 + 6 * m) * 1024**2)
    assert CostModel().bytes_per_ring_token == 16 * 1024  # K/V 4 KiB twice, dK/dV 8 KiB


@settings(max_examples=60, deadline=None)
@given(samples=st.lists(st.tuples(st.integers(0, 24), st.integers(0, 30)), min_size=1, max_size=4),
       P=st.integers(1, 5),
       weights=st.tuples(*[st.sampled_from([0, 0.5, 1, 3, 1000.0]) for _ in range(3)]),
       kv=st.tuples(st.integers(1, 3), st.integers(1, 4), st.sampled_from([1, 2, 4, 8])),
       attention=st.sampled_from(["causal", "bidirectional"]))
def test_estimate_equals_exact_accounting_and_choice_is_cheapest(samples, P, weights, kv, attention):
    samples = [(i, t) for i, t in samples if i + t > 0]
    assume(samples and any(weights))
    model = CostModel(flops_per_pair=weights[0], flops_per_token=weights[1], flops_per_byte=weights[2],
                      kv_heads=kv[0], head_dim=kv[1], itemsize=kv[2], image_attention=attention)
    is_image, cu = make_row(samples)
    for strategy in ("replicate", "shard"):
        plan = vlmcp.plan_cp(is_image, P, cu, image_strategy=strategy)
        assert estimate_cost(plan, model).cost == pytest.approx(exact_cost(plan, model), rel=1e-12)
    chosen, est = choose_image_strategy(is_image, P, cu, model)
    other = "shard" if chosen == "replicate" else "replicate"
    if P == 1:
        assert chosen == "replicate"
    else:
        assert est[chosen].cost <= est[other].cost
        assert chosen == "replicate" or est["shard"].cost < est["replicate"].cost  # ties -> replicate


def test_text_only_rows_tie_and_stay_replicated():
    strategy, est = choose([(0, 100), (0, 37)], 4)
    assert strategy == "replicate"
    assert est["replicate"] == dataclasses.replace(est["shard"], image_strategy="replicate")


def test_p1_returns_replicate_where_both_layouts_cost_the_same():
    # P = 1: both layouts hold every token once, unpadded, so the tie goes to replicate.
    strategy, est = choose([(1, 1), (3, 4)], 1)
    assert est["shard"].cost == est["replicate"].cost
    assert strategy == "replicate"
    is_image, _ = make_row([(1, 1)])
    assert vlmcp.plan_cp(is_image, 1, image_strategy="auto").image_strategy == "replicate"


def test_text_dominated_rows_replicate_and_image_dominated_rows_shard():
    # Where communication is dear (NARROW), a small image beside much text stays replicated,
    # and a large image with little text is sharded, here at P = 8.
    assert choose([(256, 4096), (256, 4096)], 4, NARROW)[0] == "replicate"
    assert choose([(576, 2000)] * 4, 8, NARROW)[0] == "replicate"
    assert choose([(16384, 256)], 8, NARROW)[0] == "shard"
    # With the default (an 8B model's) weights one token's own work costs ~20x its ring
    # traffic, so any image is sharded once P > 1; by a wide margin when images dominate.
    strategy, est = choose([(4096, 256)], 8)
    assert strategy == "shard" and est["shard"].cost < 0.25 * est["replicate"].cost
    assert choose([(64, 8192)], 4)[0] == "shard"


@pytest.mark.parametrize("model", [NARROW, CostModel()])
def test_the_choice_turns_on_image_size_as_the_note_predicts(model):
    """replicate - shard = I (P-1)/P [token + (I+1)/2 pair - B byte], the same for any amount of text."""
    P = 4
    for image in (8, 64, 512, 4096, 16384):  # multiples of 2P: no padding
        gaps = []
        for text in (8, 800, 8000):
            _, est = choose([(image, text)], P, model)
            gaps.append(est["replicate"].cost - est["shard"].cost)
        per_image_token = (model.flops_per_token + (image + 1) / 2 * model.flops_per_pair
                           - model.bytes_per_ring_token * model.flops_per_byte)
        assert gaps == pytest.approx([image * (P - 1) / P * per_image_token] * 3, rel=1e-9)
        assert choose([(image, 800)], P, model)[0] == ("shard" if per_image_token > 0 else "replicate")


def test_memory_budget_overrides_cost():
    samples, P = [(256, 4096), (256, 4096)], 4
    _, est = choose(samples, P, NARROW)
    assert est["replicate"].cost < est["shard"].cost
    assert est["shard"].local_tokens < est["replicate"].local_tokens
    budget = est["shard"].local_tokens
    tight = CostModel.for_transformer(hidden_size=512, mlp_ratio=4, kv_heads=8, head_dim=64, itemsize=4,
                                      max_local_tokens=budget)
    strategy, est = choose(samples, P, tight)
    assert strategy == "shard" and est["shard"].fits and not est["replicate"].fits
    tighter = CostModel.for_transformer(hidden_size=512, mlp_ratio=4, kv_heads=8, head_dim=64, itemsize=4,
                                        max_local_tokens=budget - 1)
    assert choose(samples, P, tighter)[0] == "replicate"  # neither fits: the cheaper one


def test_auto_plan_is_the_chosen_layout_with_its_estimates():
    is_image, cu = make_row([(40, 9), (0, 13), (100, 3)])
    plan = vlmcp.plan_cp(is_image, 3, cu, image_strategy="auto")
    strategy, est = choose_image_strategy(is_image, 3, cu)
    assert plan.image_strategy == strategy == "shard"
    assert [e.image_strategy for e in plan.cost_estimates] == ["replicate", "shard"]
    assert plan.cost_estimates == tuple(est.values())
    explicit = vlmcp.plan_cp(is_image, 3, cu, image_strategy=strategy)
    assert explicit.cost_estimates is None
    for a, b in zip(plan.shards(), explicit.shards(), strict=True):
        assert a.image_strategy == strategy
        assert torch.equal(a.positions, b.positions) and torch.equal(a.cu_seqlens, b.cu_seqlens)


def _decide_on_rank(group, samples, P):
    rank = group.rank()
    is_image, cu = make_row(samples)
    cu = [cu.to(torch.int32), cu.tolist(), cu][rank % 3]  # each rank spells the metadata its own way
    torch.set_num_threads(1 + rank)
    model = CostModel.for_transformer(hidden_size=512, mlp_ratio=4, kv_heads=8, head_dim=64, itemsize=4)
    strategy, est = choose_image_strategy(is_image, P, cu, model)
    return strategy, [(e.busiest_rank, e.pairs, e.bytes_sent, e.local_tokens, e.cost.hex())
                      for e in est.values()]


def test_decision_is_identical_on_every_rank():
    # Near the crossover, so a rank-dependent rounding would show as a different choice.
    samples = [(6734, 200), (16, 24)]
    _, est = choose(samples, 3, NARROW)
    assert abs(est["replicate"].cost / est["shard"].cost - 1) < 1e-4
    results = run_on_ranks(_decide_on_rank, 3, samples, 3, timeout=60)
    assert all(r == results[0] for r in results)


@pytest.mark.parametrize("kwargs, match", [
    (dict(flops_per_pair=-1.0), "flops_per_pair must be a finite number >= 0, got -1.0"),
    (dict(flops_per_token=math.nan), "flops_per_token must be a finite number >= 0, got nan"),
    (dict(flops_per_byte=math.inf), "flops_per_byte must be a finite number >= 0, got inf"),
    (dict(flops_per_byte="4000"), "flops_per_byte must be a finite number >= 0, got '4000'"),
    (dict(flops_per_pair=True), "flops_per_pair must be a finite number >= 0, got True"),
    (dict(flops_per_pair=0, flops_per_token=0, flops_per_byte=0), "at least one positive weight"),
    (dict(kv_heads=0), "kv_heads must be an int >= 1, got 0"),
    (dict(head_dim=2.0), "head_dim must be an int >= 1, got 2.0"),
    (dict(itemsize=3), "itemsize must be 1, 2, 4 or 8 bytes, got 3"),
    (dict(image_attention="full"), "image_attention must be one of .*got 'full'"),
    (dict(max_local_tokens=0), "max_local_tokens must be None or an int >= 1, got 0"),
])
def test_bad_cost_model_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CostModel(**kwargs)


def test_bad_cost_model_use():
    with pytest.raises(TypeError):
        CostModel(4096.0)  # keyword-only
    with pytest.raises(ValueError, match="hidden_size must be an int >= 1, got 0"):
        CostModel.for_transformer(hidden_size=0)
    with pytest.raises(ValueError, match="mlp_ratio must be a finite number > 0, got -2"):
        CostModel.for_transformer(hidden_size=64, mlp_ratio=-2)
    is_image = torch.zeros(8, dtype=torch.bool)
    with pytest.raises(ValueError, match="only used by image_strategy='auto' or sample_placement="
                                         "'whole'/'auto', got image_strategy='shard'"):
        vlmcp.plan_cp(is_image, 2, image_strategy="shard", cost_model=CostModel())
    with pytest.raises(TypeError, match="cost_model must be a CostModel, got dict"):
        vlmcp.plan_cp(is_image, 2, image_strategy="auto", cost_model={"flops_per_byte": 1})
    # images anywhere are priced too (here an image after text)
    assert vlmcp.plan_cp(torch.tensor([0, 1], dtype=torch.bool), 2, image_strategy="auto").cost_estimates


def test_cli_plan_auto_prints_estimates_and_choice(capsys):
    assert main(["plan", "--image-strategy", "auto", "--cp", "8", "--image-tokens", "4096",
                 "--text-tokens", "256"]) == 0
    out = capsys.readouterr().out
    assert "image_strategy=shard" in out and "chosen: shard (" in out and "cheaper than replicate" in out
    assert "replicate" in out.split("chosen:")[0]  # both layouts' rows are printed
    assert main(["plan", "--image-strategy", "auto", "--cp", "4", "--image-tokens", "256,256",
                 "--text-tokens", "4096,4096", "--hidden-size", "512", "--mlp-ratio", "4",
                 "--head-dim", "64", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "chosen: replicate (" in out and "image K/V never travel" in out
    assert main(["plan", "--image-strategy", "auto", "--cp", "1", "--image-tokens", "4",
                 "--text-tokens", "4"]) == 0
    assert "chosen: replicate (P = 1" in capsys.readouterr().out
    assert main(["plan", "--image-strategy", "auto", "--hidden-size", "0"]) == 2
    assert "hidden_size must be an int >= 1" in capsys.readouterr().err
