"""CP attention pieces in one process: mask decisions, schedules, merge, reference (kernels:
``test_attention_kernels.py``)."""

import itertools
import math

import pytest
import torch

import vlmcp
from tests.rows import make_row
from vlmcp.attention import (
    MaskKind,
    block_kind,
    merge_,
    reference_attention,
    reference_mask,
    varlen_attention,
)
from vlmcp.attention.blockwise import blocks_forward
from vlmcp.attention.kernels import CpuFlashKernel, MathKernel
from vlmcp.attention.masks import Block, Run, Segment, cross_blocks, dense_mask, runs_of, self_blocks
from vlmcp.attention.merge import accumulator_dtype
from vlmcp.attention.ring import ring_schedule
from vlmcp.attention.ulysses import ulysses_schedule

# ---------------------------------------------------------------- block_kind


def test_block_kind_agrees_with_the_dense_mask_and_is_tight():
    spans = [(0, 0), *((a, b) for a in range(6) for b in range(a + 1, 7))]
    for qo, ql, ko, kl, span in itertools.product(range(5), range(4), range(5), range(4), spans):
        kind = block_kind(qo, ql, ko, kl, span)
        m = dense_mask(Block(0, ql, 0, kl, MaskKind.MASKED, qo, ko, *span), ql, kl)
        case = (qo, ql, ko, kl, span, kind)
        if m.numel() == 0 or not m.any():
            assert kind is MaskKind.EMPTY, case
        elif m.all():
            assert kind is MaskKind.FULL, case
        elif qo == ko and torch.equal(m, torch.ones(ql, kl, dtype=torch.bool).tril()):
            assert kind is MaskKind.CAUSAL, case
        else:
            assert kind is MaskKind.MASKED, case


def test_zigzag_chunk_pairs_are_full_causal_or_empty():
    c = 4  # chunk a of queries against chunk b of keys
    for a, b in itertools.product(range(6), repeat=2):
        expect = MaskKind.FULL if a > b else MaskKind.CAUSAL if a == b else MaskKind.EMPTY
        assert block_kind(a * c, c, b * c, c) is expect


def test_runs_split_at_samples_gaps_padding_and_images():
    sid = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
    off = torch.tensor([0, 1, 5, 6, -1, 0, 1, -1])
    assert runs_of(sid, off) == [Run(0, 0, 0, 2), Run(0, 2, 5, 2), Run(1, 5, 0, 2)]
    img = torch.tensor([-1, 0, 1, 1, -1, -1, -1, -1])
    assert runs_of(sid, off, img) == [Run(0, 0, 0, 1), Run(0, 1, 1, 1, 0), Run(0, 2, 5, 2, 1),
                                      Run(1, 5, 0, 2)]


def test_self_blocks_images_anywhere_and_skipped_queries():
    full, causal = MaskKind.FULL, MaskKind.CAUSAL
    assert self_blocks([Segment(3, 6)]) == [Block(3, 9, 3, 9, causal)]
    # prefix-LM: the image's queries and the text's see the image in full
    assert self_blocks([Segment(0, 6, ((0, 2),))]) == [Block(0, 6, 0, 2, full), Block(2, 6, 2, 6, causal)]
    # text, an image, text: each stretch sees everything before it in full (coalesced)
    assert self_blocks([Segment(0, 7, ((2, 4),))]) == [
        Block(0, 2, 0, 2, causal), Block(2, 7, 0, 4, full), Block(4, 7, 4, 7, causal)]
    assert self_blocks([Segment(0, 6, (), ((2, 6),))]) == [Block(2, 6, 0, 2, full), Block(2, 6, 2, 6, causal)]
    assert self_blocks([Segment(0, 2, (), ())]) == []


def test_cross_blocks_coalesce_full_blocks_and_see_one_image_both_ways():
    # queries: chunk 3 of a 4-chunk sample; keys: chunks 1 and 2 stored back to back
    blocks = cross_blocks([Run(0, 0, 0, 2), Run(0, 2, 6, 2)], [Run(0, 0, 2, 2), Run(0, 2, 4, 2)])
    assert blocks == [Block(2, 4, 0, 4, MaskKind.FULL, 6, 2)]
    blocks = cross_blocks([Run(0, 0, 2, 2), Run(0, 2, 4, 2)], [Run(0, 0, 0, 2), Run(0, 2, 6, 2)])
    assert blocks == [Block(0, 4, 0, 2, MaskKind.FULL, 2, 0)]
    # two pieces of image 0 (offsets 2..7) see each other; a later text key stays unseen
    blocks = cross_blocks([Run(0, 0, 2, 3, 0)], [Run(0, 0, 5, 3, 0), Run(0, 3, 8, 2)], [(2, 8)])
    assert blocks == [Block(0, 3, 0, 3, MaskKind.FULL, 2, 5, 2, 8)]


# ---------------------------------------------------------------- ring schedule vs the mask

ROWS = [[(0, 13)], [(5, 7), (0, 3), (9, 1)], [(4, 0), (2, 9)], [(3, 11), (0, 1), (6, 17), (2, 5)], [(1, 1)],
        ["t3 i5 t4 i2 i3 t6"], ["t2 i6", "i2 i3 t9 i4", "t5 i1 t1"]]


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_ring_schedule_covers_each_attended_pair_exactly_once(P):
    """Over all steps, a rank's blocks hit every (local query, key) pair of the mask once."""
    for samples, strategy, ia in itertools.product(ROWS, ("replicate", "shard"), ("causal", "bidirectional")):
        is_image, cu, ids = make_row(samples)
        truth = reference_mask(is_image, cu, ia, ids)
        plan = vlmcp.plan_cp(is_image, P, cu, image_strategy=strategy, image_ids=ids)
        for r in range(P):
            shard = plan.for_rank(r)
            sched = ring_schedule(shard, ia)
            hits = torch.zeros(shard.num_tokens, plan.seq_len, dtype=torch.long)
            for s, blocks in enumerate(sched.step_blocks):
                kpos = shard.positions if s == 0 else sched.exchange.positions[(r - s) % P]
                for b in blocks:
                    assert b.kind is not MaskKind.MASKED, (samples, strategy, ia, b)
                    lq, lk = b.q_end - b.q_start, b.k_end - b.k_start
                    m = {MaskKind.FULL: torch.ones(lq, lk, dtype=torch.bool),
                         MaskKind.CAUSAL: torch.ones(lq, lk, dtype=torch.bool).tril()}[b.kind]
                    qi = torch.arange(b.q_start, b.q_end)[:, None].expand(lq, lk)[m]
                    kp = kpos[b.k_start:b.k_end][None, :].expand(lq, lk)[m]
                    assert bool((kp >= 0).all())
                    hits.index_put_((qi, kp), torch.ones_like(qi), accumulate=True)
            valid = shard.positions >= 0
            expect = truth[shard.positions[valid]].long()
            assert torch.equal(hits[valid], expect), (P, samples, strategy, ia, r)
            assert not bool(hits[~valid].any())


def test_ring_steps_are_single_full_or_causal_calls_for_a_text_sample():
    """Zigzag: one causal call at step 0, one full call per later step (no dense masks)."""
    is_image, cu, _ = make_row([(8, 48)])
    for P in (2, 3, 4):
        for r in range(P):
            sched = ring_schedule(vlmcp.plan_cp(is_image, P, cu).for_rank(r), "causal")
            assert [b.kind for b in sched.step_blocks[0]] == [MaskKind.CAUSAL]
            for blocks in sched.step_blocks[1:]:
                assert [b.kind for b in blocks] == [MaskKind.FULL]
                b = blocks[0]
                assert (b.q_end - b.q_start) * (b.k_end - b.k_start) == 2 * (48 // (2 * P)) ** 2


@pytest.mark.parametrize("P", [1, 2, 3])
def test_ulysses_schedule_is_cached_and_orders_the_whole_row(P):
    """One schedule per shard (every layer reuses it); its gathered row sorts into global order."""
    for samples in (ROWS[3], ROWS[6]):
        is_image, cu, ids = make_row(samples)
        plan = vlmcp.plan_cp(is_image, P, cu, image_ids=ids)
        for r in range(P):
            shard = plan.for_rank(r)
            sched = ulysses_schedule(shard, "bidirectional")
            assert ulysses_schedule(shard, "bidirectional") is sched
            assert ulysses_schedule(shard, "causal") is not sched
            gathered = torch.cat([sched.travelling_positions, shard.positions[sched.image_index]])
            assert torch.equal(gathered[sched.row_order], torch.arange(plan.seq_len))
            assert list(sched.counts) == [int(plan.for_rank(p).is_text.sum()) for p in range(P)]
            assert bool(shard.replicated[sched.image_index].all())
            assert not bool(shard.replicated[sched.send_index].any())
            # every image is computed once: locally (leading run) or in the gathered row
            lead, late = set(sched.lead_index.tolist()), set(sched.late_slots.tolist())
            assert not lead & late and lead | late == set(sched.image_index.tolist())


# ---------------------------------------------------------------- merge


def test_merge_of_two_key_halves_is_attention_over_both():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    kern = MathKernel()
    full = Block(0, 5, 0, 5, MaskKind.FULL)
    out, lse = kern.forward(q, k, v, full, 0.5)
    a = kern.forward(q, k[:, :2], v[:, :2], full, 0.5)
    b = kern.forward(q, k[:, 2:], v[:, 2:], full, 0.5)
    acc_out, acc_lse = a[0].clone(), a[1].clone()
    merge_(acc_out, acc_lse, *b)
    assert torch.allclose(acc_out, out, atol=1e-14) and torch.allclose(acc_lse, lse, atol=1e-14)


def test_merge_handles_rows_without_keys():
    inf = float("-inf")
    out, lse = torch.zeros(1, 3, 2), torch.tensor([[inf, inf, 0.5]])
    block_out = torch.tensor([[[0.0, 0.0], [1.0, 2.0], [0.0, 0.0]]])
    block_lse = torch.tensor([[inf, 0.3, inf]])
    merge_(out, lse, block_out, block_lse)
    assert not bool(out.isnan().any() or lse.isnan().any())
    assert lse[0, 0] == inf and torch.equal(out[0, 0], torch.zeros(2))  # nothing, nothing
    assert lse[0, 1] == pytest.approx(0.3) and torch.equal(out[0, 1], torch.tensor([1.0, 2.0]))
    assert lse[0, 2] == pytest.approx(0.5) and torch.equal(out[0, 2], torch.zeros(2))


def test_merge_upcasts_a_bfloat16_block_into_float32():
    out, lse = torch.zeros(1, 1, 1), torch.zeros(1, 1)
    merge_(out, lse, torch.ones(1, 1, 1, dtype=torch.bfloat16) / 3, torch.zeros(1, 1))
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(float(torch.tensor(1 / 3).bfloat16()) / 2, abs=1e-7)


def _blockwise_bf16_error(n_blocks):
    """Error vs float64 of attention over 256 keys computed as ``n_blocks`` merged bf16 blocks."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 16, 32, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 256, 32, generator=g, dtype=torch.float64) for _ in range(2))
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    whole = Block(0, 16, 0, 256, MaskKind.FULL)
    truth, _ = MathKernel().forward(*(t.double() for t in (qb, kb, vb)), whole, 0.2)
    acc = accumulator_dtype(torch.bfloat16)
    out, lse = torch.zeros(2, 16, 32, dtype=acc), torch.full((2, 16), float("-inf"), dtype=acc)
    step = 256 // n_blocks
    blocks = [Block(0, 16, i, i + step, MaskKind.FULL) for i in range(0, 256, step)]
    blocks_forward(CpuFlashKernel(), qb, kb, vb, blocks, 0.2, out, lse, torch.zeros(16, dtype=torch.bool))
    return float((out.double() - truth).abs().max())


def test_merging_many_bfloat16_blocks_does_not_grow_the_error():
    """PITFALLS: merged in bf16, the error grows with the number of blocks (the ring size)."""
    # measured: fp32 accumulators ~1e-3 for 1..128 blocks; bf16 ones grow to ~1e-1 at 128
    assert _blockwise_bf16_error(64) <= 2 * _blockwise_bf16_error(1)


# ---------------------------------------------------------------- single-process attention


def test_reference_matches_torch_sdpa_on_one_causal_sample():
    q, k, v = (torch.randn(9, 2, 8, dtype=torch.float64) for _ in range(3))
    out, lse = reference_attention(q, k, v, torch.zeros(9, dtype=torch.bool))
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True).transpose(0, 1)
    assert torch.allclose(out, sdpa, atol=1e-12)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(8)
    s = s.masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf"))
    assert torch.allclose(lse, s.logsumexp(-1).t(), atol=1e-12)


def test_reference_mask_is_per_sample_with_bidirectional_images():
    is_image, cu, _ = make_row([(2, 1), (0, 2)])
    m = reference_mask(is_image, cu, "bidirectional")
    assert m.tolist() == [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    assert reference_mask(is_image, cu, "causal")[0, 1].item() is False
    # two images back to back see only themselves; text between images sees both causally
    is_image, cu, ids = make_row(["i2 i1 t1 i2"])
    m = reference_mask(is_image, cu, "bidirectional", ids)
    assert m.long().tolist() == [[1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                                 [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]


@pytest.mark.parametrize("image_attention", ["causal", "bidirectional"])
def test_varlen_attention_matches_reference(image_attention):
    is_image, cu, ids = make_row([(3, 4), (0, 5), (4, 0), "t2 i3 i2 t3 i2"])
    L = is_image.numel()
    q = torch.randn(L, 4, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(L, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    dout = torch.randn(L, 4, 8, dtype=torch.float64)
    o1, l1 = reference_attention(q, k, v, is_image, cu, image_attention, image_ids=ids)
    o2, l2 = varlen_attention(q, k, v, cu, is_image, image_attention, image_ids=ids)
    assert torch.allclose(o1, o2, atol=1e-12) and torch.allclose(l1, l2, atol=1e-12)
    for a, b in zip(torch.autograd.grad(o1, (q, k, v), dout), torch.autograd.grad(o2, (q, k, v), dout),
                    strict=True):
        assert torch.allclose(a, b, atol=1e-12)
