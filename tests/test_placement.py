"""Whole-sample placement (issue 12): each sample on one rank, balanced by cost; auto splits long ones."""

import pytest
import torch

import vlmcp
from tests import rows
from vlmcp.layout import CostModel
from vlmcp.layout.sample_placement import lpt_assign


def test_whole_puts_each_sample_on_one_rank_and_nothing_travels():
    is_image, cu, ids = rows.make_row(["t3 i2 t4", "t5", "i2 t3", "t2 i1 t2 i2 t1", "t9", "t1 i3 t6"])
    for P in (2, 3, 4):
        plan = vlmcp.plan_cp(is_image, P, cu, image_ids=ids, sample_placement="whole")
        assert plan.sample_placement == "whole" and bool((plan.whole >= 0).all())
        assert not bool(plan.travelling.any()) and bool((plan.owner >= 0).all())  # nothing replicated
        seen = torch.zeros(plan.seq_len, dtype=torch.long)
        for shard in plan.shards():
            assert shard.num_tokens == plan.num_slots
            valid = shard.positions >= 0
            seen[shard.positions[valid]] += 1
            assert not bool(shard.travels.any()) and not bool(shard.replicated.any())
            mine = torch.nonzero(plan.whole == shard.rank).flatten()
            expect = torch.cat([torch.arange(int(cu[s]), int(cu[s + 1])) for s in mine.tolist()] or
                               [torch.zeros(0, dtype=torch.long)])
            assert torch.equal(shard.positions[valid], expect)  # its samples whole, in row order
            # padding closes the row: the last segment's suffix
            assert bool((shard.positions[valid.sum():] == -1).all())
        assert bool((seen == 1).all())


def test_lpt_balances_by_cost_largest_first():
    # 9 -> r0; 5 -> r1; 4 -> r1 (9 | 9); 4 -> r0 (tie: the lower rank); 2 -> r1: loads 13 | 11
    assert lpt_assign(torch.tensor([5.0, 9.0, 4.0, 4.0, 2.0]), 2).tolist() == [1, 0, 1, 0, 1]
    assert lpt_assign(torch.tensor([1.0, 1.0, 1.0]), 2).tolist() == [0, 1, 0]  # ties: row order, low rank


def test_auto_splits_a_long_sample_and_places_short_ones_whole():
    # one long chat sample beside short ones, at P=2: the long one stays split (whole, it would
    # double the busiest rank's work), the short ones are cheaper whole
    is_image, cu, ids = rows.make_row(["t12 i64 t900 i32 t300"] + ["t6 i4 t20"] * 12 + ["t25"] * 8)
    plan = vlmcp.plan_cp(is_image, 2, cu, image_ids=ids, sample_placement="auto")
    assert plan.sample_placement == "mixed"
    assert int(plan.whole[0]) == -1 and bool((plan.whole[1:] >= 0).all())
    # one long sample alone: split; many tiny ones: all whole
    is_image, cu, _ = rows.make_row(["t40 i256 t2000"])
    assert vlmcp.plan_cp(is_image, 4, cu, sample_placement="auto").sample_placement == "split"
    is_image, cu, _ = rows.make_row(["i8 t32"] * 256)
    plan = vlmcp.plan_cp(is_image, 2, cu, sample_placement="auto")
    assert plan.sample_placement == "whole"
    assert vlmcp.attended_pairs(plan).balance == 1.0 and plan.num_slots == 128 * 40


def test_split_stays_the_default_and_megatron_order():
    L, P = 2 * 4 * 5, 4
    plan = vlmcp.plan_cp(torch.zeros(L, dtype=torch.bool), P)
    assert plan.sample_placement == "split"
    chunks = torch.arange(L).view(2 * P, -1)
    for r in range(P):
        assert torch.equal(plan.for_rank(r).positions, chunks[[r, 2 * P - 1 - r]].flatten())
    # P = 1: nothing to place
    assert vlmcp.plan_cp(torch.zeros(8, dtype=torch.bool), 1, sample_placement="whole").sample_placement \
        == "split"


def test_placement_counts_exactly_in_the_cost_model():
    is_image, cu, ids = rows.make_row(["t4 i6 t90 i3 t40", "t3", "i2 t2", "t5"])
    model = CostModel(flops_per_pair=1, flops_per_token=10, flops_per_byte=0.5, kv_heads=1, head_dim=1,
                      itemsize=1)
    for placement in ("whole", "auto"):
        plan = vlmcp.plan_cp(is_image, 3, cu, image_ids=ids, sample_placement=placement, cost_model=model)
        est = vlmcp.layout.estimate_cost(plan, model)
        work = vlmcp.attended_pairs(plan)
        assert est.pairs == work.total_pairs[est.busiest_rank]
        assert est.local_tokens == plan.num_slots
        if placement == "whole":  # nothing travels
            assert est.bytes_sent == 0 and est.comm_flops == 0


def test_bad_placement_arguments():
    is_image = torch.zeros(8, dtype=torch.bool)
    with pytest.raises(ValueError, match="sample_placement must be one of .*got 'tiles'"):
        vlmcp.plan_cp(is_image, 2, sample_placement="tiles")
    with pytest.raises(ValueError, match="cost_model is only used by"):
        vlmcp.plan_cp(is_image, 2, cost_model=CostModel())
    vlmcp.plan_cp(is_image, 2, cost_model=CostModel(), sample_placement="whole")  # used: no error
    with pytest.raises(TypeError, match="cost_model must be a CostModel"):
        vlmcp.plan_cp(is_image, 2, cost_model={}, sample_placement="auto")
