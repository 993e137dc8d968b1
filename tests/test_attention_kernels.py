"""Local attention kernels against the math reference: every mask kind, dtypes, rows that see no
key, the CUDA kernels' bias layout (checked on the CPU) and, on a GPU, the CUDA kernels."""

import pytest
import torch

from vlmcp.attention import merge_, select_kernel
from vlmcp.attention.kernels import CpuFlashKernel, CudaSdpaKernel, MathKernel
from vlmcp.attention.masks import Block, MaskKind, dense_mask

KINDS = [
    (Block(0, 6, 0, 6, MaskKind.FULL), 6, 6), (Block(0, 6, 0, 6, MaskKind.CAUSAL), 6, 6),
    (Block(0, 7, 0, 5, MaskKind.CAUSAL), 7, 5), (Block(0, 5, 0, 7, MaskKind.CAUSAL), 5, 7),
    # rows at offsets 0..5 against keys at offsets 3..8, image span 2: rows 0-2 see nothing
    (Block(0, 6, 0, 6, MaskKind.MASKED, 0, 3, 2), 6, 6),
]


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("case", range(len(KINDS)))
def test_cpu_flash_kernel_matches_math_kernel(case, dtype, tol):
    block, lq, lk = KINDS[case]
    g = torch.Generator().manual_seed(case)
    q = torch.randn(4, lq, 8, generator=g, dtype=torch.float64).to(dtype)
    k, v = (torch.randn(2, lk, 8, generator=g, dtype=torch.float64).to(dtype) for _ in range(2))
    dout = torch.randn(4, lq, 8, generator=g, dtype=torch.float64).to(dtype)
    fast, slow = CpuFlashKernel(), MathKernel()
    (o1, l1), (o2, l2) = fast.forward(q, k, v, block, 0.4), slow.forward(q, k, v, block, 0.4)
    assert torch.equal(torch.isneginf(l1), torch.isneginf(l2))
    fin = torch.isfinite(l2)
    assert torch.allclose(l1[fin], l2[fin], atol=tol) and torch.allclose(o1.double(), o2.double(), atol=tol)
    g1 = fast.backward(dout, q, k, v, o2, l2, block, 0.4)
    g2 = slow.backward(dout, q, k, v, o2, l2, block, 0.4)
    for a, b in zip(g1, g2, strict=True):
        assert not bool(a.isnan().any())
        assert torch.allclose(a.double(), b.double(), atol=tol * 4)


def test_fully_masked_row_gets_zero_output_and_minus_inf_lse_not_zero():
    """PITFALLS: torch's CPU flash kernel reports lse = 0 for a row that saw no key."""
    block, lq, lk = KINDS[-1]
    q, k, v = torch.randn(1, lq, 4), torch.randn(1, lk, 4), torch.randn(1, lk, 4)
    out, lse = CpuFlashKernel().forward(q, k, v, block, 1.0)
    dead = ~dense_mask(block, lq, lk).any(-1)
    assert bool(dead.any()) and bool(torch.isneginf(lse[:, dead]).all())
    assert bool((out[:, dead] == 0).all())
    # merged after a real partial, the dead block must not shrink the output
    acc_out, acc_lse = torch.ones(1, lq, 4), torch.zeros(1, lq)
    merge_(acc_out, acc_lse, out, lse)
    assert torch.equal(acc_out[:, dead], torch.ones_like(acc_out[:, dead]))
    assert torch.equal(acc_lse[:, dead], torch.zeros_like(acc_lse[:, dead]))
    dq, dk, dv = CpuFlashKernel().backward(torch.ones_like(out), q, k, v, out, lse, block, 1.0)
    assert not any(bool(t.isnan().any()) for t in (dq, dk, dv)) and bool((dq[:, dead] == 0).all())


def test_select_kernel_by_device():
    assert select_kernel("cpu", torch.float32).name == "flash_cpu"
    assert select_kernel("cpu", torch.float32, "math").name == "math"
    with pytest.raises(ValueError, match="'nope'"):
        select_kernel("cpu", torch.float32, "nope")
    with pytest.raises(ValueError, match="cannot run on device type 'cpu'"):
        select_kernel("cpu", torch.float16, "sdpa")


@pytest.mark.parametrize("lk", [5, 16, 21, 33])
def test_sdpa_bias_rows_stay_16_aligned(lk):
    """The memory-efficient backward rejects a bias whose row stride is not aligned; the bias is
    built with pure torch, so its layout is checked here on the CPU."""
    block = Block(0, 7, 0, lk, MaskKind.MASKED, 4, 0, 2)
    q = torch.zeros(3, 7, 8, dtype=torch.bfloat16)
    bias, dead = CudaSdpaKernel._bias(block, q, lk)
    assert bias.shape == (1, 3, 7, lk) and bias.dtype == torch.bfloat16
    assert bias.stride(-1) == 1 and bias.stride(-2) % 16 == 0 and bias.stride(1) == 0
    assert bias.stride(-2) == -(-lk // 16) * 16  # the padded buffer, not a compact copy
    seen = dense_mask(block, 7, lk)
    assert torch.equal(bias[0, 1], torch.zeros(7, lk, dtype=torch.bfloat16).masked_fill(~seen, float("-inf")))
    assert torch.equal(dead, ~seen.any(-1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["sdpa", "flash_attn"])
def test_cuda_kernels_match_math_kernel(name):
    if name == "flash_attn":
        pytest.importorskip("flash_attn", reason="flash-attn is not installed")
    for block, lq, lk in KINDS:
        q = torch.randn(4, lq, 64, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(2, lk, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        kern, ref = select_kernel("cuda", torch.bfloat16, name), MathKernel()
        (o1, l1), (o2, l2) = kern.forward(q, k, v, block, 0.125), ref.forward(q, k, v, block, 0.125)
        assert torch.equal(torch.isneginf(l1), torch.isneginf(l2))
        assert torch.allclose(o1.float(), o2.float(), atol=3e-2)
        dout = torch.randn_like(q)
        for a, b in zip(kern.backward(dout, q, k, v, o2, l2, block, 0.125),
                        ref.backward(dout, q, k, v, o2, l2, block, 0.125), strict=True):
            assert torch.allclose(a.float(), b.float(), atol=1e-1)
