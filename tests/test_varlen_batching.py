"""One flash-attn varlen call per round of a ring step (issue 12, section 2, CUDA half).

CPU tests run :class:`~vlmcp.attention.kernels.FlashAttnKernel` on CPU tensors through
the stand-ins of ``tests/test_cuda_review.py`` (flash-attn 2.8.3's varlen custom ops,
which attend each packed sequence on its own and check ``cu_seqlens`` / ``max_seqlen``,
and the memory-efficient aten ops for the blocks left per-block). The ring is
simulated in one process, step by step, exactly as :class:`_RingAttention` feeds
``blocks_forward`` / ``blocks_backward`` (each step's K/V buffer is the owner's
``k[send_index]``; dK/dV of a buffer go back to the owner with ``index_add``). GPU
tests (``-m gpu``) run the same simulation on the real kernels.
"""

from __future__ import annotations

import pytest
import torch

import vlmcp
from tests import rows
from tests.attention_cases import share_of
from tests.test_cuda_review import FLASH_VARLEN, fake_flash, sdpa  # noqa: F401 - fixtures
from vlmcp.attention import kernels as K
from vlmcp.attention import reference_attention
from vlmcp.attention.blockwise import VarlenPlan, blocks_backward, blocks_forward, blockwise_attention
from vlmcp.attention.masks import Block, MaskKind, Segment, self_blocks
from vlmcp.attention.ring import ring_attention, ring_schedule

CUDA = torch.cuda.is_available()
stand_ins = pytest.mark.usefixtures("fake_flash", "sdpa")

# many short samples, images interleaved with text (two images back to back in one sample)
SHORT = ["t5 i4 t9", (0, 7), "t2 i3 i2 t6", (3, 5), (0, 11), "i6 t4 i2 t3", (0, 3), (2, 9), "t13", (4, 4)]


class PerBlock(K.FlashAttnKernel):
    """The same flash kernel, one call per block (today's path)."""

    def batches(self, q):
        return False


def test_varlen_plan_colours_blocks_into_rounds_without_shared_query_rows():
    F, C, M = MaskKind.FULL, MaskKind.CAUSAL, MaskKind.MASKED
    blocks = [Block(0, 4, 0, 4, C), Block(4, 8, 0, 2, F), Block(4, 8, 2, 4, F), Block(4, 8, 4, 8, C),
              Block(8, 10, 0, 8, F), Block(10, 12, 10, 13, C), Block(12, 14, 0, 2, M)]
    plan = VarlenPlan(blocks)
    assert plan.rest == (Block(10, 12, 10, 13, C), Block(12, 14, 0, 2, M))  # non-square causal, masked
    assert [(r.causal, r.cu_q.tolist(), r.cu_k.tolist()) for r in plan.rounds] == [
        (False, [0, 4, 6], [0, 2, 10]), (False, [0, 4], [0, 2]), (True, [0, 4, 8], [0, 4, 8])]
    assert plan.rounds[0].q_index.tolist() == [4, 5, 6, 7, 8, 9]  # rows 4..7 have two full blocks
    assert plan.rounds[0].k_index.tolist() == [0, 1, *range(8)]  # keys may repeat across blocks
    assert plan.rounds[1].q_index.tolist() == [4, 5, 6, 7] and plan.rounds[1].k_index.tolist() == [2, 3]
    assert (plan.rounds[0].max_q, plan.rounds[0].max_k) == (4, 8)
    assert VarlenPlan(blocks[:3] + [Block(6, 9, 8, 10, F)]).rounds[2].cu_q.tolist() == [0, 3]
    # rows tiling one range are sliced (views), others gathered
    spans = [((4, 10), None), ((4, 8), (2, 4)), ((0, 8), (0, 8))]
    assert [(r.q_span, r.k_span) for r in plan.rounds] == spans
    assert all(r.cu_q.dtype == torch.int32 for r in plan.rounds)
    for r in plan.rounds:  # no query row twice in a round
        assert r.q_index.unique().numel() == r.q_index.numel()
    assert plan.on(torch.device("cpu")) is plan.on(torch.device("cpu"))  # copied once per device


def test_cpu_kernels_keep_one_call_per_block():
    q = torch.zeros(2, 4, 8)
    assert not K.MathKernel().batches(q) and not K.CpuFlashKernel().batches(q)


def _row(samples, heads, kv_heads, d, dtype, seed, device):
    is_image, cu, ids = rows.make_row(samples)
    L = is_image.numel()
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(L, heads, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(L, kv_heads, d, generator=g, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(L, heads, d, generator=g, dtype=torch.float64)
    return is_image, cu, ids, [t.to(dtype).to(device) for t in (q, k, v, dout)]


def simulate_ring(kernel, samples, P, image_attention, dtype=torch.float16, heads=4, kv_heads=2, d=16,
                  device="cpu", seed=0, per_rank=None):
    """Ring attention of every rank, step by step, in one process (what ``_RingAttention`` computes).

    Returns the global ``(out, lse, dq, dk, dv)`` (float64, CPU), the float64 reference on the
    same rounded inputs, and per rank and step ``[forward varlen calls, backward varlen calls,
    rounds of the step's plan, blocks of the step]``. ``per_rank``: a list to receive each
    rank's local ``[out, lse, dq, dk, dv]`` (accumulator dtype, out in ``dtype``).
    """
    is_image, cu, ids, (q, k, v, dout) = _row(samples, heads, kv_heads, d, dtype, seed, device)
    L = q.shape[0]
    plan = vlmcp.plan_cp(is_image, P, cu, image_ids=ids)
    shards = [plan.for_rank(r) for r in range(P)]
    scheds = [ring_schedule(sh, image_attention) for sh in shards]
    loc = [[sh.shard(t) for t in (q, k, v, dout)] for sh in shards]
    for r, sh in enumerate(shards):  # share semantics for replicated image tokens
        loc[r][3][sh.replicated.to(device)] *= share_of(r, P)
    acc, scale = torch.float32, d ** -0.5
    buf = [[lk[sc.send_index(device)], lv[sc.send_index(device)]]
           for (_, lk, lv, _), sc in zip(loc, scheds, strict=True)]
    calls, outs = [], []
    for r in range(P):
        lq, lk, lv, _ = loc[r]
        out = lq.new_zeros(lq.shape, dtype=acc)
        lse = lq.new_full(lq.shape[:2], float("-inf"), dtype=acc)
        touched = torch.zeros(lq.shape[0], dtype=torch.bool)
        for s in range(P):
            kk, vv = (lk, lv) if s == 0 else buf[(r - s) % P]
            n = len(FLASH_VARLEN)
            blocks_forward(kernel, lq.transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1),
                           scheds[r].step_blocks[s], scale, out.transpose(0, 1), lse.t(), touched,
                           scheds[r].plan(s))
            calls.append([len(FLASH_VARLEN) - n, None, len(scheds[r].plan(s).rounds),
                          len(scheds[r].step_blocks[s])])
        outs.append((out.to(dtype), lse))
    grads = [[x.new_zeros(x.shape, dtype=acc) for x in loc[r][:3]] for r in range(P)]
    for r in range(P):
        lq, lk, lv, ldo = loc[r]
        out, lse = outs[r]
        dq = grads[r][0]
        for s in range(P):
            owner = (r - s) % P
            kk, vv = (lk, lv) if s == 0 else buf[owner]
            dk, dv = (grads[r][1], grads[r][2]) if s == 0 else (kk.new_zeros(kk.shape, dtype=acc),
                                                                  vv.new_zeros(vv.shape, dtype=acc))
            n = len(FLASH_VARLEN)
            h = lambda x: x.transpose(0, 1)  # noqa: E731
            blocks_backward(kernel, h(ldo), h(lq), h(kk), h(vv), h(out), lse.t(), scheds[r].step_blocks[s],
                            scale, h(dq), h(dk), h(dv), scheds[r].plan(s))
            calls[r * P + s][1] = len(FLASH_VARLEN) - n
            if s > 0:
                idx = scheds[owner].send_index(device)
                grads[owner][1].index_add_(0, idx, dk)
                grads[owner][2].index_add_(0, idx, dv)
    if per_rank is not None:
        per_rank.extend([outs[r][0], outs[r][1], *grads[r]] for r in range(P))
    got = []
    for i, shape in enumerate(((L, heads, d), (L, heads), (L, heads, d), (L, kv_heads, d), (L, kv_heads, d))):
        total = torch.zeros(shape, dtype=torch.float64)
        for r, sh in enumerate(shards):
            valid = sh.positions >= 0
            local = (outs[r][0], outs[r][1], *grads[r])[i].detach().double().cpu()[valid]
            if i < 2:  # out and lse of a replicated token are the same on every rank: take one copy
                total[sh.positions[valid]] = local
            else:
                total.index_add_(0, sh.positions[valid], local)
        got.append(total)
    x = [t.double().cpu().requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = reference_attention(*x, is_image, cu, image_attention, image_ids=ids)
    ref = [ref_out.detach(), ref_lse, *torch.autograd.grad((ref_out * dout.double().cpu()).sum(), x)]
    return got, ref, calls


def _errs(a, b):
    names = ("out", "lse", "dq", "dk", "dv")
    return {n: float((x.detach() - y.detach()).abs().max()) for n, x, y in zip(names, a, b, strict=True)}


@stand_ins
@pytest.mark.parametrize("image_attention", ["causal", "bidirectional"])
@pytest.mark.parametrize("P", [2, 3])
def test_ring_with_one_varlen_call_per_round_matches_per_block_and_reference(P, image_attention):
    """Many short samples with interleaved images: batched == per-block == float64 reference
    (fp16 tolerance), and each step and direction makes exactly one varlen call per round."""
    samples = SHORT
    batched, ref, calls = simulate_ring(K.FlashAttnKernel(), samples, P, image_attention)
    FLASH_VARLEN.clear()
    per_block, _, per_calls = simulate_ring(PerBlock(), samples, P, image_attention)
    for name, e in _errs(batched, per_block).items():
        assert e < 1e-6, (name, e)  # the same arithmetic per block (bitwise on the stand-ins)
    for name, e in _errs(batched, ref).items():
        assert e < 5e-3, (name, e)  # fp16 outputs and dK/dV per block, vs float64 (measured <= 2.1e-3)
    for fwd, bwd, rounds, _ in calls:
        assert fwd == bwd == rounds, calls
    assert sum(c[0] for c in calls) * 3 < sum(c[3] for c in calls)  # far fewer calls than blocks
    assert sum(c[0] for c in per_calls) > sum(c[0] for c in calls)
    assert all(n == 1 for _, n, _ in FLASH_VARLEN)  # per-block: one sequence per call
    # one call per step, two at step 0 under bidirectional images (full blocks, then causal ones)
    bidir = image_attention == "bidirectional"
    assert [c[2] for c in calls] == [2 if s == 0 and bidir else 1 for _ in range(P) for s in range(P)], calls


@stand_ins
def test_rounds_merge_and_scatter_like_one_call_per_block():
    """Blocks sharing query rows (several rounds of one kind), repeated keys, and blocks left per-block
    (non-square causal: SDPA; masked) against the math kernel in float64 on the same rounded inputs."""
    F, C, M = MaskKind.FULL, MaskKind.CAUSAL, MaskKind.MASKED
    blocks = [Block(0, 4, 0, 4, C), Block(4, 8, 0, 2, F), Block(4, 8, 2, 4, F), Block(4, 8, 4, 8, C),
              Block(8, 10, 0, 8, F), Block(10, 12, 10, 13, C), Block(12, 14, 0, 2, M)]
    _, _, _, (q, k, v, dout) = _row([(0, 14)], 4, 2, 16, torch.float16, 3, "cpu")
    q, k, v, dout = (t.transpose(0, 1) for t in (q, k, v, dout))
    results = []
    for kern in (K.FlashAttnKernel(), K.MathKernel()):
        x = [t.double() if isinstance(kern, K.MathKernel) else t for t in (q, k, v, dout)]
        acc = torch.float64 if x[0].dtype == torch.float64 else torch.float32
        out = torch.zeros(x[0].shape, dtype=acc)
        lse = torch.full(x[0].shape[:2], float("-inf"), dtype=acc)
        touched = torch.zeros(14, dtype=torch.bool)
        FLASH_VARLEN.clear()
        blocks_forward(kern, *x[:3], blocks, 0.25, out, lse, touched)
        grads = [torch.zeros(t.shape, dtype=acc) for t in x[:3]]
        blocks_backward(kern, x[3], *x[:3], out.to(x[0].dtype), lse, blocks, 0.25, *grads)
        results.append([out, lse, *grads])
        if isinstance(kern, K.FlashAttnKernel):
            assert [(d, n, c) for d, n, c in FLASH_VARLEN] == [
                ("forward", 2, False), ("forward", 1, False), ("forward", 2, True),
                ("backward", 2, False), ("backward", 1, False), ("backward", 2, True)]
            assert bool(touched.all())
    for name, e in _errs(*results).items():
        assert e < 5e-3, (name, e)


@stand_ins
def test_causal_zigzag_rows_take_one_call_per_step_and_direction():
    """Text-only short samples at P = 2: step 0 is one causal call, step 1 one full call."""
    samples = [(0, n) for n in (8, 12, 5, 16, 9, 7, 20, 4)]
    got, ref, calls = simulate_ring(K.FlashAttnKernel(), samples, 2, "causal", dtype=torch.bfloat16)
    assert [c[:2] for c in calls] == [[1, 1]] * 4
    assert [causal for _, _, causal in FLASH_VARLEN] == [True, False] * 4  # rank 0 fwd, rank 1 fwd, bwd...
    assert [n for _, n, _ in FLASH_VARLEN[:2]] == [8, 8]  # every sample in one call
    for name, e in _errs(got, ref).items():
        assert e < 5e-2, (name, e)  # bf16


@stand_ins
@pytest.mark.parametrize("image_attention", ["causal", "bidirectional"])
def test_single_process_ring_and_blockwise_attention_batch_through_autograd(image_attention):
    """``ring_attention`` at P = 1 and ``blockwise_attention`` (Ulysses, varlen_attention) batch too."""
    is_image, cu, ids, (q, k, v, dout) = _row(SHORT, 4, 2, 16, torch.float16, 1, "cpu")
    x = [t.double().requires_grad_() for t in (q, k, v)]
    ref_out, _ = reference_attention(*x, is_image, cu, image_attention, image_ids=ids)
    ref = [ref_out.detach(), *torch.autograd.grad((ref_out * dout.double()).sum(), x)]
    shard = vlmcp.plan_cp(is_image, 1, cu, image_ids=ids).for_rank(0)
    kern = K.FlashAttnKernel()
    sched = ring_schedule(shard, image_attention)
    FLASH_VARLEN.clear()
    y = [shard.shard(t).requires_grad_() for t in (q, k, v)]
    out, _ = ring_attention(*y, shard, None, image_attention, 16 ** -0.5, kern)
    g = torch.autograd.grad((out * shard.shard(dout)).sum(), y)
    assert len(FLASH_VARLEN) == 2 * len(sched.plan(0).rounds) <= 4
    pos = shard.positions
    for mine, truth in zip((out, *g), ref, strict=True):
        assert float((mine.detach().double()[pos >= 0] - truth[pos[pos >= 0]]).abs().max()) < 1e-2
    # blockwise_attention over the row's own blocks (what varlen_attention builds)
    segs = [Segment(a, b - a, ()) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)]
    FLASH_VARLEN.clear()
    z = [t.clone().requires_grad_() for t in (q, k, v)]
    out2, _ = blockwise_attention(*z, self_blocks(segs), 16 ** -0.5, kern)
    torch.autograd.grad((out2 * dout).sum(), z)
    assert [(d, n) for d, n, _ in FLASH_VARLEN] == [("forward", len(SHORT)), ("backward", len(SHORT))]


@stand_ins
def test_batched_path_never_reads_device_data_on_the_host(monkeypatch):
    """After the plan is built (once), a ring step reads nothing back: no sync per layer on CUDA."""
    samples = [(0, n) for n in (8, 12, 5, 16)]
    kern = K.FlashAttnKernel()
    def refuse(*args, **kwargs):
        raise AssertionError("host read of a device tensor (a sync on CUDA)")

    is_image, cu, ids, (q, k, v, dout) = _row(samples, 4, 2, 16, torch.float16, 0, "cpu")
    shard = vlmcp.plan_cp(is_image, 2, cu, image_ids=ids).for_rank(0)
    sched = ring_schedule(shard, "causal")
    lq, lk, lv, ldo = (shard.shard(t).transpose(0, 1) for t in (q, k, v, dout))
    out = torch.zeros(lq.shape, dtype=torch.float32)
    lse = torch.full(lq.shape[:2], float("-inf"))
    dq, dk, dv = (torch.zeros(x.shape) for x in (lq, lk, lv))
    touched = torch.zeros(lq.shape[1], dtype=torch.bool)
    sched.plan(0).on(lq.device)  # built and copied once per schedule, before the first layer
    for name in ("__bool__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    monkeypatch.setattr(torch, "tensor", refuse)
    blocks_forward(kern, lq, lk, lv, sched.step_blocks[0], 0.25, out, lse, touched, sched.plan(0))
    blocks_backward(kern, ldo, lq, lk, lv, out.half(), lse, sched.step_blocks[0], 0.25, dq, dk, dv,
                    sched.plan(0))
    monkeypatch.undo()
    assert bool(touched[shard.positions >= 0].all())


def _install_stand_ins():
    """What the ``fake_flash`` and ``sdpa`` fixtures do, for a spawned rank (which exits after)."""
    import sys  # noqa: PLC0415
    import types  # noqa: PLC0415

    from tests import test_cuda_review as T  # noqa: PLC0415

    pkg, iface = types.ModuleType("flash_attn"), types.ModuleType("flash_attn.flash_attn_interface")
    iface._flash_attn_varlen_forward = T._flash_attn_varlen_forward
    iface._flash_attn_varlen_backward = T._flash_attn_varlen_backward
    pkg.flash_attn_interface, pkg.__version__ = iface, "2.8.3"
    sys.modules.update({"flash_attn": pkg, "flash_attn.flash_attn_interface": iface})
    K._capability = lambda device: (9, 0)
    K.flash_attn_version.cache_clear()
    stand_in = T.SdpaStandIn()
    torch.ops.aten._scaled_dot_product_efficient_attention = stand_in.forward
    torch.ops.aten._scaled_dot_product_efficient_attention_backward = stand_in.backward


def ring_rank(group, samples, modes):
    """The real ring (gloo) with the flash kernel on the stand-ins: per image-attention mode, this
    rank's ``[out, lse, dq, dk, dv]``, its varlen calls and its plans' rounds."""
    import torch.distributed as dist  # noqa: PLC0415

    _install_stand_ins()
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    is_image, cu, ids, (q, k, v, dout) = _row(samples, 4, 2, 16, torch.float16, 0, "cpu")
    shard = vlmcp.plan_cp(is_image, P, cu, image_ids=ids).for_rank(rank)
    results = []
    for image_attention in modes:
        x = [shard.shard(t).requires_grad_() for t in (q, k, v)]
        ldout = shard.shard(dout)
        ldout[shard.replicated] *= share_of(rank, P)
        n = len(FLASH_VARLEN)
        out, lse = ring_attention(*x, shard, group, image_attention, 16 ** -0.5, K.FlashAttnKernel())
        grads = torch.autograd.grad((out * ldout).sum(), x)
        sched = ring_schedule(shard, image_attention)
        results.append(([t.detach() for t in (out, lse, *grads)], len(FLASH_VARLEN) - n,
                        sum(len(sched.plan(s).rounds) for s in range(P))))
    return results


@stand_ins
def test_real_ring_on_two_ranks_equals_the_simulation():
    """``_RingAttention`` over gloo at P = 2 gives the simulation's results exactly (so the
    reference parity above holds for it), with one varlen call per round, step and direction."""
    from vlmcp.testing import run_on_ranks  # noqa: PLC0415

    modes = ("causal", "bidirectional")
    results = run_on_ranks(ring_rank, 2, SHORT, modes, timeout=120)
    for m, image_attention in enumerate(modes):
        sim_ranks = []
        simulate_ring(K.FlashAttnKernel(), SHORT, 2, image_attention, per_rank=sim_ranks)
        for rank, sim in enumerate(sim_ranks):
            tensors, n_calls, rounds = results[rank][m]
            assert n_calls == 2 * rounds  # forward and backward
            for name, mine, want in zip(("out", "lse", "dq", "dk", "dv"), tensors, sim, strict=True):
                # the ring returns gradients in the input dtype: the simulation's fp32 sums, rounded once
                assert torch.equal(mine, want.to(mine.dtype)), (image_attention, rank, name)


# ---------------------------------------------------------------- GPU: the real kernels


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("image_attention", ["causal", "bidirectional"])
def test_gpu_batched_ring_matches_per_block_and_reference(dtype, image_attention):
    if not K.FlashAttnKernel.available():
        pytest.skip("flash-attn >= 2.7 is not installed")
    tol = 5e-2 if dtype == torch.bfloat16 else 1e-2
    kern = K.FlashAttnKernel()
    got, ref, calls = simulate_ring(kern, SHORT, 2, image_attention, dtype, heads=8, kv_heads=2, d=64,
                                    device="cuda")
    per_block, _, _ = simulate_ring(PerBlock(), SHORT, 2, image_attention, dtype, heads=8, kv_heads=2,
                                    d=64, device="cuda")
    for name, e in _errs(got, ref).items():
        assert e < tol, (name, e)
    for name, e in _errs(got, per_block).items():
        assert e < tol / 4, (name, e)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_batched_step_does_not_synchronize():
    if not K.FlashAttnKernel.available():
        pytest.skip("flash-attn >= 2.7 is not installed")
    samples = [(0, n) for n in (80, 120, 50, 160)]
    is_image, cu, ids, (q, k, v, dout) = _row(samples, 8, 2, 64, torch.bfloat16, 0, "cuda")
    shard = vlmcp.plan_cp(is_image, 1, cu, image_ids=ids).for_rank(0)
    sched = ring_schedule(shard, "causal")
    kern = K.FlashAttnKernel()
    lq, lk, lv, ldo = (shard.shard(t).transpose(0, 1) for t in (q, k, v, dout))
    args = [torch.zeros(lq.shape, device="cuda"), torch.full(lq.shape[:2], float("-inf"), device="cuda")]
    grads = [torch.zeros(x.shape, device="cuda") for x in (lq, lk, lv)]
    for sync in ("default", "error"):  # the first pass builds the plan and copies it to the device
        touched = torch.zeros(lq.shape[1], dtype=torch.bool)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode(sync)
        try:
            blocks_forward(kern, lq, lk, lv, sched.step_blocks[0], 0.125, *args, touched, sched.plan(0))
            blocks_backward(kern, ldo, lq, lk, lv, args[0].bfloat16(), args[1], sched.step_blocks[0], 0.125,
                            *grads, sched.plan(0))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
