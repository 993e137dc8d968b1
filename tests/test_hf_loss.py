"""``vlmcp.hf.causal_lm_loss``: the chunked LM-head loss of every architecture, exact in float64.

One group per P (1 in-process, 2 and 3 spawned) runs ``tests/loss_cases.py:suite`` over every
architecture of the README's table: the chunked loss against the full-logits path
(``model(**inputs).logits`` + ``cp_cross_entropy``) on each rank, loss share, group mean and every
parameter's local gradient (tied embeddings: Qwen2.5-VL; Gemma 3 with ``final_logit_softcapping``
set; LLaVA with targets on rank 0 only; Qwen3-VL-MoE with its router's auxiliary loss); the
op itself against one process with a rank that has no target; and Qwen3-VL-MoE's loss and
gradients against the unmodified model. FSDP2 at DP=2 x CP=2 with the head sharded runs once.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import vlmcp  # noqa: E402
import vlmcp.hf  # noqa: E402
from tests import loss_cases  # noqa: E402
from tests.loss_cases import ARCHS  # noqa: E402
from vlmcp.debug.synthetic import synthetic_row  # noqa: E402
from vlmcp.debug.tiny import tiny_config, tiny_model  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda p: f"P{p}")
def suite(request):
    p = request.param
    if p == 1:
        return p, [loss_cases.suite(None, list(ARCHS))]
    return p, run_on_ranks(loss_cases.suite, p, list(ARCHS), timeout=280)


def test_op_exact_against_one_process(suite):
    p, ranks = suite
    for rank, res in enumerate(ranks):
        for r in res["op"]:
            assert r["loss_err"] < 1e-13 and r["mean_err"] < 1e-13, r
            assert r["hidden_err"] < 1e-13 and r["shared_err"] < 1e-13, r
            if rank == 1:
                assert r["local_targets"] == 0  # a rank without a target still joins and gets zero


def test_every_architecture_chunked_equals_full_logits(suite):
    p, ranks = suite
    for res in ranks:
        assert [r["name"] for r in res["hf"]] == list(ARCHS)
        for r in res["hf"]:
            assert r["same_params"] and r["params"] > 40, r
            assert r["loss_err"] < 1e-12 and r["mean_err"] < 1e-12, r
            assert r["max_grad_err"] < 1e-12, r
            assert r["head_err"] is not None and r["head_err"] < 1e-12, r  # the head's gradient too
    by = {r["name"]: r for r in ranks[0]["hf"]}
    assert by["qwen2_5_vl"]["tied"] and by["qwen2_5_vl"]["head"].endswith("embed_tokens.weight")
    if p > 1:  # LLaVA's targets all sit on rank 0
        assert [res["hf"][ARCHS.index("llava")]["targets"] for res in ranks][1:] == [0] * (p - 1)


def test_moe_router_aux_loss_matches_the_model(suite):
    _, ranks = suite
    r = ranks[0]["moe"]
    assert r["aux"] > 0.1 and r["loss_err"] < 1e-12 and r["max_grad_err"] < 1e-10, r


def test_fsdp2_dp2_cp2_head_sharded():
    """NeMo Automodel #3414: the head sharded by FSDP2 (in the root's unit, as ``vlmcp train --fsdp``
    does, and in its own), every gradient, the head's included, against one process."""
    results = run_on_ranks(loss_cases.fsdp_head, 4, [("qwen2_vl", "root"), ("llava", "own")], timeout=240)[0]
    for r in results:
        assert r["head_is_dtensor"], r
        assert r["loss_rel_error"] < 1e-12 and r["max_rel_grad_error"] < 1e-10 and r["head_err"] < 1e-10, r


def _batch(model):
    vlmcp.hf.parallelize(model, None)
    inputs, labels, cu = synthetic_row(model, loss_cases.QWEN_ROW)
    return vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)


def test_refuses_what_it_cannot_reproduce():
    model = tiny_model("qwen2_vl")
    batch = _batch(model)
    original = type(model).forward

    def scaled(self, *args, **kwargs):  # a forward that changes the logits after the head
        out = original(self, *args, **kwargs)
        out.logits = out.logits * 2
        return out

    type(model).forward = scaled
    try:
        with pytest.raises(ValueError, match="softcap, scale or cast"):
            vlmcp.hf.causal_lm_loss(model, batch, None)
    finally:
        type(model).forward = original
    handle = model.lm_head.register_forward_hook(lambda m, i, o: o)
    with pytest.raises(ValueError, match="forward hooks"):
        vlmcp.hf.causal_lm_loss(model, batch, None)
    handle.remove()
    vlmcp.hf.causal_lm_loss(model, batch, None)  # nothing left behind by the refusals
    model.lm_head = torch.nn.Sequential(model.lm_head)
    with pytest.raises(ValueError, match="not an nn.Linear"):
        vlmcp.hf.causal_lm_loss(model, batch, None)
    with pytest.raises(ValueError, match="not the group"):
        vlmcp.hf.causal_lm_loss(model, batch, object())


def test_refuses_an_aux_loss_the_adapter_does_not_handle():
    model = tiny_model(tiny_config("qwen3_vl_moe", text_config={"output_router_logits": True}))
    batch = _batch(model)
    plain = vlmcp.hf.adapters.base.HFAdapter.auxiliary_loss
    with pytest.raises(NotImplementedError, match="auxiliary loss"):
        plain(vlmcp.hf.parallel_state(model).adapter, model, model(**batch.model_inputs), None, None)


def test_autocast_bf16_matches_one_process(suite):
    """Qwen2-VL, Qwen2.5-VL, LLaVA under ``torch.autocast`` (bf16, float32 parameters): q and k come
    out of HF's rotary in float32, v in bf16; cp_attention casts them, and the CP step matches one
    process's autocast step within bf16's own error against float32."""
    _, ranks = suite
    assert [r["arch"] for r in ranks[0]["autocast"]] == ["qwen2_vl", "qwen2_5_vl", "llava"]
    for r in ranks[0]["autocast"]:
        assert r["loss_err"] < 1e-3 and r["max_grad_err"] <= 2 * r["bf16_err"], r


def _step_measured(chunk_size, offload=False, checkpointing=False, vocab=128, row=((5, (1, 4, 4), 9), (12,))):
    """One float32 step of a tiny Qwen2-VL under the allocation hook and the saved-tensor counter
    (the counter runs the offloading policy)."""
    from vlmcp.debug.meters.allocations import AllocationMeter
    from vlmcp.debug.meters.saved_tensors import SavedTensorMeter

    model = tiny_model(tiny_config("qwen2_vl", text_config={"vocab_size": vocab}), torch.float32)
    if checkpointing:
        model.train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    vlmcp.hf.parallelize(model, None)
    inputs, labels, cu = synthetic_row(model, row)
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    policy = vlmcp.hf.offload_activations() if offload else None
    with AllocationMeter() as alloc, SavedTensorMeter(model.parameters(), hooks=policy) as saved:
        res = vlmcp.hf.causal_lm_loss(model, batch, None, chunk_size=chunk_size)
        res.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return batch.shard.num_tokens, alloc, saved, grads, res


def test_no_tokens_by_vocab_tensor_during_an_hf_step():
    """N ~ 120 slots >> chunk 8, V = 1024: no op output of N x V elements during the whole step
    (forward and backward) and the head+loss saves O(N); the full-logits path is the control."""
    v, row = 1024, ((10, (1, 4, 4), 50), (60,))
    n, alloc, saved, _, _ = _step_measured(8, vocab=v, row=row)
    _, alloc_full, saved_full, _, _ = _step_measured(None, vocab=v, row=row)
    assert n > 100 and alloc_full.max_numel >= n * v and saved_full.bytes - saved.bytes >= 0.99 * n * v * 4
    hidden = 48  # the tiny text model: the largest tensor is the embedding gradient, V x H, or a chunk
    assert alloc.max_numel <= max(8 * v, v * hidden) < n * v // 2, alloc.max_shape


def test_offload_activations_exact_and_nothing_saved_in_place():
    """With offloading, no saved tensor (parameters aside) stays where it was made, with and
    without activation checkpointing; the gradients are bitwise those of a step without it."""
    for checkpointing in (False, True):
        _, _, kept, grads, res = _step_measured(4, checkpointing=checkpointing)
        _, _, moved, grads_off, res_off = _step_measured(4, offload=True, checkpointing=checkpointing)
        assert kept.kept_bytes == kept.bytes > 0
        assert moved.bytes == kept.bytes and moved.kept_bytes == 0
        assert float(res.loss) == float(res_off.loss)
        assert grads.keys() == grads_off.keys() and all(torch.equal(grads[k], grads_off[k]) for k in grads)


def test_bench_hf_loss_reports_the_head_share(capsys):
    """``vlmcp bench hf-loss`` on a small row: the full logits' head+loss share against the chunked one,
    and the chunk's transient as ``chunk_transient_bytes`` says."""
    from vlmcp.cli import main

    assert main(["bench", "hf-loss", "--vocab", "4096", "--tokens", "256", "--hidden", "32", "--layers", "1",
                 "--chunk-size", "64"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    full, chunked = ([c.strip() for c in r] for r in rows[1:])
    share = lambda r: float(r[3].rstrip("%"))  # noqa: E731
    assert full[0] == "full logits" and chunked[0] == "chunked (64)"
    assert share(full) > 50 and share(chunked) < 1
    mib = lambda r: float(r[4].split()[0].replace(",", ""))  # noqa: E731
    assert abs(mib(chunked) - 64 * 4096 * 4 / 2**20) < 0.2 and mib(full) > 4 * mib(chunked)
