"""The gated delta rule's kernel choice (Note [vlmcp gated delta rule: the kernel choice]).

CPU: ``"auto"`` picks the torch kernel off CUDA, an unknown name and ``"fla"`` without
flash-linear-attention raise clearly. GPU (``-m gpu``, skipped without CUDA or fla): fla's
Triton kernel against the torch kernel on a packed row with initial states (outputs, final
states, gradients of every input incl. the initial state), ``segment_maps`` and the CP op
on one GPU.
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch.nn import functional as F

import vlmcp
from tests.gdn_cases import row
from vlmcp.mixers import chunk_gated_delta_rule, gated_delta_rule_cp, segment_maps
from vlmcp.mixers import delta_rule as D


@pytest.fixture
def no_fla(monkeypatch):
    """flash-linear-attention made unimportable (``import fla`` raises ImportError)."""
    D._fla_kernel.cache_clear()
    monkeypatch.setitem(sys.modules, "fla", None)
    monkeypatch.setitem(sys.modules, "fla.ops", None)
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", None)
    yield
    D._fla_kernel.cache_clear()


def _inputs(T=40, hk=2, hv=4, k=8, v=6, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).to(device)

    return {"q": rand(T, hk, k), "k": rand(T, hk, k), "v": rand(T, hv, v),
            "g": F.logsigmoid(rand(T, hv) + 2.0), "beta": torch.sigmoid(rand(T, hv))}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_auto_and_torch_pick_the_torch_kernel_on_cpu(dtype):
    assert D.select_kernel("auto", "cpu", dtype) == "torch"
    assert D.select_kernel("torch", "cpu", dtype) == "torch"


def test_auto_picks_torch_for_float64_and_without_fla_on_cuda(no_fla):
    assert D.select_kernel("auto", "cuda", torch.float64) == "torch"
    assert D.select_kernel("auto", "cuda", torch.bfloat16) == "torch"  # fla missing


def test_unknown_kernel_raises():
    with pytest.raises(ValueError, match="one of"):
        D.select_kernel("triton", "cpu", torch.float32)
    t = _inputs(T=4)
    with pytest.raises(ValueError, match="one of"):
        chunk_gated_delta_rule(*t.values(), torch.tensor([0, 4]), kernel="triton")


def test_fla_without_the_package_names_the_install(no_fla):
    t = _inputs(T=4)
    for call in (lambda: D.select_kernel("fla", "cuda", torch.bfloat16),
                 lambda: chunk_gated_delta_rule(*t.values(), torch.tensor([0, 4]), kernel="fla"),
                 lambda: segment_maps(*t.values(), torch.tensor([0, 4]), torch.tensor([False]),
                                      kernel="fla")):
        with pytest.raises(ImportError, match="pip install flash-linear-attention"):
            call()


def test_fla_on_cpu_tensors_raises_when_installed():
    if D._fla_kernel() is None:
        pytest.skip("flash-linear-attention not installed")
    with pytest.raises(ValueError, match="CUDA"):
        D.select_kernel("fla", "cpu", torch.float32)


def test_auto_on_cpu_equals_torch_kernel():
    t = _inputs()
    cu = torch.tensor([0, 13, 13, 40])
    init = torch.randn(3, 4, 8, 6)
    a = chunk_gated_delta_rule(*t.values(), cu, init, chunk_size=16)
    b = chunk_gated_delta_rule(*t.values(), cu, init, chunk_size=16, kernel="torch")
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_fla_wrapper_with_a_stand_in_kernel(monkeypatch):
    """The wrapper's conventions on CPU: fla's signature served by the torch kernel (layout, empties)."""
    calls = []

    def fake_fla(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None):
        assert q.dim() == 4 and q.shape[0] == 1 and output_final_state
        assert initial_state.dtype == torch.float32
        assert bool((cu_seqlens[1:] > cu_seqlens[:-1]).all())  # no empty segments reach fla
        calls.append(cu_seqlens.tolist())
        o, s = D.chunk_gated_delta_rule(q[0], k[0], v[0], g[0], beta[0], cu_seqlens_cpu, initial_state,
                                        scale=scale, use_qk_l2norm=use_qk_l2norm_in_kernel, kernel="torch")
        return o[None], s

    monkeypatch.setattr(D, "_fla_kernel", lambda: fake_fla)
    monkeypatch.setattr(D, "select_kernel", lambda kernel, *_: kernel if kernel == "torch" else "fla")
    t = _inputs()
    cu = torch.tensor([0, 13, 13, 40, 40])
    init = torch.randn(4, 4, 8, 6)
    a = chunk_gated_delta_rule(*t.values(), cu, init, use_qk_l2norm=True)
    monkeypatch.undo()
    ref = chunk_gated_delta_rule(*t.values(), cu, init, use_qk_l2norm=True, kernel="torch")
    assert calls == [[0, 13, 40]]
    for x, y in zip(a, ref, strict=True):
        torch.testing.assert_close(x, y)


def test_hf_prepare_validates_and_records_the_kernel():
    from vlmcp.hf.layers import gdn

    m = torch.nn.Module()
    with pytest.raises(ValueError, match="one of"):
        gdn.prepare(m, kernel="triton")
    with pytest.raises(ValueError, match="in_proj_qkv"):  # the kernel is recorded, the layout still checked
        gdn.prepare(m, kernel="torch")
    assert getattr(m, gdn._KERNEL) == "torch"


# --------------------------------------------------------------------------- GPU: fla vs torch

needs_fla = [pytest.mark.gpu,
             pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
             pytest.mark.skipif(torch.cuda.is_available() and D._fla_kernel() is None,
                                reason="needs flash-linear-attention")]
# fla computes in float32 with tf32/bf16 tensor-core products: relative to the tensors' scale
GPU_TOL = {torch.float32: 5e-3, torch.bfloat16: 5e-2}


def _close(a, b, tol, what):
    err = (a.double() - b.double()).abs().max().item()
    scale = b.double().abs().max().item() + 1e-6
    assert err <= tol * scale, f"{what}: max |fla - torch| = {err:.3g} > {tol} x {scale:.3g}"


def _grads(kernel, t, cu, init, dout, dstate, use_qk_l2norm):
    leaves = {n: x.detach().clone().requires_grad_() for n, x in t.items()}
    h0 = init.detach().clone().requires_grad_()
    out, final = chunk_gated_delta_rule(*leaves.values(), cu, h0, kernel=kernel, use_qk_l2norm=use_qk_l2norm)
    ((out.float() * dout).sum() + (final * dstate).sum()).backward()
    return out, final, {**{n: x.grad for n, x in leaves.items()}, "initial_state": h0.grad}


def _apply(marks):
    def deco(fn):
        for m in reversed(marks):
            fn = m(fn)
        return fn
    return deco


@_apply(needs_fla)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hk,hv,kd,vd", [(2, 4, 64, 64), (2, 2, 128, 128)])
def test_fla_matches_torch_kernel(dtype, hk, hv, kd, vd):
    lens = [70, 0, 200, 1, 129]  # an empty segment, a one-token one, partial chunks
    cu = F.pad(torch.cumsum(torch.tensor(lens), 0), (1, 0))
    T = int(cu[-1])
    t = _inputs(T, hk, hv, kd, vd, dtype, "cuda", seed=1)
    gen = torch.Generator().manual_seed(2)
    init = (torch.randn(len(lens), hv, kd, vd, generator=gen) * 0.1).cuda()
    dout = torch.randn(T, hv, vd, generator=gen).cuda()
    dstate = torch.randn(len(lens), hv, kd, vd, generator=gen).cuda()
    assert D.select_kernel("auto", "cuda", dtype) == "fla"
    o_f, s_f, g_f = _grads("fla", t, cu, init, dout, dstate, True)
    o_t, s_t, g_t = _grads("torch", t, cu, init, dout, dstate, True)
    assert o_f.dtype == o_t.dtype == dtype and s_f.dtype == s_t.dtype == torch.float32
    tol = GPU_TOL[dtype]
    _close(o_f, o_t, tol, "out")
    _close(s_f, s_t, tol, "final state")
    assert torch.equal(s_f[1], init[1])  # the empty segment passes its state through
    for n in g_t:
        _close(g_f[n], g_t[n], 2 * tol, f"d{n}")


@_apply(needs_fla)
def test_fla_segment_maps_match_torch():
    lens = [90, 64, 33, 150]
    cu = F.pad(torch.cumsum(torch.tensor(lens), 0), (1, 0))
    t = _inputs(int(cu[-1]), 2, 4, 64, 64, torch.float32, "cuda", seed=3)
    fresh = torch.tensor([True, False, False, True])
    a = segment_maps(*t.values(), cu, fresh, use_qk_l2norm=True, kernel="fla")
    b = segment_maps(*t.values(), cu, fresh, use_qk_l2norm=True, kernel="torch")
    for name, x, y in zip(a._fields, a, b, strict=True):
        _close(x, y, GPU_TOL[torch.float32], name)


@_apply(needs_fla)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fla_cp_op_on_one_gpu_matches_torch(dtype):
    is_image, cu = row([[("t", 60), ("i", 48), ("t", 90)], [("t", 130)], [("i", 24), ("t", 70)]])
    shard = vlmcp.plan_cp(is_image, 1, cu).for_rank(0)
    t = _inputs(shard.num_tokens, 2, 4, 64, 64, dtype, "cuda", seed=4)
    dout = torch.randn(shard.num_tokens, 4, 64, generator=torch.Generator().manual_seed(5)).cuda()
    results = {}
    for kernel in ("fla", "torch"):
        leaves = {n: x.detach().clone().requires_grad_() for n, x in t.items()}
        out = gated_delta_rule_cp(*leaves.values(), shard, None, use_qk_l2norm=True, kernel=kernel)
        (out.float() * dout).sum().backward()
        results[kernel] = (out, {n: x.grad for n, x in leaves.items()})
    tol = GPU_TOL[dtype]
    _close(results["fla"][0], results["torch"][0], tol, "out")
    for n in t:
        _close(results["fla"][1][n], results["torch"][1][n], 2 * tol, f"d{n}")
