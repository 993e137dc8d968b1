"""Gradient rules, reduce_gradients, the DDP convention, and the CP loss.

See Note [vlmcp gradient rules] in vlmcp/grads.py.
"""

import pytest
import torch
from torch import nn

from tests import vision_cases
from tests.vision_cases import MODES
from vlmcp.grads import (
    GradRule,
    ddp_ignored_params,
    grad_rule,
    gradient_copies,
    local_part,
    reduce_gradients,
    set_grad_rule,
)
from vlmcp.testing import run_on_ranks

GRID_P = [2, 3, 4]


@pytest.mark.parametrize("P", GRID_P)
def test_double_count_trap_is_closed(P):
    # allreduce_hook leaves FULL vision gradients on every rank: summing them over CP
    # (what a share-semantics reducer does to untagged params) gives P times the truth;
    # reduce_gradients averages them and matches one process.
    for rank in vision_cases.grid_results(P):
        for d in rank:
            if d["images"] == "none":
                continue
            ratio = P if d["mode"] == "allreduce_hook" else 1.0
            assert d["naive_ratio"] == pytest.approx(ratio, rel=1e-4), d["mode"]
            assert d["errors"]["vision"] <= 1e-5, d["mode"]


@pytest.mark.parametrize("P", GRID_P)
def test_parameters_carry_the_rule_of_their_mode(P):
    cfg = vision_cases.VCFG
    vision = sum(p.numel() for p in vision_cases.make_encoder(torch.float64).parameters())
    head = cfg["out_dim"] * (vision_cases.NUM_TEXT + vision_cases.VOCAB)
    fc2 = cfg["out_dim"] * (cfg["projector_hidden"] + 1)
    expected = {
        "replicate": dict(share=vision + head, full=0, partitioned=0),
        "broadcast": dict(share=vision + head, full=0, partitioned=0),
        "scatter": dict(share=vision + head, full=0, partitioned=0),
        "hidden_shard": dict(share=vision - fc2 + head, full=0, partitioned=fc2 // P),
        "allreduce_hook": dict(share=head, full=vision, partitioned=0),
    }
    for d in vision_cases.grid_results(P)[0]:
        assert d["grad_numel"] == {**expected[d["mode"]], "expert": 0}, d["mode"]
        # One flat all-reduce over CP per dtype, carrying everything but the partitioned slice,
        # plus one "has a gradient" flag per parameter.
        nbytes = (d["grad_numel"]["share"] + d["grad_numel"]["full"] + d["reduced_params"]) * d["itemsize"]
        assert [tuple(c) for c in d["reduce_calls"]] == [("all_reduce", nbytes)]
        assert (d["report"].cp_collectives, d["report"].cp_bytes) == (1, nbytes)


@pytest.mark.parametrize("P", GRID_P)
def test_ddp_convention_is_exact_in_every_mode(P):
    # DDP's average over the group is simulated by an all-reduce mean; loss scaled by P.
    for rank in vision_cases.grid_results(P):
        for d in rank:
            tol = vision_cases.TOL[getattr(torch, d["dtype"].split(".")[1])]
            assert max(d["ddp_errors"].values()) <= tol, (d["mode"], d["dtype"], d["ddp_errors"])


def test_dp_times_cp_both_conventions():
    results = run_on_ranks(vision_cases.dp_cp_grid, 4, timeout=120)
    for rank in results:
        assert [d["mode"] for d in rank] == list(MODES)
        for d in rank:
            assert max(d["errors"].values()) <= 1e-10 and max(d["ddp_errors"].values()) <= 1e-10, d
            assert (d["report"].cp_collectives, d["report"].dp_collectives) == (1, 1)
            partitioned = d["mode"] == "hidden_shard"
            assert bool(d["ignored"]) == partitioned
            assert d["ddp_report"].dp_collectives == int(partitioned)


def test_cp_cross_entropy_and_reduction_buckets():
    results = run_on_ranks(vision_cases.loss_grid, 3, timeout=60)
    for d in results:
        assert [tuple(c) for c in d["calls"]] == [("all_reduce", 16)]  # one all-reduce per loss
        assert d["half_dtype"] == "torch.float32"
        # float64 bucket: a, c, d, unused (19 values + 4 has-a-gradient flags); float32 bucket:
        # b (2 values + 1 flag); bf16 bucket: e, summed in float32 (2 values + 1 flag); frozen: none.
        calls = [("all_reduce", 23 * 8), ("all_reduce", 3 * 4), ("all_reduce", 3 * 4)]
        assert [tuple(c) for c in d["reduce"]["calls"]] == calls
        assert d["reduce"]["report"].cp_collectives == 3


def test_grad_rule_tags_and_local_part():
    lin = nn.Linear(4, 6)
    assert grad_rule(lin.weight) is GradRule.SHARE  # untagged parameters are shares
    set_grad_rule(lin.weight, "partitioned", 3, shard_dim=0, shard_index=2)
    full = torch.arange(18.0 * 4).view(18, 4)
    assert torch.equal(local_part(lin.weight, full), full[12:18])
    assert torch.equal(local_part(lin.bias, full), full)
    assert ddp_ignored_params(lin) == ["weight"]
    with pytest.raises(ValueError, match="PARTITIONED only"):
        set_grad_rule(lin.bias, GradRule.FULL, 3, shard_dim=0, shard_index=0)
    with pytest.raises(ValueError):
        set_grad_rule(lin.bias, "mean", 3)


def test_expert_rule_slices_and_counts():
    # EXPERT: EP rank 1 of 2 holds experts [2, 4) of 4 (dim 0); never touched by DDP; its reduced
    # gradient sits on the W/E ranks of its expert-DP group
    w = nn.Parameter(torch.zeros(2, 3, 5))
    set_grad_rule(w, GradRule.EXPERT, 2, shard_dim=0, shard_index=1, parts=2)
    full = torch.arange(4.0 * 15).view(4, 3, 5)
    assert torch.equal(local_part(w, full), full[2:4])
    holder = nn.Module()
    holder.w = w
    assert ddp_ignored_params(holder) == ["w"]
    assert gradient_copies(w, cp_size=2, dp_size=2) == 2 and gradient_copies(holder.w, 2) == 1
    with pytest.raises(ValueError, match="parts is required for EXPERT only"):
        set_grad_rule(w, GradRule.EXPERT, 2, shard_dim=0, shard_index=1)
    plain = nn.Parameter(torch.zeros(3))
    assert gradient_copies(plain, cp_size=2, dp_size=3) == 6


def test_reduce_gradients_without_a_cp_group_is_one_process():
    # None means no CP (never the global group): nothing is reduced, nothing communicated
    lin = nn.Linear(3, 2)
    lin.weight.grad = torch.ones(2, 3)
    report = reduce_gradients(lin, None)
    assert (report.cp_collectives, report.dp_collectives) == (0, 0)
    assert torch.equal(lin.weight.grad, torch.ones(2, 3)) and lin.bias.grad is None
