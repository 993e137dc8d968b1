"""Expert parallelism (vlmcp.hf.moe): exact against one process in float64, on every MoE adapter.

Note [vlmcp expert parallel: dispatch and combine] in vlmcp/hf/moe/dispatch.py; the gradient rule
EXPERT in Note [vlmcp gradient rules]. Two spawns in the default run (the W=2 grid for every arch,
and a W=4 suite); the whole W=4 grid for every arch, and FSDP2 for every arch, are ``slow``.
"""

import pytest
import torch

from tests import hf_ep_cases as cases
from vlmcp.testing import run_on_ranks

TOL = 1e-12
"""Float64: only summation orders move (the matmul's row blocking, the weight gradients summed over
the EP group's rows in another order, the expert-DP all-reduce); measured <= 5e-14."""
FAST_ARCHS = ("qwen3_vl_moe", "llama4", "nemotron_h_omni")
"""The W=4 layouts in the default run: a plain block, Llama 4's block forward, the ungated latent
experts of a hybrid model; every arch in the slow grid."""
FSDP_ARCHS = ("qwen3_vl_moe", "llama4")


def _exact(rows, fsdp=False):
    for r in rows:
        assert r["loss_rel_error"] <= TOL and r["grad"] <= TOL and r["expert_grad"] <= TOL, r
        assert r["experts"] > 0 and r["expert_pairs"] == r["routed_pairs"], r
        if not fsdp:
            assert r["norm_rel_error"] <= TOL, r


@pytest.fixture(scope="module")
def world2():
    return run_on_ranks(cases.suite2, 2, cases.ARCHS, timeout=300)


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("ep"))
    return run_on_ranks(cases.suite, 4, FAST_ARCHS, FSDP_ARCHS, tmp, timeout=400)


def test_cp2_ep2_every_arch_ring_and_ulysses(world2):
    rows = world2[0]["grid"]
    want = {(a, b) for a in cases.ARCHS for b in ("ring", "ulysses")}
    assert {(r["arch"], r["case"][3]) for r in rows} == want
    _exact(rows)
    for r in rows:
        assert r["expert_collectives"] == 0 and r["refused"] == ""  # EP = the world: nothing to sum


def test_activation_checkpointing_reruns_the_exchange(world2):
    rows = world2[0]["checkpointing"]
    _exact(rows)  # the recomputation is not counted twice in the per-expert counts either
    for r in rows:  # per MoE layer: counts + dispatch + combine, their duals, the recomputed three
        assert r["checkpointing"] and r["a2a_calls"] == 8 * r["moe_layers"], r
    for r in world2[0]["grid"]:
        if r["case"][3] == "ring":  # (Ulysses adds its own all-to-alls)
            assert r["a2a_calls"] == 5 * r["moe_layers"], r


def test_world4_layouts(world4):
    rows = world4[0]["grid"]
    assert {(r["arch"], r["case"]) for r in rows} == {
        (a, (2, 2, ep, b, False)) for a in FAST_ARCHS for ep in (4, 2) for b in ("ring", "ulysses")}
    _exact(rows)
    for r in rows:
        if r["case"][2] == 2:  # expert-DP groups of 2: one all-reduce of every local expert + one flag each
            assert r["expert_collectives"] == 1
            assert r["expert_bytes"] == (r["expert_numel"] + r["experts"]) * 8
            assert "expert-DP group of 2" in r["refused"]
        else:
            assert r["expert_collectives"] == 0


def test_text_only_row_does_not_hang(world4):
    _exact(world4[0]["text_only"])


def test_fsdp2_experts_over_the_expert_dp_group(world4):
    rows = world4[0]["fsdp"]
    _exact(rows, fsdp=True)
    for r in rows:
        assert r["expert_meshes"] == [4 // r["case"][2]] and r["expert_placements"] == ["(Shard(dim=1),)"], r


def test_dispatch_exact_and_its_collectives(world4):
    for rank, res in enumerate(world4):
        for d in res["dispatch"]:
            assert d["fwd_err"] <= 1e-15 and d["dx_err"] <= 1e-15 and d["w_err"] <= 1e-15, d
            assert d["grad_none"] == [False, False]  # rank 3 got no pair: its experts still in the graph
            ins, outs = cases.expected_splits(d["ep"], rank)
            counts, *data = d["calls"]
            assert (counts["numel"], counts["itemsize"]) == (8, 8)  # E int64 counts, equal splits
            # forward: dispatch, combine; backward: their duals (splits swapped), rows of H=16 float64
            assert [(c["in"], c["out"]) for c in data] == [(ins, outs), (outs, ins), (ins, outs), (outs, ins)]
            assert [c["numel"] * c["itemsize"] for c in data] == [sum(ins) * 128, sum(outs) * 128] * 2


def test_all_to_all_uneven_round_trip(world4):
    for res in world4:
        r = res["rows"]
        assert r["fwd"] and r["bwd"], r
        assert "in_splits (1, 1, 1, 1)" in r["bad"]


def test_checkpoint_full_experts_resume_at_another_ep(world4):
    for res in world4:
        c = res["checkpoint"]
        for key in ("gathered_exact", "shapes", "gather_order", "load_e4", "load_e1", "dcp_e4", "fsdp_e2",
                    "fsdp_e4", "fsdp_e2_dtensor", "fsdp_e4_dtensor"):
            assert c[key] is True, (key, c)
        assert c["slice_e4"] == (1, 64, 48)
        assert "expected the full (4, 64, 48)" in c["refused"]
        assert "is FSDP-sharded, but not by vlmcp.hf.moe.fully_shard_experts" in c["fsdp_over_the_world"]
        # what the helpers prevent: DCP keeps one EP rank's experts for same-named local slices
        assert c["local_dcp_lost_experts"] is True


def test_refusals_name_what_they_refuse(world2):
    r = world2[0]["refusals"]
    expect = {"unknown_class": "is a MyExperts, a routed-experts class", "module_list": "as an nn.ModuleList",
              "capacity": "capacity_factor=1.25", "bias": "has_bias=True",
              "odd_count": "must divide the 3 routed experts",
              "mixed_counts": "different expert counts [3, 4]",
              "dense": "has no routed experts", "not_a_group": "ep_group must be a ProcessGroup",
              "twice": "parallelize once"}
    for key, words in expect.items():
        assert words in r[key], (key, r[key])
        assert "\n" not in r[key]
        if key + "_unchanged" in r:
            assert r[key + "_unchanged"], key


def test_check_ep_refuses_in_one_line():
    from transformers import Qwen2MoeConfig

    from vlmcp.debug.tiny import tiny_config
    from vlmcp.hf.moe import check_ep

    moe = tiny_config("qwen3_vl_moe")
    check_ep(moe, 4, 4)
    check_ep(moe, 4, 2)
    check_ep(tiny_config("qwen3_vl"), 4, 1)  # no EP: anything goes
    capped = tiny_config("qwen3_vl_moe")
    capped.text_config.capacity_factor = 1.0
    for config, world, ep, words in (
            (moe, 6, 4, "--ep 4 must divide the world of 6 ranks"),
            (moe, 8, 8, "--ep 8 must divide the 4 routed experts of qwen3_vl_moe_text"),
            (tiny_config("qwen3_vl"), 4, 2, "has no routed experts"),
            (tiny_config("glm46v"), 2, 2, "has no routed experts"),
            (Qwen2MoeConfig(num_experts=4), 2, 2, "does not know the MoE language model 'qwen2_moe'"),
            (capped, 2, 2, "capacity_factor=1.0"),
            (moe, 2, 0, "positive int")):
        with pytest.raises(ValueError, match=None) as e:
            check_ep(config, world, ep)
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_local_kernels_and_their_choice_on_the_cpu():
    from vlmcp.hf.moe.local import grouped_mm_available, local_experts
    from vlmcp.hf.moe.registry import EXPERTS

    m = cases._experts_module()
    spec = EXPERTS[type(m).__name__]
    x = torch.randn(7, 16, dtype=torch.float64, requires_grad=True)
    counts = [2, 0, 3, 0, 0, 1, 1, 0]
    y = local_experts(m, spec, x, counts)
    ids = torch.repeat_interleave(torch.arange(8), torch.tensor(counts))[:, None]
    ref = type(m).forward.__wrapped__(m, x, ids, torch.ones(7, 1, dtype=torch.float64))
    assert torch.allclose(y, ref, rtol=0, atol=1e-15)
    assert not grouped_mm_available(x, m.gate_up_proj, m.down_proj)  # CPU / float64: the loop
    empty = local_experts(m, spec, x[:0], [0] * 8)
    empty.sum().backward()
    assert empty.shape == (0, 16) and m.gate_up_proj.grad is not None and not m.gate_up_proj.grad.any()
    with pytest.raises(ValueError, match="7 rows for expert counts"):
        local_experts(m, spec, x, [1] * 8)


gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("layout", ["hf", "transposed"])
@pytest.mark.parametrize("empty", [False, True])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_grouped_mm_matches_the_loop_on_cuda(layout, empty):
    """``torch._grouped_mm`` (bfloat16) against the per-expert loop, forward and backward, HF's
    ``(E, out, in)`` layout and Llama 4's ``(E, in, out)``, experts without rows among them (or no
    row at all: the dummy row); float32 on CUDA takes the loop."""
    from dataclasses import replace

    from vlmcp.hf.moe.local import grouped_mm_available, local_experts
    from vlmcp.hf.moe.registry import EXPERTS

    spec = EXPERTS["Qwen3VLMoeTextExperts"]
    m = cases._experts_module(num_experts=8, hidden=64, inter=32).cuda()
    if layout == "transposed":
        spec = replace(spec, transposed=True)
        m.gate_up_proj = torch.nn.Parameter(m.gate_up_proj.detach().transpose(-2, -1).contiguous())
        m.down_proj = torch.nn.Parameter(m.down_proj.detach().transpose(-2, -1).contiguous())
    m = m.to(torch.bfloat16)
    counts = [0] * 8 if empty else [5, 0, 17, 3, 0, 0, 9, 1]
    x = torch.randn(sum(counts), 64, device="cuda").to(torch.bfloat16)
    assert grouped_mm_available(x if not empty else x.new_zeros(1, 64), m.gate_up_proj, m.down_proj)
    results = []
    for kernel in ("grouped", "loop"):
        for p in m.parameters():
            p.grad = None
        xi = x.clone().requires_grad_()
        y = local_experts(m, spec, xi, counts, kernel=kernel)
        (y.float().pow(2).sum() + 0.0 * xi.sum()).backward()
        results.append([y.float(), xi.grad.float(), m.gate_up_proj.grad.float(), m.down_proj.grad.float()])
    for a, b in zip(*results, strict=True):
        assert a.shape == b.shape
        if b.numel() and b.norm() > 0:
            assert (a - b).norm() / b.norm() <= 2e-2  # bfloat16 rounding of two matmul pairs
        else:
            assert not a.any()
    x32 = x.float()
    assert not grouped_mm_available(x32, m.gate_up_proj.float(), m.down_proj.float())


@pytest.mark.slow
def test_world4_every_arch():
    rows = run_on_ranks(cases.grid, 4, cases.ARCHS, [(2, 4), (2, 2)], timeout=900)[0]
    _exact(rows)


@pytest.mark.slow
def test_fsdp2_every_arch():
    rows = run_on_ranks(cases.grid, 4, cases.ARCHS, [(2, 2), (2, 4)], ("ring", "ulysses"), True,
                        timeout=900)[0]
    _exact(rows, fsdp=True)
