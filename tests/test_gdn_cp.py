"""Gated DeltaNet under CP (vlmcp.mixers): the chunked kernel, the segments, the CP ops and their bytes.

The kernel is checked against transformers' own ``torch_chunk_gated_delta_rule`` and
``torch_recurrent_gated_delta_rule`` (run in float64 by :func:`vlmcp.debug.float64.in_dtype`);
the CP ops on gloo ranks against the single-process ops on the global row (one spawned
group per P runs the grid of tests/gdn_cases.py).
"""

from __future__ import annotations

import pytest
import torch

import vlmcp
from tests import gdn_cases
from tests.gdn_cases import HV, K, V, row
from vlmcp.mixers import chunk_gated_delta_rule, row_segments, segment_layout, segment_maps
from vlmcp.testing import run_on_ranks

PACKED = [[("t", 60), ("i", 48), ("t", 90), ("i", 32), ("t", 140)],  # two images, text between
          [("t", 250)],                                               # text only
          [("i", 24), ("t", 180)]]                                    # starts with an image
TINY = [[("t", 5), ("i", 8), ("t", 3)], [("t", 2)], [("t", 9)]]     # chunks shorter than the conv halo
TEXT = [[("t", 300)], [("t", 170)]]


def _case(samples, dtype="float64", **layout):
    return {"samples": samples, "dtype": dtype, **layout}


GRIDS = {
    2: [_case(PACKED), _case(TINY), _case(TEXT), _case(PACKED, placement="whole"),
        _case(PACKED, placement="auto"), _case(PACKED, "float32")],
    3: [_case(PACKED), _case(TINY), _case(PACKED, strategy="shard")],
    4: [_case(PACKED), _case(TEXT)],
}
BYTE_ROWS = [[[("t", 512)], [("t", 512)]], [[("t", 4096)], [("t", 4096)]],     # 1k and 8k text tokens
             [[("t", 160), ("i", 16), ("t", 288)], [("t", 560)]],             # 1k with an image
             [[("t", 1280), ("i", 16), ("t", 2416)], [("t", 4480)]]]          # 8k, same structure
TOL = {"float64": 1e-12, "float32": 2e-5}


@pytest.fixture(scope="module")
def grids():
    return {P: run_on_ranks(gdn_cases.suite, P, GRIDS[P], BYTE_ROWS if P < 4 else None, timeout=240)[0]
            for P in GRIDS}


@pytest.mark.parametrize("P", sorted(GRIDS))
def test_cp_ops_match_one_process(grids, P):
    """Outputs and the gradients of q, k, v, g, beta (bare rule) and of the conv input, weight and bias
    (conv + silu + rule: state passing, and the Ulysses road), summed over ranks, equal one process on the
    global row."""
    results = grids[P]["parity"]
    assert len(results) == 3 * len(GRIDS[P])
    bad = []
    for r in results:
        errs = {k: v for k, v in r.items() if k == "out" or k.startswith("grad_")}
        if max(errs.values()) > TOL[r["dtype"]] or r["pad_out"] != 0.0:
            bad.append(r)
    assert not bad, bad
    assert {r["op"] for r in results} == {"rule", "layer", "ulysses"}


@pytest.mark.parametrize("P", [2, 3])
def test_exchange_bytes_do_not_grow_with_length(grids, P):
    """One all-gather per op in forward, one reduce-scatter each in backward; the same bytes at 1k and
    8k tokens; the maps' bytes are exactly P x max(maps per rank) x Hv x K x (K + V) x 8."""
    rows = grids[P]["bytes"]
    assert [r["L"] for r in rows] == [1024, 8192, 1024, 8192]
    for r in rows:
        kinds = [c[0] for c in r["calls"]]
        assert sorted(kinds) == ["all_gather", "all_gather", "reduce_scatter", "reduce_scatter"], r
        maps = [c for c in r["calls"] if len(c[1]) == 4]  # (maps, Hv, K, K + V)
        assert [c[1][1:] for c in maps] == [(HV, K, K + V)] * 2
        assert all(c[2] == r["map_bytes"] for c in maps if c[0] == "all_gather")
    for short, long in ((rows[0], rows[1]), (rows[2], rows[3])):
        assert [c[2] for c in short["calls"]] == [c[2] for c in long["calls"]]
    # two text-only samples: P=2 -> segments [r0][r1 r1][r0] each, maps of the first two travel;
    # P=3 -> [r0][r1][r2 r2][r1][r0], the first four travel (rank 1 sends two per sample)
    per_rank = {2: (2, 2), 3: (2, 4, 2)}[P]
    assert rows[0]["export_sizes"] == per_rank
    assert rows[0]["map_bytes"] == P * max(per_rank) * HV * K * (K + V) * 8
    halo = [c for c in rows[0]["calls"] if len(c[1]) == 2 and c[0] == "all_gather"]
    # the conv halo: 3 rows per rank boundary; P=2: each rank sends 3 per sample; P=3: rank 1 sends 6
    assert halo[0][2] == P * {2: 6, 3: 12}[P] * gdn_cases.CONV * 8


# --- one process -------------------------------------------------------------------------------


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _inputs(T, hk=2, hv=4, k=8, v=6, seed=0):
    q, kk, vv = _rand(T, hk, k, seed=seed), _rand(T, hk, k, seed=seed + 1), _rand(T, hv, v, seed=seed + 2)
    g = torch.nn.functional.logsigmoid(_rand(T, hv, seed=seed + 3) + 2)
    beta = torch.sigmoid(_rand(T, hv, seed=seed + 4))
    return [x.requires_grad_() for x in (q, kk, vv, g, beta)]


def _hf_kernels(dtype):
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    from vlmcp.debug.float64 import in_dtype

    kernels = (m.torch_chunk_gated_delta_rule, m.torch_recurrent_gated_delta_rule)
    return tuple(in_dtype(f, dtype) for f in kernels)


@pytest.mark.parametrize("chunk", [16, 64])
def test_kernel_matches_transformers_float64(chunk):
    """Outputs, final state and every gradient (initial state included) against transformers' chunked and
    recurrent kernels, in float64; GQA (2 q/k heads for 4 value heads), length not a multiple of the chunk."""
    pytest.importorskip("transformers")
    T = 150
    inputs = _inputs(T)
    s0 = _rand(1, 4, 8, 6, seed=9).requires_grad_()
    dout, dstate = _rand(T, 4, 6, seed=10), _rand(4, 8, 6, seed=11)
    mine = chunk_gated_delta_rule(*inputs, torch.tensor([0, T]), s0, chunk_size=chunk, use_qk_l2norm=True)
    (mine[0] * dout).sum().add((mine[1][0] * dstate).sum()).backward()
    want = [x.grad.clone() for x in inputs + [s0]]
    for kernel in _hf_kernels(torch.float64):
        for x in inputs + [s0]:
            x.grad = None
        kw = {"chunk_size": chunk} if "chunk" in kernel.__name__ else {}
        o, final = kernel(*(x[None] for x in inputs), initial_state=s0, output_final_state=True,
                          use_qk_l2norm_in_kernel=True, **kw)
        assert o.dtype == torch.float64
        assert (o[0] - mine[0]).abs().max() < 1e-13 and (final - mine[1]).abs().max() < 1e-13
        (o[0] * dout).sum().add((final[0] * dstate).sum()).backward()
        for w, x in zip(want, inputs + [s0], strict=True):
            assert (w - x.grad).abs().max() <= 1e-12 * w.abs().max()


def test_kernel_matches_transformers_float32():
    """In float32 (transformers as shipped): the same to float32 rounding."""
    pytest.importorskip("transformers")
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    T = 100
    inputs = [x.detach().float() for x in _inputs(T)]
    o, final = chunk_gated_delta_rule(*inputs, torch.tensor([0, T]), use_qk_l2norm=True)
    ref, ref_final = m.torch_chunk_gated_delta_rule(*(x[None] for x in inputs), output_final_state=True,
                                                    use_qk_l2norm_in_kernel=True)
    assert o.dtype == final.dtype == torch.float32
    assert (o - ref[0]).abs().max() < 1e-5 and (final - ref_final).abs().max() < 1e-5


def test_packed_segments_reset_and_keep_their_states():
    """Segments of a packed row (one empty) equal each segment run alone; per-segment initial states."""
    T = 140
    cu = torch.tensor([0, 40, 40, 97, 140])
    inputs = [x.detach() for x in _inputs(T)]
    s0 = _rand(4, 4, 8, 6, seed=5)
    o, final = chunk_gated_delta_rule(*inputs, cu, s0, chunk_size=16)
    for s in range(4):
        a, b = int(cu[s]), int(cu[s + 1])
        alone = chunk_gated_delta_rule(*(x[a:b] for x in inputs), torch.tensor([0, b - a]), s0[s:s + 1],
                                       chunk_size=16)
        assert torch.allclose(o[a:b], alone[0], atol=1e-14, rtol=0)
        assert torch.allclose(final[s], alone[1][0], atol=1e-14, rtol=0)
    assert torch.equal(final[1], s0[1])  # an empty segment keeps its state


def test_segment_maps_are_the_affine_maps():
    """[M | U] and R: S_out = M S_in + U and o = O0 + S_in^T R for any S_in; fresh segments give U and O0."""
    T = 130
    cu = torch.tensor([0, 30, 90, 130])
    inputs = [x.detach() for x in _inputs(T)]
    fresh = torch.tensor([True, False, False])
    sm = segment_maps(*inputs, cu, fresh, chunk_size=16, use_qk_l2norm=True)
    for s in range(3):
        a, b = int(cu[s]), int(cu[s + 1])
        S = torch.zeros(1, 4, 8, 6, dtype=torch.float64) if fresh[s] else _rand(1, 4, 8, 6, seed=s)
        o, final = chunk_gated_delta_rule(*(x[a:b] for x in inputs), torch.tensor([0, b - a]), S,
                                          chunk_size=16, use_qk_l2norm=True)
        M, U = sm.maps[s, ..., :8], sm.maps[s, ..., 8:]
        assert torch.allclose(M @ S[0] + U, final[0], atol=1e-13, rtol=0)
        read = torch.einsum("thk,hkv->thv", sm.read[a:b], S[0])
        assert torch.allclose(sm.out0[a:b] + read, o, atol=1e-13, rtol=0)
        if fresh[s]:
            assert not M.any() and not sm.read[a:b].any()


def test_row_segments_of_the_note():
    """Note [vlmcp gated delta rule under CP: the segment schedule]: P=2, a prompt, an image, text."""
    is_image, cu = row([[("t", 2), ("i", 3), ("t", 14)]])
    plan = vlmcp.plan_cp(is_image, 2, cu)
    segs = row_segments(plan.for_rank(0))
    assert segs.owners.tolist()[:2] == [0, -1]  # the prompt is in rank 0's first chunk, then the image
    assert segs.first.tolist() == [True] + [False] * (segs.num_segments - 1)
    assert segs.last.tolist() == [False] * (segs.num_segments - 1) + [True]
    assert segs.exported.tolist() == [o >= 0 for o in segs.owners.tolist()[:-1]] + [False]
    lay0, lay1 = segment_layout(plan.for_rank(0)), segment_layout(plan.for_rank(1))
    assert lay0.export_sizes == lay1.export_sizes
    assert lay1.fresh.tolist()[0] is False  # rank 1 holds no sample start: the image is its first segment


def test_whole_samples_never_communicate():
    is_image, cu = row(PACKED)
    plan = vlmcp.plan_cp(is_image, 2, cu, sample_placement="whole")
    for shard in plan.shards():
        lay = segment_layout(shard)
        assert lay.export_sizes == (0, 0) and bool(lay.fresh.all()) and lay.scan == ()
