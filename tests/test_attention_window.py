"""Sliding-window attention under CP (Gemma 3's sliding layers).

The mask is transformers' Gemma 3 one: ``AND(i - j < W, OR(causal, same image))``.
``cp_attention(sliding_window=W)`` against single-process attention on the whole row
(out, lse, dq, dk, dv, float64) on ring and Ulysses, both image attentions, both
vision strategies, split / whole placement, windows shorter than an image, than a
chunk and than the row, at P = 2 and 3; and the block rules on their own.
"""

import itertools

import pytest
import torch

from tests import attention_cases
from vlmcp.attention.masks import Block, MaskKind, cross_blocks, dense_mask, runs_of, windowed
from vlmcp.testing import run_on_ranks

ROWS = (["t3 i5 t4 i2 i3 t6", "t7", "t2 i6"], ["t30 i6 t25", "i4 t9"])
NAMES = ("out", "lse", "dq", "dk", "dv")


def _grid():
    cases = []
    for i, (rows, backend, ia, window) in enumerate(itertools.product(
            ROWS, ("ring", "ulysses"), ("bidirectional", "causal"), (1, 3, 7, 200))):
        cases.append(dict(samples=rows, strategy=("replicate", "shard")[i % 2], backend=backend,
                          image_attention=ia, kv_heads=(4, 3)[i % 2], dtype_name="float64",
                          sliding_window=window, kernel=(None, "math")[(i // 2) % 2]))
    cases += [dict(samples=["t3 i2 t4", "t5", "i2 t3", "t9"], strategy="replicate", backend=b,
                   image_attention="bidirectional", kv_heads=4, dtype_name="float64", sliding_window=3,
                   placement="whole") for b in ("ring", "ulysses")]
    return cases


@pytest.fixture(scope="module")
def results():
    return {P: [item for rank in run_on_ranks(attention_cases.parity_grid_kw, P, _grid(), timeout=120)
                for item in rank] for P in (2, 3)}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("P", [2, 3])
def test_sliding_window_matches_one_process(results, P):
    assert len(results[P]) == P * len(_grid())
    for case, errs in results[P]:
        bad = {n: errs[n] for n in NAMES if not errs[n] <= 1e-10}
        assert not bad, (case, bad)


def test_window_cuts_keys_and_skips_blocks_outside_it():
    # queries at offsets 10..13 against keys at 0..5: W=4 sees nothing, W=8 keys 3..5
    b = Block(0, 4, 0, 6, MaskKind.FULL, 10, 0)
    assert windowed(b, 4) is None
    w = windowed(b, 8)
    assert (w.k_start, w.k_offset, w.kind, w.window) == (3, 3, MaskKind.MASKED, 8)
    assert windowed(b, 20) == b  # wholly inside: unchanged
    assert windowed(b, 0) == b


def test_windowed_blocks_equal_the_dense_windowed_mask():
    # one sample stored in two zigzag-like chunks, with an image: every (query, key) pair
    L, W = 24, 5
    offsets = torch.tensor(list(range(0, 6)) + list(range(18, 24)))
    image = torch.full((12,), -1)
    image[1:4] = 0  # offsets 1..3
    runs = runs_of(torch.zeros(12, dtype=torch.long), offsets, image)
    blocks = cross_blocks(runs, runs, [(1, 4)], W)
    got = torch.zeros(12, 12, dtype=torch.bool)
    for b in blocks:
        m = dense_mask(b, b.q_end - b.q_start, b.k_end - b.k_start) if b.kind is MaskKind.MASKED else (
            torch.ones(b.q_end - b.q_start, b.k_end - b.k_start, dtype=torch.bool).tril()
            if b.kind is MaskKind.CAUSAL else torch.ones(b.q_end - b.q_start, b.k_end - b.k_start,
                                                         dtype=torch.bool))
        got[b.q_start:b.q_end, b.k_start:b.k_end] |= m
    x, y = offsets[:, None], offsets[None, :]
    img = (x >= 1) & (x < 4) & (y >= 1) & (y < 4)
    want = ((y <= x) | img) & (x - y < W)
    assert L == 24 and torch.equal(got, want)
