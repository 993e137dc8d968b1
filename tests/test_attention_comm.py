"""What CP attention sends: exact ring messages per step, exact Ulysses all-to-all volume,
nothing at P = 1, and clear errors before any communication."""

import pytest

from tests import attention_cases
from vlmcp.testing import run_on_ranks

P = 3  # not a power of two
HEADS, D = 6, 8
CASES = [  # (samples, backend, heads, kv_heads, head_dim)
    ([(5, 7), (0, 3), (9, 1)], "ring", HEADS, 2, D),
    ([(4, 0), (2, 13)], "ring", HEADS, 6, D),
    ([(5, 7), (0, 3), (9, 1)], "ulysses", HEADS, 3, D),   # kv_heads % P == 0: no replication
    ([(5, 7), (0, 3), (9, 1)], "ulysses", HEADS, 2, D),   # kv_heads % P != 0: lcm(2, 3) = 6 = heads
    ([(5, 7), (0, 3), (9, 1)], "ulysses", 12, 2, D),      # lcm(2, 3) = 6 K/V heads travel, not 12
    ([(5, 7), (0, 3), (9, 1)], "ulysses", HEADS, 1, D),   # MQA: lcm(1, 3) = 3 K/V heads, not 6
    (["t3 i5 t4 i2 t6", "t5", "i3 t2 i4 t1"], "ring", HEADS, 2, D),     # images anywhere
    (["t3 i5 t4 i2 t6", "t5", "i3 t2 i4 t1"], "ulysses", HEADS, 3, D),  # images after text: 11 of 14
]
LATE_IMAGE_TOKENS = 5 + 2 + 4  # images with text before them in their sample


@pytest.fixture(scope="module")
def volumes():
    return run_on_ranks(attention_cases.comm_volume, P, CASES, timeout=120)


def _ring_expected(r, text, kv_heads, backward):
    """Exact P2P batches of rank r: text K/V only (bf16), dK/dV in float32."""
    def batch(send_owner, recv_owner, itemsize):
        ops = []
        if text[send_owner]:
            ops.append(("isend", 2 * text[send_owner] * kv_heads * D * itemsize, (r + 1) % P))
        if text[recv_owner]:
            ops.append(("irecv", 2 * text[recv_owner] * kv_heads * D * itemsize, (r - 1) % P))
        return ops
    out = []
    for s in range(P):
        if s + 1 < P:
            out.append(batch((r - s) % P, (r - s - 1) % P, 2))
        if backward and s >= 1:
            out.append(batch((r - s) % P, (r - s - 1) % P, 4))
    return out


@pytest.mark.parametrize("case", [0, 1, 6])
def test_ring_sends_exactly_the_text_kv_once_per_step(volumes, case):
    kv_heads = CASES[case][3]
    for r, per_case in enumerate(volumes):
        fwd, bwd, text, _ = per_case[case]
        assert all(kind == "p2p" for kind, *_ in fwd + bwd), (fwd, bwd)
        got_fwd = [[(op, n, peer) for op, n, peer, _ in e[1]] for e in fwd]
        got_bwd = [[(op, n, peer) for op, n, peer, _ in e[1]] for e in bwd]
        assert got_fwd == _ring_expected(r, text, kv_heads, backward=False)
        assert got_bwd == _ring_expected(r, text, kv_heads, backward=True)
        assert len(fwd) == P - 1 and len(bwd) == 2 * (P - 1)


@pytest.mark.parametrize("case", [0, 1, 6])
def test_ring_bytes_sent_formula_matches_the_messages(volumes, case):
    for per_case in volumes:
        fwd, bwd, _, (pred_fwd, pred_bwd) = per_case[case]
        sent = lambda entries: sum(n for e in entries for op, n, *_ in e[1] if op == "isend")  # noqa: E731
        assert (sent(fwd), sent(bwd)) == (pred_fwd, pred_bwd)
        assert pred_fwd > 0


@pytest.mark.parametrize("case,kv", [(2, 3), (3, 6), (4, 6), (5, 3)])
def test_ulysses_all_to_all_volume_is_exact(volumes, case, kv):
    """Text Q, K, V go out and outputs come back; K/V heads travel repeated up to lcm(kv_heads, P)."""
    heads = CASES[case][2]
    for r, per_case in enumerate(volumes):
        fwd, bwd, text, _ = per_case[case]
        T, total = text[r], sum(text)
        qkv = (heads + 2 * kv) * D
        assert fwd == [("a2a", T * qkv, total * qkv // P, "torch.bfloat16"),
                       ("a2a", total * heads * D // P, T * heads * D, "torch.bfloat16")]
        assert bwd == [("a2a", T * heads * D, total * heads * D // P, "torch.bfloat16"),
                       ("a2a", total * qkv // P, T * qkv, "torch.bfloat16")]


def test_ulysses_images_after_text_add_one_all_gather_over_heads(volumes):
    """Images after text are computed per head slice in the gathered row and all-gathered over
    heads (backward: the dual reduce-scatter); an image opening its sample stays local."""
    heads, kv = CASES[7][2], CASES[7][3]
    for r, per_case in enumerate(volumes):
        fwd, bwd, text, _ = per_case[7]
        T, total = text[r], sum(text)
        qkv = (heads + 2 * kv) * D
        gathered = LATE_IMAGE_TOKENS * heads * D
        # (all-gather sizes are bf16 elements; the uneven all-gather pads nothing here)
        assert fwd == [("a2a", T * qkv, total * qkv // P, "torch.bfloat16"),
                       ("a2a", total * heads * D // P, T * heads * D, "torch.bfloat16"),
                       ("ag", gathered // P, gathered)]
        assert bwd[0] == ("rs", gathered, gathered // P)
        assert bwd[1:] == [("a2a", T * heads * D, total * heads * D // P, "torch.bfloat16"),
                           ("a2a", total * qkv // P, T * qkv, "torch.bfloat16")]


def test_p1_communicates_nothing():
    (errs,) = run_on_ranks(attention_cases.no_comm_at_p1, 1, timeout=60)
    assert len(errs) == 2 and max(errs) < 1e-12, errs


def test_bad_input_fails_clearly_before_any_communication():
    expected = {
        "tokens": ("ValueError", "shard has"), "gqa": ("ValueError", "multiple of kv_heads"),
        "dtype": ("TypeError", "share a dtype"), "cp_size": ("ValueError", "planned for cp_size=4"),
        "rank": ("ValueError", "shard is rank"), "ulysses_heads": ("ValueError", "heads divisible"),
        "backend": ("ValueError", "'tree'"), "image_attention": ("ValueError", "'full'"),
        "scale": ("ValueError", "-1.0"), "kv_shape": ("ValueError", "same tokens and heads"),
    }
    for per_rank in run_on_ranks(attention_cases.bad_inputs, P, timeout=60):
        for label, kind, message in per_rank:
            assert kind == expected[label][0], (label, kind, message)
            assert expected[label][1] in message, (label, message)


def test_ring_comm_guards_against_misuse():
    for raised, got, expect in run_on_ranks(attention_cases.ring_comm_guards, 2, timeout=60):
        assert [label for label, _ in raised] == ["wait", "commit", "in_flight"]
        assert got == expect
