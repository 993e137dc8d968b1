"""The CUDA path, checked against what the PyTorch and flash-attn sources say (issue 12, section 4).

CPU tests drive the CUDA kernels through stand-ins of the ops they call: the two
memory-efficient aten ops and flash-attn >= 2.7's varlen functions (as
``torch.library.custom_op`` objects, like the real ones on torch >= 2.4). The
stand-ins compute attention in pure torch and enforce the real kernels' contracts
(Note [vlmcp CUDA kernel contracts] in :mod:`vlmcp.attention.kernels`): the row stride
the memory-efficient backward assumes for ``out``, the lse layout, the dtypes. GPU
tests (``-m gpu``) run the real kernels against the math kernel and float64, the
single-process CP path on CUDA, and NCCL ring/Ulysses parity through torchrun on every
local GPU (this file is also the torchrun worker: ``python -m torch.distributed.run
--nproc-per-node N -m tests.test_cuda_review OUT.json``).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch
import torch.distributed as dist
import torch.distributed.tensor  # noqa: F401 - registers DTensor rules on the aten ops before `sdpa` patches them

import vlmcp
from vlmcp.attention import cp_attention, reference_attention, varlen_attention
from vlmcp.attention import kernels as K
from vlmcp.attention.exchange import exchange_of
from vlmcp.attention.masks import Block, MaskKind, dense_mask
from vlmcp.attention.ring_comm import RingComm
from vlmcp.testing import run_on_ranks

CUDA = torch.cuda.is_available()
gpu = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA device")]

# (block, lq, lk): lengths above 32 so the memory-efficient lse padding is exercised
BLOCKS = [
    (Block(0, 40, 0, 40, MaskKind.FULL), 40, 40),
    (Block(0, 40, 0, 40, MaskKind.CAUSAL), 40, 40),
    (Block(0, 45, 0, 33, MaskKind.CAUSAL), 45, 33),
    (Block(0, 33, 0, 45, MaskKind.CAUSAL), 33, 45),
    # queries at offsets 0..39 against keys at offsets 7..46 (image span 3): rows 0..6 see nothing
    (Block(0, 40, 0, 40, MaskKind.MASKED, 0, 7, 3), 40, 40),
]


# ---------------------------------------------------------------- stand-ins for the CUDA ops


def _attend(q, k, v, scale, allowed, bias=None, lse=None):
    """Dense attention in float32/64 on ``(B, H, M, K)`` tensors; returns (out, lse, p)."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias.to(acc)
    s = s.masked_fill(~allowed, float("-inf"))
    if lse is None:
        lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.to(acc).unsqueeze(-1)).nan_to_num(0.0)
    return torch.matmul(p, v.to(acc)), lse, p


class SdpaStandIn:
    """``aten._scaled_dot_product_efficient_attention`` and its backward, on the CPU.

    Layouts as in ``attention.cu`` / ``attention_backward.cu``: the forward allocates
    ``out`` as ``(B, M, H, K)`` and returns it transposed; ``lse`` is ``(B, H, ceil(M/32)*32)``
    padded with ``+inf``, 0 for a row that saw no key. The backward refuses an ``out``
    whose row stride is not ``num_heads * head_dim`` (``Params::o_strideM``) and records
    what it was given.
    """

    def __init__(self):
        self.backward_calls: list[dict] = []

    @staticmethod
    def _allowed(is_causal, m, n, device):
        return (torch.ones(m, n, dtype=torch.bool, device=device).tril() if is_causal
                else torch.ones(m, n, dtype=torch.bool, device=device))

    def forward(self, query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                *, scale=None):
        if query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise RuntimeError("Only fp32, half & bf16 supported at the moment")  # DISPATCH_TYPES
        B, H, M, D = query.shape
        allowed = self._allowed(is_causal, M, key.shape[2], query.device)
        out, lse, _ = _attend(query, key, value, scale, allowed, attn_bias)
        dead = torch.isneginf(lse)
        bmhk = out.nan_to_num(0.0).to(query.dtype).transpose(1, 2).contiguous()
        padded = torch.full((B, H, math.ceil(M / 32) * 32), float("inf"))
        padded[..., :M] = lse.float().masked_fill(dead, 0.0)
        seed = torch.zeros((), dtype=torch.int64)
        return bmhk.transpose(1, 2), padded, seed, seed.clone()

    def backward(self, grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed, philox_offset,
                 dropout_p, grad_input_mask, is_causal=False, *, scale=None):
        B, H, M, D = query.shape
        out_t, gout_t = out.transpose(1, 2), grad_out.transpose(1, 2)  # what the kernel indexes
        self.backward_calls.append({"out_stride": out_t.stride(), "dout_contiguous": gout_t.is_contiguous(),
                                    "lse": logsumexp.clone(), "grad_out": grad_out.clone(),
                                    "heads": H, "head_dim": D})
        if out_t.stride(1) != H * out_t.shape[3] or out_t.stride(3) != 1:
            raise AssertionError(f"o_strideM = num_heads * head_dim = {H * D}, but out has row stride "
                                 f"{out_t.stride(1)}: the kernel would read the wrong rows")
        assert logsumexp.shape == (B, H, math.ceil(M / 32) * 32), logsumexp.shape
        allowed = self._allowed(is_causal, M, key.shape[2], query.device)
        lse = logsumexp[..., :M]
        _, _, p = _attend(query, key, value, scale, allowed, attn_bias, lse)
        acc = p.dtype
        do = grad_out.to(acc)
        delta = (do * out.to(acc)).sum(-1, keepdim=True)
        ds = p * (torch.matmul(do, value.to(acc).transpose(-1, -2)) - delta)
        dq = torch.matmul(ds, key.to(acc)) * scale
        dk = torch.matmul(ds.transpose(-1, -2), query.to(acc)) * scale
        dv = torch.matmul(p.transpose(-1, -2), do)
        grads = [g.to(query.dtype).transpose(1, 2).contiguous().transpose(1, 2) for g in (dq, dk, dv)]
        self.backward_calls[-1]["dk"] = grads[1].clone()
        return (*grads, torch.empty(0))


@pytest.fixture
def sdpa(monkeypatch):
    """The stand-in patched over the aten ops the SDPA kernel calls."""
    stand_in = SdpaStandIn()
    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", stand_in.forward)
    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_efficient_attention_backward", stand_in.backward)
    return stand_in


FLASH_CALLS: list[str] = []


def _flash_check(*tensors):
    q = tensors[0]
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
    if q.shape[-1] % 8 or q.shape[-1] > 256:
        raise RuntimeError("head_size must be a multiple of 8 and at most 256")
    if any(t.stride(-1) != 1 for t in tensors):
        raise RuntimeError("Input tensor must have contiguous last dimension")


def _flash_attend(q, k, v, scale, causal, lse=None):
    """One sequence, ``(L, H, D)``, native GQA, causal aligned bottom-right (flash-attn's rule)."""
    lq, lk, g = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        allowed = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)
    qh = q.transpose(0, 1)[None]
    kh, vh = (x.repeat_interleave(g, 1).transpose(0, 1)[None] for x in (k, v))
    return _attend(qh, kh, vh, scale, allowed, None, None if lse is None else lse[None])


FLASH_VARLEN: list[tuple[str, int, bool]] = []
"""Every stand-in varlen call: (direction, number of sequences, causal)."""


def _flash_sequences(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, total_q, total_k):
    """The ``(q rows, k rows)`` slices of each packed sequence, checked as flash_api.cpp does.

    Reads the int32 boundaries through numpy (the stand-in's own host read, not the caller's).
    """
    for cu in (cu_seqlens_q, cu_seqlens_k):
        assert cu.dtype == torch.int32 and cu.dim() == 1 and cu.is_contiguous(), "cu_seqlens must be int32"
    assert cu_seqlens_q.shape == cu_seqlens_k.shape, "one k range per q range"
    a, b = cu_seqlens_q.numpy().tolist(), cu_seqlens_k.numpy().tolist()
    assert a[0] == 0 and b[0] == 0 and a[-1] == total_q and b[-1] == total_k, (a, b, total_q, total_k)
    seqs = []
    for i in range(len(a) - 1):
        lq, lk = a[i + 1] - a[i], b[i + 1] - b[i]
        assert 0 <= lq <= max_seqlen_q and 0 <= lk <= max_seqlen_k, "max_seqlen below a sequence length"
        seqs.append((slice(a[i], a[i + 1]), slice(b[i], b[i + 1])))
    return seqs


@torch.library.custom_op("vlmcp_test_flash::_flash_attn_varlen_forward", mutates_args=(), device_types="cpu")
def _flash_attn_varlen_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int, dropout_p: float, softmax_scale: float, causal: bool,
    window_size_left: int = -1, window_size_right: int = -1, softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None, return_softmax: bool = False,
    block_table: torch.Tensor | None = None, leftpad_k: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None, zero_tensors: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """flash-attn 2.8.3's signature; ``(total, H, D)`` packed sequences, each attended on its own.

    lse is ``(H, total_q)`` float32; a sequence with no key gets out 0 and lse +inf."""
    _flash_check(q, k, v)
    seqs = _flash_sequences(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q.shape[0], k.shape[0])
    FLASH_CALLS.append("forward")
    FLASH_VARLEN.append(("forward", len(seqs), causal))
    out = torch.zeros(q.shape, dtype=q.dtype)
    lse = torch.full((q.shape[1], q.shape[0]), float("inf"))
    for sq, sk in seqs:
        if sk.stop > sk.start and sq.stop > sq.start:
            o, l_, _ = _flash_attend(q[sq], k[sk], v[sk], softmax_scale, causal)
            out[sq] = o[0].transpose(0, 1).to(q.dtype)
            lse[:, sq] = l_[0].float()
    return out, lse, torch.empty(0, dtype=q.dtype), torch.zeros(2, dtype=torch.int64)


@torch.library.custom_op("vlmcp_test_flash::_flash_attn_varlen_backward", mutates_args=("dq", "dk", "dv"),
                         device_types="cpu")
def _flash_attn_varlen_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    softmax_lse: torch.Tensor, dq: torch.Tensor | None, dk: torch.Tensor | None, dv: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
    dropout_p: float, softmax_scale: float, causal: bool, window_size_left: int, window_size_right: int,
    softcap: float, alibi_slopes: torch.Tensor | None, deterministic: bool,
    rng_state: torch.Tensor | None = None, zero_tensors: bool = False,
) -> torch.Tensor:
    """flash-attn 2.8.3's signature: writes dq, dk, dv in place (per packed sequence), returns softmax_d."""
    _flash_check(dout, q, k, v, out)
    assert softmax_lse.shape == (q.shape[1], q.shape[0]) and softmax_lse.dtype == torch.float32
    seqs = _flash_sequences(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q.shape[0], k.shape[0])
    FLASH_CALLS.append("backward")
    FLASH_VARLEN.append(("backward", len(seqs), causal))
    g = q.shape[1] // k.shape[1]
    dq.zero_()
    dk.zero_()
    dv.zero_()
    delta_all = torch.zeros(q.shape[1], q.shape[0])
    for sq, sk in seqs:
        if sk.stop == sk.start or sq.stop == sq.start:
            continue
        qs, ks, vs = q[sq], k[sk], v[sk]
        _, _, p = _flash_attend(qs, ks, vs, softmax_scale, causal, softmax_lse[:, sq])
        do, o = dout[sq].transpose(0, 1)[None].to(p.dtype), out[sq].transpose(0, 1)[None].to(p.dtype)
        delta = (do * o).sum(-1, keepdim=True)
        kh, vh = (x.repeat_interleave(g, 1).transpose(0, 1)[None].to(p.dtype) for x in (ks, vs))
        ds = p * (torch.matmul(do, vh.transpose(-1, -2)) - delta)
        gq = torch.matmul(ds, kh)[0] * softmax_scale
        gk = (torch.matmul(ds.transpose(-1, -2), qs.transpose(0, 1)[None].to(p.dtype))[0] * softmax_scale)
        gv = torch.matmul(p.transpose(-1, -2), do)[0]
        dq[sq] = gq.transpose(0, 1).to(dq.dtype)
        dk[sk] = gk.unflatten(0, (k.shape[1], g)).sum(1).transpose(0, 1).to(dk.dtype)
        dv[sk] = gv.unflatten(0, (k.shape[1], g)).sum(1).transpose(0, 1).to(dv.dtype)
        delta_all[:, sq] = delta[0, ..., 0].float()
    return delta_all


@pytest.fixture
def fake_flash(monkeypatch):
    """Installs a flash-attn stand-in; returns a setter for its version string."""
    pkg, iface = types.ModuleType("flash_attn"), types.ModuleType("flash_attn.flash_attn_interface")
    iface._flash_attn_varlen_forward = _flash_attn_varlen_forward
    iface._flash_attn_varlen_backward = _flash_attn_varlen_backward
    pkg.flash_attn_interface = iface
    pkg.__version__ = "2.7.4.post1"
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", iface)
    monkeypatch.setattr(K, "_capability", lambda device: (9, 0))
    K.flash_attn_version.cache_clear()
    FLASH_CALLS.clear()
    FLASH_VARLEN.clear()

    def set_version(text):
        pkg.__version__ = text
        K.flash_attn_version.cache_clear()

    yield set_version
    K.flash_attn_version.cache_clear()


# ---------------------------------------------------------------- helpers


def _inputs(lq, lk, heads, kv_heads, d, dtype, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, lq, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(kv_heads, lk, d, generator=g, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(heads, lq, d, generator=g, dtype=torch.float64)
    return [t.to(dtype).to(device) for t in (q, k, v, dout)]


def _heads_major(x):
    """``(H, L, D)``-contiguous: the layout Ulysses and varlen_attention hand to the kernels."""
    return x.contiguous()


def _ring_layout(x):
    """``(N, H, D)`` storage seen as ``(H, N, D)``: what the ring hands to the kernels."""
    return x.transpose(0, 1).contiguous().transpose(0, 1)


def _max_err(a, b):
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def _kernel_vs_math(kernel, block, lq, lk, dtype, layout, heads=4, kv_heads=2, d=16, device="cpu"):
    """Errors of ``kernel`` against :class:`MathKernel` in float64 on the same rounded inputs.

    Returns ``{name: (kernel_error, baseline_error)}`` for out, lse, dq, dk, dv; the
    baseline is dense attention computed in ``dtype`` (flash-attention's reference).
    """
    q, k, v, dout = _inputs(lq, lk, heads, kv_heads, d, dtype, 0, device)
    scale = d ** -0.5
    ref = K.MathKernel()
    q64, k64, v64, do64 = (t.double() for t in (q, k, v, dout))
    o64, l64 = ref.forward(q64, k64, v64, block, scale)
    g64 = ref.backward(do64, q64, k64, v64, o64, l64, block, scale)
    o, lse = kernel.forward(layout(q), layout(k), layout(v), block, scale)
    out_for_bwd = layout(o64.to(dtype))
    grads = kernel.backward(layout(dout), layout(q), layout(k), layout(v), out_for_bwd, l64.float(), block,
                            scale)
    # baseline: the same attention in `dtype` by autograd, like flash-attention's tests
    seen = ~torch.isneginf(l64)
    x = [t.clone().requires_grad_() for t in (q, k, v)]
    gq = heads // kv_heads
    s = torch.matmul(x[0], x[1].repeat_interleave(gq, 0).transpose(-1, -2)) * scale
    s = s.masked_fill(~K._seen(block, lq, lk, q.device), float("-inf")).masked_fill(~seen[..., None], 0)
    base_o = torch.matmul(torch.softmax(s, -1), x[2].repeat_interleave(gq, 0))
    base_o = base_o.masked_fill(~seen[..., None], 0)
    base_g = torch.autograd.grad((base_o * dout).sum(), x)
    fin = torch.isfinite(l64)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(l64)), "rows without keys must get lse = -inf"
    errs = {"out": (_max_err(o, o64), _max_err(base_o.detach(), o64)),
            "lse": (_max_err(lse[fin], l64[fin]), 0.0)}
    for name, mine, base, truth in zip(("dq", "dk", "dv"), grads, base_g, g64, strict=True):
        assert not bool(mine.isnan().any()), f"NaN in {name}"
        errs[name] = (_max_err(mine, truth), _max_err(base, truth))
    return errs


def _assert_flash_rule(errs, dtype, atol):
    """CP/kernel error <= 2x the error of plain attention in the same dtype, plus ``atol``."""
    for name, (mine, base) in errs.items():
        assert mine <= 2 * base + atol, (name, dtype, mine, base)


# ---------------------------------------------------------------- 1. SDPA backward layouts


@pytest.mark.parametrize("layout", [_heads_major, _ring_layout], ids=["heads_major", "ring"])
def test_sdpa_backward_receives_out_and_dout_in_rows_major_layout(sdpa, layout):
    """Finding 1: the memory-efficient backward reads ``out`` with row stride H * D."""
    block, lq, lk = BLOCKS[1]
    q, k, v, dout = _inputs(lq, lk, 4, 4, 16, torch.bfloat16, 1)
    kern = K.CudaSdpaKernel()
    out, lse = kern.forward(layout(q), layout(k), layout(v), block, 0.25)
    kern.backward(layout(dout), layout(q), layout(k), layout(v), layout(out), lse, block, 0.25)
    call = sdpa.backward_calls[-1]
    assert call["out_stride"][1:] == (4 * 16, 16, 1)  # (B, L, H, D) contiguous
    assert call["dout_contiguous"]  # no copy inside _efficient_attention_backward
    # the stand-in is strict: out as (H, L, D)-contiguous (what Ulysses saves) is refused
    with pytest.raises(AssertionError, match="o_strideM"):
        sdpa.backward(dout.contiguous()[None], q[None], k[None], v[None], None, out.contiguous()[None],
                      torch.zeros(1, 4, 64), None, None, 0.0, [True] * 3 + [False], True, scale=0.25)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", range(len(BLOCKS)))
def test_sdpa_kernel_matches_math_through_the_stand_ins(sdpa, case, dtype):
    block, lq, lk = BLOCKS[case]
    errs = _kernel_vs_math(K.CudaSdpaKernel(), block, lq, lk, dtype, _heads_major)
    _assert_flash_rule(errs, dtype, atol=1e-5 if dtype == torch.float32 else 2e-3)


# ---------------------------------------------------------------- 5. lse padding and dead rows


def test_sdpa_backward_lse_is_plus_inf_in_padding_and_for_rows_without_keys(sdpa):
    block, lq, lk = BLOCKS[4]
    dead = ~dense_mask(block, lq, lk).any(-1)
    assert int(dead.sum()) == 7
    q, k, v, dout = _inputs(lq, lk, 2, 2, 8, torch.float16, 2)
    kern = K.CudaSdpaKernel()
    out, lse = kern.forward(q, k, v, block, 0.3)
    assert bool(torch.isneginf(lse[:, dead]).all()) and bool((out[:, dead] == 0).all())
    dq, dk, dv = kern.backward(dout, q, k, v, out, lse, block, 0.3)
    sent = sdpa.backward_calls[-1]["lse"][0]  # (H, 64)
    assert sent.shape == (2, 64)
    assert bool(torch.isposinf(sent[:, lq:]).all()), "padding must be +inf, as the forward writes it"
    assert bool(torch.isposinf(sent[:, :lq][:, dead]).all()), "a row without keys must get +inf, never 0"
    assert bool(torch.isfinite(sent[:, :lq][:, ~dead]).all())
    assert bool((sdpa.backward_calls[-1]["grad_out"][0][:, dead] == 0).all())
    assert not any(bool(t.isnan().any()) for t in (dq, dk, dv)) and bool((dq[:, dead] == 0).all())


@pytest.mark.parametrize("name", ["math", "flash_cpu"])
def test_cpu_kernels_take_plus_inf_for_rows_without_keys(name):
    """The one dead-row convention holds for every kernel, including the CPU ones."""
    block, lq, lk = BLOCKS[4]
    q, k, v, dout = _inputs(lq, lk, 2, 1, 8, torch.float32, 3)
    kern = K.select_kernel("cpu", torch.float32, name)
    out, lse = kern.forward(q, k, v, block, 0.3)
    grads = kern.backward(dout, q, k, v, out, lse, block, 0.3)
    ref = K.MathKernel().backward(dout, q.double(), k.double(), v.double(), out.double(), lse.double(),
                                  block, 0.3)
    for a, b in zip(grads, ref, strict=True):
        assert not bool(a.isnan().any()) and _max_err(a, b) < 1e-5


# ---------------------------------------------------------------- 7. GQA dK/dV in float32


def test_sdpa_gqa_dk_dv_are_summed_in_float32(sdpa):
    block, lq, lk = BLOCKS[0]
    q, k, v, dout = _inputs(lq, lk, 8, 2, 16, torch.bfloat16, 4)
    kern = K.CudaSdpaKernel()
    out, lse = kern.forward(q, k, v, block, 0.25)
    _, dk, dv = kern.backward(dout, q, k, v, out, lse, block, 0.25)
    per_head = sdpa.backward_calls[-1]["dk"][0]  # (8, Lk, D) bf16, one rounding per head
    assert dk.dtype == torch.float32 and dv.dtype == torch.float32 and dk.shape == (2, lk, 16)
    assert torch.equal(dk, per_head.float().unflatten(0, (2, 4)).sum(1))
    assert not torch.equal(dk, per_head.unflatten(0, (2, 4)).sum(1).float()), "bf16 sum would round again"


# ---------------------------------------------------------------- 3. float64 on CUDA


def test_float64_on_cuda_is_routed_to_the_math_kernel():
    """No CUDA call is needed to decide: the routing is a pure function of the dtype first."""
    assert K.select_kernel(torch.device("cuda", 0), torch.float64).name == "math"
    assert K.select_kernel("cuda", torch.float64, "math").name == "math"
    for cap, version in (((9, 0), (2, 8, 3)), ((7, 5), None), ((8, 0), (2, 6, 3))):
        assert K.cuda_kernel_name(torch.float64, cap, version) == "math"
        assert K.cuda_kernel_name(torch.float32, cap, version) == "sdpa"
    with pytest.raises(ValueError, match="not torch.float64"):
        K.select_kernel("cuda", torch.float64, "sdpa")
    with pytest.raises(RuntimeError, match="Only fp32, half & bf16"):  # what the real kernel says
        SdpaStandIn().forward(*(torch.zeros(1, 1, 2, 8, dtype=torch.float64),) * 3, None, True)


def test_flash_kernel_sends_float64_blocks_to_math(fake_flash, sdpa):
    block, lq, lk = BLOCKS[0]
    q, k, v, dout = _inputs(lq, lk, 2, 2, 16, torch.float64, 5)
    kern = K.FlashAttnKernel()
    out, lse = kern.forward(q, k, v, block, 0.25)
    ref_out, ref_lse = K.MathKernel().forward(q, k, v, block, 0.25)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    assert FLASH_CALLS == [] and sdpa.backward_calls == []


# ---------------------------------------------------------------- 2. and 6. flash-attn detection and gating


def test_flash_attn_is_detected_by_version_not_by_signature(fake_flash):
    """Finding 2: under torch.library.custom_op the varlen functions' signature is (*args, **kwargs)."""
    fwd = sys.modules["flash_attn.flash_attn_interface"]._flash_attn_varlen_forward
    assert "window_size_left" not in inspect.signature(fwd).parameters  # why the old check failed
    assert "window_size_left" in inspect.signature(fwd._init_fn).parameters
    assert K.flash_attn_version() == (2, 7, 4) and K.FlashAttnKernel.available()
    assert K.FlashAttnKernel().name == "flash_attn"
    fake_flash("2.6.3")
    assert not K.FlashAttnKernel.available()
    with pytest.raises(RuntimeError, match=r"flash-attn >= 2.7 \(found: 2.6.3\)"):
        K.FlashAttnKernel()


def test_missing_flash_attn_is_not_available(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # `import flash_attn` raises ImportError
    K.flash_attn_version.cache_clear()
    try:
        assert K.flash_attn_version() is None and not K.FlashAttnKernel.available()
        assert K.select_kernel("cuda", torch.bfloat16).name == "sdpa"
        with pytest.raises(RuntimeError, match="not installed"):
            K.FlashAttnKernel()
    finally:
        K.flash_attn_version.cache_clear()


def test_flash_gating_is_a_pure_function_of_dtype_head_dim_capability_and_version():
    bf16, new, old = torch.bfloat16, (2, 8, 3), (2, 7, 0)
    assert K.flash_attn_supports(bf16, 128, (8, 0), new)
    assert K.flash_attn_supports(torch.float16, 256, (9, 0), new)
    assert not K.flash_attn_supports(bf16, 264, (9, 0), new)  # head_dim > 256
    assert not K.flash_attn_supports(bf16, 60, (9, 0), new)  # not a multiple of 8
    assert not K.flash_attn_supports(torch.float32, 64, (9, 0), new)
    assert not K.flash_attn_supports(bf16, 64, (7, 5), new)  # Turing
    assert not K.flash_attn_supports(bf16, 64, (9, 0), (2, 6, 3))
    assert not K.flash_attn_supports(bf16, 64, (9, 0), None)
    assert not K.flash_attn_supports(bf16, 64, None, new)
    # sm8x or exactly sm90 up to 2.7.2; any cc_major >= 8 from 2.7.3
    for cap, before, after in (((8, 6), True, True), ((8, 9), True, True), ((9, 0), True, True),
                               ((10, 0), False, True), ((12, 0), False, True)):
        assert K.flash_attn_runs_on(cap, old) is before and K.flash_attn_runs_on(cap, (2, 7, 2)) is before
        assert K.flash_attn_runs_on(cap, (2, 7, 3)) is after and K.flash_attn_runs_on(cap, new) is after
    assert K.cuda_kernel_name(bf16, (8, 0), new) == "flash_attn"
    assert K.cuda_kernel_name(bf16, (7, 5), new) == "sdpa"
    assert K.cuda_kernel_name(bf16, (8, 0), None) == "sdpa"
    assert K._parse_version("2.7.4.post1") == (2, 7, 4) and K._parse_version("2.8.0+cu128") == (2, 8, 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flash_kernel_through_the_stand_in_matches_math(fake_flash, sdpa, dtype):
    """Square causal and full blocks go to flash-attn, the rest (and head_dim > 256) to SDPA."""
    kern = K.FlashAttnKernel()
    for (block, lq, lk), flash in zip(BLOCKS, (True, True, False, False, False), strict=True):
        FLASH_CALLS.clear()
        errs = _kernel_vs_math(kern, block, lq, lk, dtype, _ring_layout)
        _assert_flash_rule(errs, dtype, atol=2e-3)
        assert FLASH_CALLS == (["forward", "backward"] if flash else []), (block, FLASH_CALLS)
    FLASH_CALLS.clear()
    _assert_flash_rule(_kernel_vs_math(kern, *BLOCKS[0], dtype, _ring_layout, heads=2, kv_heads=1, d=264),
                       dtype, atol=2e-3)
    assert FLASH_CALLS == []


# ---------------------------------------------------------------- 4. no host reads per block


def test_cuda_kernels_never_read_device_data_on_the_host(fake_flash, sdpa, monkeypatch):
    """``bool(t)``, ``t.item()``, ``t.tolist()`` and host-built ``torch.tensor`` are syncs on CUDA."""
    kernels = [K.CudaSdpaKernel(), K.FlashAttnKernel()]
    cases = [_inputs(lq, lk, 4, 2, 16, torch.bfloat16, i) for i, (_, lq, lk) in enumerate(BLOCKS)]

    def refuse(*args, **kwargs):
        raise AssertionError("host read of a device tensor (a sync on CUDA)")

    for name in ("__bool__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    monkeypatch.setattr(torch, "tensor", refuse)
    for kern in kernels:
        for (block, _, _), (q, k, v, dout) in zip(BLOCKS, cases, strict=True):
            out, lse = kern.forward(q, k, v, block, 0.25)
            kern.backward(dout, q, k, v, out, lse, block, 0.25)
    monkeypatch.undo()
    assert torch.equal(K._cu_seqlens(7, "cpu"), torch.tensor([0, 7], dtype=torch.int32))


# ---------------------------------------------------------------- 8. NCCL: a rank with nothing to send


def ring_comm_idle_rank(group, warm_up):
    """Rank 0 sends one tensor to rank 1; rank 2 has nothing to send or receive at all."""
    from tests.attention_cases import CommLog

    rank = dist.get_rank(group)
    log = []
    for _ in range(2):  # the second RingComm on the group does not warm up again
        comm = RingComm(group, warm_up=warm_up)
        send = torch.tensor([7.0]) if rank == 0 else torch.empty(0)
        recv = torch.empty(1) if rank == 1 else torch.empty(0)
        with CommLog() as entries:
            comm.send_recv(send, recv)
            comm.commit()
            comm.wait()
        log.append(entries.entries)
    return log, recv.tolist()


@pytest.mark.parametrize("warm_up", [True, None])
def test_ring_comm_warms_the_group_up_once_and_keeps_the_p2p_messages(warm_up):
    expected = [[("p2p", [("isend", 4, 1, "torch.float32")])],
                [("p2p", [("irecv", 4, 0, "torch.float32")])], []]
    for rank, (log, recv) in enumerate(run_on_ranks(ring_comm_idle_rank, 3, warm_up, timeout=60)):
        first = [("other", "all_reduce")] if warm_up else []  # None on CPU tensors: gloo needs none
        assert log[0] == first + expected[rank], (rank, log)
        assert log[1] == expected[rank], (rank, log)
        assert recv == ([7.0] if rank == 1 else [])


def ring_with_idle_ranks(group, samples):
    """Parity and exact messages of ring attention on a row where some ranks send no K/V."""
    from tests.attention_cases import CommLog, make_row, run_case

    rank = dist.get_rank(group)
    errs = run_case(group, samples, "replicate", "ring", "causal", 2, "float64", heads=4)
    is_image, cu, ids, q, k, v, dout = make_row(samples, 4, 2, 8, 0)
    shard = vlmcp.plan_cp(is_image, dist.get_world_size(group), cu, image_ids=ids).for_rank(rank)
    lq, lk, lv = (shard.shard(t).requires_grad_() for t in (q, k, v))
    with CommLog() as fwd:
        out = cp_attention(lq, lk, lv, shard, group, "ring")
    with CommLog() as bwd:
        (out * shard.shard(dout)).sum().backward()
    return errs, fwd.entries, bwd.entries, list(exchange_of(shard).counts)


def test_ring_attention_with_ranks_that_send_nothing():
    """One text token at P = 3 (the middle band: rank 2's): ranks 0 and 1 hold only padding and the
    image; rank 1 posts no batch at the first step. Exact in float64, and each message is where the
    plan says."""
    P, samples = 3, [(2, 1)]
    results = run_on_ranks(ring_with_idle_ranks, P, samples, timeout=120)
    counts = results[0][3]
    assert counts == [0, 0, 1]
    for r, (errs, fwd, bwd, _) in enumerate(results):
        assert max(errs.values()) < 1e-10, errs

        def batch(send_owner, recv_owner, itemsize, r=r):
            per_token = 2 * 2 * 8 * itemsize  # K and V, 2 K/V heads of 8
            ops = [("isend", counts[send_owner] * per_token, (r + 1) % P)] if counts[send_owner] else []
            if counts[recv_owner]:
                ops.append(("irecv", counts[recv_owner] * per_token, (r - 1) % P))
            return ops

        want_fwd = [batch((r - s) % P, (r - s - 1) % P, 8) for s in range(P - 1)]
        want_bwd = [b for s in range(P) for b in
                    ([batch((r - s) % P, (r - s - 1) % P, 8)] if s + 1 < P else [])
                    + ([batch((r - s) % P, (r - s - 1) % P, 8)] if s >= 1 else [])]
        got = lambda entries: [[(op, n, peer) for op, n, peer, _ in e[1]] for e in entries]  # noqa: E731
        assert all(kind == "p2p" for kind, *_ in fwd + bwd)
        assert got(fwd) == [b for b in want_fwd if b] and got(bwd) == [b for b in want_bwd if b]
    assert len(results[1][1]) == P - 2  # rank 1 posted no batch at step 0


# ---------------------------------------------------------------- GPU: the real kernels


LOW = [(torch.float32, 1e-4), (torch.bfloat16, 1e-2), (torch.float16, 2e-3)]


@pytest.mark.parametrize("layout", [_heads_major, _ring_layout], ids=["heads_major", "ring"])
@pytest.mark.parametrize("dtype,atol", LOW, ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("name", ["sdpa", "flash_attn", "math"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_kernel_matches_math_in_float64(name, dtype, atol, layout, d):
    """Each CUDA kernel, every block kind, GQA, forward and backward: error <= 2x plain attention's."""
    if name == "flash_attn" and not K.FlashAttnKernel.available():
        pytest.skip("flash-attn >= 2.7 is not installed")
    kern = K.select_kernel("cuda", dtype, name)
    for block, lq, lk in BLOCKS:
        errs = _kernel_vs_math(kern, block, lq, lk, dtype, layout, heads=8, kv_heads=2, d=d, device="cuda")
        _assert_flash_rule(errs, dtype, atol)


@pytest.mark.parametrize("name", ["sdpa", "flash_attn"])
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_kernels_do_not_synchronize(name):
    """Finding 4 on the device: no host-device sync in any kernel call (sync debug mode errors)."""
    if name == "flash_attn" and not K.FlashAttnKernel.available():
        pytest.skip("flash-attn >= 2.7 is not installed")
    kern = K.select_kernel("cuda", torch.bfloat16, name)
    cases = [_inputs(lq, lk, 8, 2, 64, torch.bfloat16, i, "cuda") for i, (_, lq, lk) in enumerate(BLOCKS)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for (block, _, _), (q, k, v, dout) in zip(BLOCKS, cases, strict=True):
            out, lse = kern.forward(q, k, v, block, 0.125)
            kern.backward(dout, q, k, v, out, lse, block, 0.125)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def _cuda_parity(group, samples, strategy, backend, image_attention, kv_heads, dtype, device, heads=8,
                 head_dim=64, seed=0, ulysses_size=None):
    """CP attention on ``device`` against float64 on the CPU; ``{name: (cp_error, baseline_error)}``.

    The baseline is :func:`reference_attention` on the whole row in ``dtype`` on ``device``
    (flash-attention's rule: the CP error must be within 2x of it). ``group=None``: P = 1.
    """
    from tests.attention_cases import make_row, share_of

    P = 1 if group is None else dist.get_world_size(group)
    rank = 0 if group is None else dist.get_rank(group)
    is_image, cu, ids, q, k, v, dout = make_row(samples, heads, kv_heads, head_dim, seed)
    q, k, v, dout = (t.to(dtype).double() for t in (q, k, v, dout))
    truth = _dense(q, k, v, dout, is_image, cu, image_attention, torch.float64, "cpu")
    base = _dense(q, k, v, dout, is_image, cu, image_attention, dtype, device)
    shard = vlmcp.plan_cp(is_image, P, cu, image_strategy=strategy, image_ids=ids).for_rank(rank)
    pos, valid, rep = shard.positions, shard.positions >= 0, shard.replicated
    lq, lk, lv = (shard.shard(t).to(dtype).to(device).requires_grad_() for t in (q, k, v))
    ldout = shard.shard(dout).to(dtype).to(device)
    ldout[rep.to(device)] *= share_of(rank, P)
    out, lse = cp_attention(lq, lk, lv, shard, group, backend, image_attention, return_lse=True,
                            ulysses_size=ulysses_size)
    grads = [g.double() for g in torch.autograd.grad((out * ldout).sum(), (lq, lk, lv))]
    for g in grads:  # share semantics: replicated tokens' gradients sum over the group
        if group is not None:
            r = g[rep.to(device)].contiguous()
            dist.all_reduce(r, group=group)
            g[rep.to(device)] = r
    errs = {}
    for i, (name, mine) in enumerate(zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads), strict=True)):
        m, t, b = mine.detach().double().cpu()[valid], truth[i][pos[valid]], base[i][pos[valid]]
        fin = torch.isfinite(t)
        assert torch.equal(torch.isfinite(m), fin), f"{name}: -inf/NaN where the reference has none"
        errs[name] = (_max_err(m[fin], t[fin]), _max_err(b[fin], t[fin]))
    return errs


def _dense(q, k, v, dout, is_image, cu, image_attention, dtype, device):
    x = [t.to(dtype).to(device).requires_grad_() for t in (q, k, v)]
    out, lse = reference_attention(*x, is_image.to(device), cu, image_attention)
    grads = torch.autograd.grad((out * dout.to(dtype).to(device)).sum(), x)
    return [t.detach().double().cpu() for t in (out, lse, *grads)]


SAMPLES = [(24, 40), (0, 17), (9, 3), (2, 1)]  # images, text of each packed sample
IDLE = [(2, 1)]  # at P >= 3 some ranks hold no travelling token: they post no batch at step 0


@pytest.mark.parametrize("dtype,atol", LOW, ids=["fp32", "bf16", "fp16"])
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_single_process_cp_and_varlen_attention_on_cuda(dtype, atol):
    """Ulysses and varlen_attention hand (H, N, D)-contiguous ``out`` to the kernels (finding 1)."""
    for backend in ("ring", "ulysses"):
        for ia in ("causal", "bidirectional"):
            errs = _cuda_parity(None, SAMPLES, "replicate", backend, ia, 2, dtype, "cuda")
            _assert_flash_rule(errs, dtype, atol)
    is_image, cu = torch.cat([torch.arange(i + t) < i for i, t in SAMPLES]), torch.tensor(
        [0] + [i + t for i, t in SAMPLES]).cumsum(0)
    L = is_image.numel()
    q, k, v = (torch.randn(L, 8, 64, dtype=torch.float64) for _ in range(3))
    x = [t.to(dtype).cuda().requires_grad_() for t in (q, k, v)]
    out, _ = varlen_attention(*x, cu, is_image)
    out.float().square().sum().backward()
    assert all(bool(torch.isfinite(t.grad).all()) for t in x)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or torch.cuda.device_count() < 2, reason="needs two or more CUDA devices")
@pytest.mark.timeout(600)
def test_nccl_ring_and_ulysses_parity_on_every_local_gpu(tmp_path):
    """torchrun on all local GPUs (NCCL): ring, Ulysses and (an even GPU count) USP with U = 2,
    replicate and shard, every low dtype; the CP error within 2x of the single-process error
    (see :func:`_torchrun_worker`)."""
    n = torch.cuda.device_count()
    out = tmp_path / "nccl.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           "-m", "tests.test_cuda_review", str(out)]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert len(results) == (2 + 2 * 2 * 2 + (2 * 2 if n % 2 == 0 else 0)) * len(LOW)
    for case in results:
        for name, (mine, base) in case["errs"].items():
            assert mine <= 2 * base + case["atol"], (case["case"], name, mine, base)


def _torchrun_worker(path: str) -> None:
    """Each rank: NCCL (gloo on a CPU-only machine) parity grid; rank 0 writes the JSON."""
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    group = dist.new_group(list(range(dist.get_world_size())))  # fresh: no collective before the ring
    heads = math.lcm(8, dist.get_world_size())  # Ulysses needs heads % P == 0
    cases = [(IDLE, strategy, "ring", "causal") for strategy in ("replicate", "shard")]  # first on the group
    cases += [(SAMPLES, strategy, backend, ia) for strategy in ("replicate", "shard")
              for backend in ("ring", "ulysses") for ia in ("causal", "bidirectional")]
    if dist.get_world_size() % 2 == 0:  # USP: Ulysses in pairs of GPUs, ring across the pairs
        cases += [(SAMPLES, strategy, "usp", ia) for strategy in ("replicate", "shard")
                  for ia in ("causal", "bidirectional")]
    results = []
    for samples, strategy, backend, ia in cases:
        usp = backend == "usp"
        for dtype, atol in LOW:
            args = (samples, strategy, backend, ia, 2, dtype, device)
            cp = _cuda_parity(group, *args, heads=heads, ulysses_size=2 if usp else None)
            one = _cuda_parity(None, *args, heads=heads, ulysses_size=1 if usp else None)
            # the single-process error: dense attention in `dtype`, or the same kernels at P = 1
            # (they round each block's dK/dV to `dtype` before the float32 sum), whichever is larger
            errs = {name: (cp[name][0], max(cp[name][1], one[name][0])) for name in cp}
            results.append({"case": [str(samples), strategy, backend, ia, str(dtype)], "atol": atol,
                            "errs": errs})
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    _torchrun_worker(sys.argv[1])
