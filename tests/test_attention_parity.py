"""CP attention against single-process attention on the whole row: out, lse, dq, dk, dv.

One spawned group per P runs the whole grid (rows of 1-4 packed samples, samples
with and without images or text, images anywhere in a sample, odd lengths, GQA, both
layouts, both backends, both image attentions, three dtypes); the tests below assert
on its results.
"""

import itertools

import pytest

from tests import attention_cases
from vlmcp.testing import run_on_ranks

ROWS = [
    [(0, 13)],                                # one text-only sample, odd length
    [(5, 7), (0, 3), (9, 1)],                 # packed: image+text, text only, one text token
    [(4, 0), (2, 9)],                         # a sample with no text at all
    [(3, 11), (0, 1), (6, 17), (2, 5)],       # four samples
    # images anywhere: text before, between and after; back to back (image_ids); ending a sample
    ["t3 i5 t4 i2 i3 t6", "t7", "t2 i6"],
    ["i2 i3 t9 i4 t1", "t5 i1 t1 i7"],
]
KV_HEADS = (12, 4, 3)  # heads = 12: MHA, GQA with kv_heads % P == 0, GQA needing K/V replication

F64 = [(rows, strategy, backend, ia, KV_HEADS[i % 3], "float64")
       for i, (rows, strategy, backend, ia) in enumerate(itertools.product(
           ROWS, ("replicate", "shard"), ("ring", "ulysses"), ("causal", "bidirectional")))]
# Ulysses with lcm(kv_heads, P) < heads K/V heads travelling (kv=2: P=3; kv=1: P=2, 3, 4)
F64 += [(ROWS[3], "replicate", "ulysses", "bidirectional", 2, "float64"),
        (ROWS[1], "shard", "ulysses", "causal", 1, "float64")]
# whole-sample placement: every sample on one rank (a rank may get none), or auto (a long sample
# split beside short whole ones, so some rank holds no whole sample); images anywhere
PLACED = ["t3 i2 t4", "t5", "i2 t3", "t2 i1 t2 i2 t1", "t9", "t1 i3 t6"]
MIXED = ["t4 i6 t90 i3 t40", "t3", "i2 t2", "t5"]
F64 += [(rows, strategy, backend, ia, 4, "float64", 0, 12, 8, placement)
        for (rows, placement), strategy, backend, ia in itertools.product(
            [(PLACED, "whole"), (MIXED, "auto"), ([(2, 3)], "whole")], ("replicate", "shard"),
            ("ring", "ulysses"), ("causal", "bidirectional"))]
F32 = [(rows, "replicate", backend, "causal", 4, "float32", 1, 12, 16)
       for rows, backend in itertools.product([ROWS[1], ROWS[4], [(16, 40)]], ("ring", "ulysses"))]
F32 += [(ROWS[3], "shard", "ring", "bidirectional", 3, "float32", 2, 12, 16)]
BF16 = [(rows, strategy, backend, "causal", 4, "bfloat16", 3, 12, 16)
        for rows, strategy, backend in [(ROWS[1], "replicate", "ring"), (ROWS[1], "replicate", "ulysses"),
                                        ([(16, 40)], "replicate", "ring"), ([(16, 40)], "shard", "ulysses")]]
NAMES = ("out", "lse", "dq", "dk", "dv")


@pytest.fixture(scope="module")
def results():
    """``{P: [(case, errs) for every case, rank]}`` (one spawn per P)."""
    out = {}
    for P in (1, 2, 3, 4):
        per_rank = run_on_ranks(attention_cases.parity_grid, P, F64 + F32 + BF16, timeout=120)
        out[P] = [item for rank in per_rank for item in rank]
    return out


def _cases(results, P, dtype):
    rows = [(case, errs) for case, errs in results[P] if case[5] == dtype]
    assert rows, "no cases ran"
    return rows


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_float64_grid_matches_within_1e_10(results, P):
    for case, errs in _cases(results, P, "float64"):
        for name in NAMES:
            assert errs[name] <= 1e-10, (P, case, name, errs[name])


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_float32_matches_within_2e_5(results, P):
    for case, errs in _cases(results, P, "float32"):
        for name in NAMES:
            assert errs[name] <= 2e-5, (P, case, name, errs[name])


def test_float32_error_does_not_grow_with_the_ring_size(results):
    """Merging in bf16 would make the error grow with P (ring-flash-attention #42)."""
    worst = {P: max(errs[n] for _, errs in _cases(results, P, "float32") for n in NAMES)
             for P in (1, 2, 3, 4)}
    assert max(worst.values()) <= 3 * worst[1], worst


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_bfloat16_within_twice_the_single_process_bfloat16_error(results, P):
    """flash-attention's rule: error vs float64 <= 2x that of a bf16 single-process computation."""
    for case, errs in _cases(results, P, "bfloat16"):
        for name in NAMES:
            base = errs["baseline"][name]
            assert errs[name] <= 2 * base + 1e-6, (P, case, name, errs[name], base)
