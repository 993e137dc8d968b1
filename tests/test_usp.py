"""Hybrid Ulysses x ring attention (``backend="usp"``): parity with one process on packed rows
with images anywhere (out, lse, dq, dk, dv at float64 within 1e-10), the exact messages, U = 1
sends what the ring sends and U = P what Ulysses sends, heads not divisible by P, clear errors,
subgroups in a DP x CP job, and ``vlmcp verify --attention usp``.

One spawned group per world size (P = 2 and P = 4) runs everything; the tests assert on it.
"""

import itertools
import json
import math

import pytest
import torch

import vlmcp
from tests import attention_cases, usp_cases
from vlmcp.cli import main
from vlmcp.testing import run_on_ranks
from vlmcp.train.specs.reference.config import ReferenceTrainConfig

ROWS = [
    ["t3 i5 t4 i2 i3 t6", "t7", "t2 i6"],  # images after text, back to back (image_ids), ending a sample
    ["i2 i3 t9 i4 t1", "t5 i1 t1 i7"],     # images opening their sample: computed locally, all heads
    [(5, 7), (0, 3), (9, 1)],              # packed: image + text, text only, one text token
    [(0, 13)],                             # text only, odd length
]
# whole-sample placement (tests/test_attention_parity.py's rows): every sample on one rank, a
# rank or a whole Ulysses group may get none; auto: a long sample split beside short whole ones
PLACED = ["t3 i2 t4", "t5", "i2 t3", "t2 i1 t2 i2 t1", "t9", "t1 i3 t6"]
MIXED = ["t4 i6 t90 i3 t40", "t3", "i2 t2", "t5"]
# at P = 4 some ranks, and at U = 2 a whole Ulysses group, hold no travelling token (2 text
# tokens in 8 chunks); an all-to-all where this rank sends and receives nothing
SHORT = [[(0, 2)], [(2, 1)], ["t2 i3 t1"]]
NAMES = ("out", "lse", "dq", "dk", "dv")


def parity_cases(P):
    """Every row x layout x image attention x U; K/V heads cycle through MHA, GQA with
    kv_heads % U != 0 (3 at U = 2, 4) and MQA; whole and auto sample placement.
    heads = 6 at P = 4: P does not divide them. At P = 4 also rows where ranks hold no
    text, under USP and Ulysses. Case layout: ``attention_cases.run_case``'s."""
    sizes = [u for u in (1, 2, 4) if P % u == 0]
    cases = [(row, strategy, "usp", ia, (12, 3, 4, 1)[i % 4], "float64", 0, 12, 8, "split", U)
             for i, (row, strategy, ia, U) in enumerate(itertools.product(
                 ROWS, ("replicate", "shard"), ("causal", "bidirectional"), sizes))]
    cases += [(row, strategy, "usp", ia, 3, "float64", 0, 12, 8, placement, U)
              for (row, placement), strategy, ia, U in itertools.product(
                  [(PLACED, "whole"), (MIXED, "auto")], ("replicate", "shard"), ("causal", "bidirectional"),
                  sizes)]
    if P == 4:
        cases += [(row, strategy, "usp", ia, kv, "float64", 1, 6, 8, "split", 2)
                  for row, (strategy, ia, kv) in itertools.product(
                      ROWS[:2], [("replicate", "causal", 3), ("shard", "bidirectional", 2)])]
        cases += [(row, strategy, backend, ia, 3, "float64", 0, 12, 8, "split", U)
                  for row, strategy, ia, (backend, U) in itertools.product(
                      SHORT, ("replicate", "shard"), ("causal", "bidirectional"),
                      [("usp", 2), ("ulysses", None)])]
        cases += [(ROWS[0], "replicate", "usp", "causal", 4, "float32", 2, 12, 16, "split", 2),
                  (ROWS[2], "replicate", "usp", "causal", 3, "bfloat16", 3, 12, 16, "split", 2)]
    return cases


# (samples, strategy, image_attention, heads, kv_heads, U[, sample placement]) at P = 4
MESSAGES = [
    (["t3 i5 t4 i2 t6", "t5", "i3 t2 i4 t1"], "replicate", "causal", 12, 3, 2),  # images after text
    (["t3 i5 t4 i2 t6", "t5", "i3 t2 i4 t1"], "replicate", "causal", 12, 3, 1),  # = ring
    (["t3 i5 t4 i2 t6", "t5", "i3 t2 i4 t1"], "replicate", "causal", 12, 3, 4),  # = Ulysses
    (["t3 i5 t4 i2 t6", "t5", "i3 t2 i4 t1"], "shard", "bidirectional", 6, 2, 2),  # 6 heads, P = 4
    ([(5, 7), (0, 3), (9, 1)], "replicate", "causal", 12, 1, 2),  # MQA; images only open samples
    (PLACED, "replicate", "causal", 12, 3, 2, "whole"),  # nothing travels: no message at all
    (MIXED, "replicate", "bidirectional", 12, 3, 2, "auto"),  # only the split sample's text travels
]
DP_CP_ROW = ["t3 i5 t4 i2 i3 t6", (0, 7)]
VLM = [dict(vision_mode="scatter", attention="usp", ulysses_size=2, dtype="float64", image_strategy="shard",
            image_attention="bidirectional"),
       dict(vision_mode="hidden_shard", attention="usp", ulysses_size=2, dtype="float32"),
       dict(vision_mode="broadcast", attention="usp", ulysses_size=2, dtype="float64",
            sample_placement="whole")]


@pytest.fixture(scope="module")
def results():
    return {P: run_on_ranks(usp_cases.usp_grid, P, parity_cases(P), MESSAGES if P == 4 else [],
                            DP_CP_ROW if P == 4 else None, VLM if P == 4 else (), timeout=300)
            for P in (2, 4)}


@pytest.mark.parametrize("P", [2, 4])
def test_usp_matches_one_process(results, P):
    cases = [(case, errs) for rank in results[P] for case, errs in rank["parity"]]
    assert len(cases) == P * len(parity_cases(P))
    assert {case[10] for case, _ in cases if case[2] == "usp"} == {u for u in (1, 2, 4) if P % u == 0}
    assert {case[9] for case, _ in cases} == {"split", "whole", "auto"}
    for case, errs in cases:
        for name in NAMES:
            if case[5] == "bfloat16":  # flash-attention's rule: within 2x a bf16 single process
                assert errs[name] <= 2 * errs["baseline"][name] + 1e-6, (case, name, errs)
            else:
                tol = 1e-10 if case[5] == "float64" else 2e-5
                assert errs[name] <= tol, (P, case, name, errs[name])


def _expected(r, case, travelling, late):
    """Exact forward and backward messages of CP rank r = gU + j (bf16; dK/dV in float32)."""
    H, kv, U = case[3:6]
    P, D = 4, usp_cases.HEAD_DIM
    R, g, j = P // U, r // U, r % U
    m = math.lcm(kv, U)
    members = tuple(range(g * U, (g + 1) * U))
    T, M = travelling[r], [sum(travelling[x * U:(x + 1) * U]) for x in range(R)]
    qkv, bf = (H + 2 * m) * D, "torch.bfloat16"

    def ring_batch(send, recv, itemsize):
        nbytes = 2 * (m // U) * D * itemsize
        ops = [("isend", M[send] * nbytes, j + (g + 1) % R * U)] if M[send] else []
        return ops + ([("irecv", M[recv] * nbytes, j + (g - 1) % R * U)] if M[recv] else [])

    ring_fwd = [("p2p", ring_batch((g - s) % R, (g - s - 1) % R, 2)) for s in range(R - 1)]
    ring_bwd = []
    for s in range(R):
        if s + 1 < R:
            ring_bwd.append(("p2p", ring_batch((g - s) % R, (g - s - 1) % R, 2)))
        if s >= 1:
            ring_bwd.append(("p2p", ring_batch((g - s) % R, (g - s - 1) % R, 4)))
    # a step with nothing to send or receive posts no batch (vlmcp.attention.ring_comm)
    ring_fwd, ring_bwd = ([e for e in x if e[1]] for x in (ring_fwd, ring_bwd))
    if U == 1 or M[g] == 0:  # no all-to-all in a group where nothing travels
        return ring_fwd, ring_bwd
    gathered = late * H * D
    fwd = [("a2a", T * qkv, M[g] * qkv // U, bf, members), *ring_fwd,
           ("a2a", M[g] * H * D // U, T * H * D, bf, members)]
    bwd = [("a2a", T * H * D, M[g] * H * D // U, bf, members), *ring_bwd,
           ("a2a", M[g] * qkv // U, T * qkv, bf, members)]
    if late:
        fwd.append(("ag", gathered // U, gathered, members))
        bwd.insert(0, ("rs", gathered, gathered // U, members))
    return fwd, bwd


def _p2p(entries):
    """P2P ops without their dtype (the byte counts carry the itemsize)."""
    return [(e[0], [op[:3] for op in e[1]]) if e[0] == "p2p" else e for e in entries]


@pytest.mark.parametrize("index", range(len(MESSAGES)))
def test_usp_sends_exactly_the_expected_messages(results, index):
    case = MESSAGES[index]
    for r, rank in enumerate(results[4]):
        got = rank["messages"][index]
        fwd, bwd = _expected(r, case, got["travelling"], got["late"])
        if case[1] == "replicate" and case[6:] in ((), ("split",)):  # only text travels: image K/V
            # (and Q) never leave a rank
            assert got["travelling"] == got["text"], (got["travelling"], got["text"])
        assert _p2p(got["usp"][0]) == fwd, (r, case)
        assert _p2p(got["usp"][1]) == bwd, (r, case)
    assert results[4][0]["messages"][index]["late"] == {0: 11, 1: 11, 2: 11, 6: 9}.get(index, 0)
    moved = sum(results[4][0]["messages"][index]["travelling"])
    assert (moved == 0) == (index == 5), moved  # the whole placement moves nothing, the others do


def test_usp_at_u2_moves_heads_in_groups_and_kv_around_the_ring(results):
    """The shape of the exact messages above: all-to-alls inside {0, 1} and {2, 3}, K/V of
    text between ranks j and j + 2, the late images' all-gather and its reduce-scatter."""
    for r, rank in enumerate(results[4]):
        fwd, bwd = rank["messages"][0]["usp"]
        assert [e[0] for e in fwd] == ["a2a", "p2p", "a2a", "ag"]
        assert [e[0] for e in bwd] == ["rs", "a2a", "p2p", "p2p", "a2a"]
        assert fwd[0][4] == (r - r % 2, r - r % 2 + 1)
        assert {op[2] for op in fwd[1][1]} == {(r + 2) % 4} and all(op[1] > 0 for op in fwd[1][1])


@pytest.mark.parametrize("index,same", [(1, "ring"), (2, "ulysses")])
def test_u1_sends_what_ring_sends_and_up_sends_what_ulysses_sends(results, index, same):
    for rank in results[4]:
        got = rank["messages"][index]
        assert got["same"] is not None, same
        assert got["usp"] == got["same"], (same, got["usp"], got["same"])


def test_bad_usp_calls(results):
    expected = {"missing": "needs ulysses_size", "not_divisor": "positive divisor of the CP size P=4, got 3",
                "heads": "heads divisible by ulysses_size: heads=6", "other_backend": "backend='usp' only"}
    for rank in results[4]:
        assert [label for label, *_ in rank["bad"]] == list(expected)
        for label, kind, message in rank["bad"]:
            assert kind == "ValueError" and expected[label] in message, (label, kind, message)


def test_usp_in_a_dp_x_cp_job(results):
    """Two CP groups of 2 in a world of 4: no lazy subgroups (they would wait for the other CP
    group), ``usp_groups`` on every rank makes them, and the result is exact."""
    for r, rank in enumerate(results[4]):
        refused, ranks, errs = rank["dp_cp"]
        assert "usp_groups(cp_group, 2) on every process first" in refused
        cp = [r - r % 2, r - r % 2 + 1]
        assert ranks == {1: [None, cp], 2: [cp, None]}
        for e in errs:
            assert max(e[n] for n in NAMES) <= 1e-10, e


def test_vlm_training_step_under_usp_matches_one_process(results):
    """Cases of test_vlm's grid at P = 4, U = 2: scatter (shard, bidirectional), hidden_shard
    (float32), broadcast with whole samples."""
    for per_rank in zip(*(rank["vlm"] for rank in results[4]), strict=True):
        r = per_rank[0]
        assert all(x["max_rel_grad_error"] == r["max_rel_grad_error"] for x in per_rank)
        bound = 1e-10 if r["dtype"] == "float64" else 1e-5
        assert r["max_rel_grad_error"] <= bound and r["loss_abs_error"] <= bound, r
        assert r["params_checked"] == 53 and r["vision_grad_norm"] > 1e-3 and r["passed"], r
    assert len(results[4][0]["vlm"]) == len(VLM)


def test_usp_in_one_process_communicates_nothing():
    is_image, cu, ids, q, k, v, dout = attention_cases.make_row(ROWS[0], 6, 3, 8, 0)
    shard = vlmcp.plan_cp(is_image, 1, cu, image_ids=ids).for_rank(0)
    x = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = vlmcp.reference_attention(*x, is_image, cu, "bidirectional", image_ids=ids)[0]
    ref_grads = torch.autograd.grad((ref * dout).sum(), x)
    lx = [shard.shard(t).requires_grad_() for t in (q, k, v)]
    with attention_cases.CommLog(forbid=True):
        out = vlmcp.cp_attention(*lx, shard, None, "usp", "bidirectional", ulysses_size=1)
        grads = torch.autograd.grad((out * shard.shard(dout)).sum(), lx)
    valid = shard.positions >= 0
    pos = shard.positions[valid]
    assert float((out.detach()[valid] - ref.detach()[pos]).abs().max()) < 1e-12
    assert max(float((g[valid] - r[pos]).abs().max()) for g, r in zip(grads, ref_grads, strict=True)) < 1e-12


def test_cli_verify_usp_passes(capsys):
    assert main(["verify", "--cp", "4", "--attention", "usp", "--ulysses-size", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["passed"] is True and result["cp"] == 4 and result["ulysses_size"] == 2
    assert result["max_rel_grad_error"] <= 1e-10


@pytest.mark.parametrize("argv,match", [
    (["--cp", "4", "--attention", "usp", "--ulysses-size", "3"], "--ulysses-size must divide --cp 4"),
    (["--cp", "4", "--ulysses-size", "2"], "--ulysses-size needs --attention usp"),
    (["--model", "hf:llava", "--attention", "usp"], "--attention usp is for the reference VLM"),
])
def test_cli_verify_rejects_bad_usp_flags(argv, match, capsys):
    assert main(["verify", *argv]) == 2
    assert match in capsys.readouterr().err


def test_train_config_usp():
    usp = ReferenceTrainConfig(cp=4, heads=6, kv_heads=3, hidden=48, attention="usp", ulysses_size=2)
    assert usp.usp_size == 2
    assert ReferenceTrainConfig(cp=4, heads=4, kv_heads=2, attention="usp").usp_size == 2  # gcd(kv_heads, cp)
    assert ReferenceTrainConfig(cp=4, attention="ring").usp_size is None
    with pytest.raises(ValueError, match="--ulysses-size must divide --cp"):
        ReferenceTrainConfig(cp=4, heads=6, kv_heads=3, hidden=48, attention="usp", ulysses_size=4)
    with pytest.raises(ValueError, match="--ulysses-size needs --attention usp"):
        ReferenceTrainConfig(cp=4, attention="ulysses", ulysses_size=2)
