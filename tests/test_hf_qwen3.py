"""Qwen3-VL (deepstack), Qwen3-VL-MoE and GLM-4.1V under vlmcp: exact against the unmodified model.

Tiny random models built in code (``tests/hf_archs.py``: MROPE_ARCHS). One spawned group
per world size runs a whole grid (tests/hf_qwen3_cases.py); the tests below read its
results. Float64 parity runs with HF's float32 islands (ViT rotary, GLM-4.1V's position
interpolation, the MoE router) in float64, as :func:`vlmcp.debug.parity.hf.float64_exact` does.
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

import vlmcp  # noqa: E402
import vlmcp.hf  # noqa: E402
from tests import hf_cases, hf_qwen3_cases  # noqa: E402
from tests.hf_archs import MROPE_ARCHS  # noqa: E402
from vlmcp.debug.parity.hf import HFParityCase  # noqa: E402
from vlmcp.debug.synthetic import synthetic_row  # noqa: E402
from vlmcp.debug.tiny import tiny_model  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402

MODES = ("replicate", "allreduce_hook", "broadcast", "scatter", "hidden_shard")
BACKENDS = ("ring", "ulysses")
ARCHS = ("qwen3_vl", "glm4v")
TWO_LEVELS = (0, 1)  # deepstack after LLM layers 0 and 1 (of 3)


def _case(arch, attention="ring", mode="replicate", rows="packed", placement="split", dtype="float64",
          gc=False, levels=None):
    return (HFParityCase(model=f"hf:{arch}", attention=attention, vision_mode=mode, dtype=dtype,
                         gradient_checkpointing=gc, samples=hf_cases.ROWS[rows], sample_placement=placement),
            levels)


P2_CASES = (
    # the packed row (two image samples, one text-only): split with every backend and mode, whole on ring
    # (whole under Ulysses: the two-level rows below and the auto ones)
    [_case(a, b, m) for a in ARCHS for b in BACKENDS for m in MODES]
    + [_case(a, "ring", m, placement="whole") for a in ARCHS for m in MODES]
    + [_case("qwen3_vl", "ring", m, levels=TWO_LEVELS) for m in MODES]
    + [_case("qwen3_vl", "ulysses", m, rows="mixed", placement="whole", levels=TWO_LEVELS) for m in MODES]
    + [_case("qwen3_vl", "ring", m, rows="lone_image", placement="whole") for m in MODES]
    + [_case(a, b, m, rows="mixed", placement="auto") for a in ARCHS
       for b, m in (("ring", "scatter"), ("ulysses", "hidden_shard"))]
    + [_case("qwen3_vl_moe", "ring", "hidden_shard"), _case("qwen3_vl_moe", "ulysses", "replicate"),
       _case("qwen3_vl_moe", "ring", "scatter", placement="whole")]
    + [_case("qwen3_vl", "ulysses", "scatter", dtype="float32"),
       _case("glm4v", "ring", "replicate", dtype="float32")]
    + [_case("qwen3_vl", "ring", "hidden_shard", gc=True), _case("glm4v", "ulysses", "broadcast", gc=True)]
)
ROW_CASES = [("ring", "scatter", "packed", "split"), ("ulysses", "hidden_shard", "mixed", "whole"),
             ("ring", "broadcast", "mixed", "auto"), ("ulysses", "allreduce_hook", "lone_image", "whole")]
P3_CASES = [_case(a, b, m) for a, b, m in (
    ("qwen3_vl", "ring", "scatter"), ("qwen3_vl", "ulysses", "hidden_shard"),
    ("qwen3_vl", "ring", "broadcast"), ("qwen3_vl", "ulysses", "allreduce_hook"),
    ("glm4v", "ulysses", "scatter"), ("glm4v", "ring", "hidden_shard"),
    ("glm4v", "ulysses", "replicate"))] + [
    _case("qwen3_vl", "ulysses", "hidden_shard", rows="mixed", placement="whole", levels=TWO_LEVELS),
    _case("glm4v", "ring", "scatter", rows="mixed", placement="auto")]


def _failures(results: list[dict]) -> list[str]:
    return [f"{r['model']} levels={r['levels']} {r['attention']} {r['vision_mode']} {r['dtype']} "
            f"gc={r['gradient_checkpointing']} placement={r['sample_placement']} samples={r['samples']}: "
            f"loss {r['loss_rel_error']:.1e}, grad {r['max_rel_grad_error']:.1e} ({r['worst_param']})"
            for r in results if not r["passed"]]


@pytest.fixture(scope="module")
def p2():
    return run_on_ranks(hf_qwen3_cases.suite, 2, P2_CASES, ROW_CASES, list(MODES), timeout=240)


@pytest.fixture(scope="module")
def p3():
    return run_on_ranks(hf_qwen3_cases.parity_grid, 3, P3_CASES, timeout=240)[0]


def test_parity_p2_every_backend_mode_and_placement(p2):
    results = p2[0]["parity"]
    assert len(results) == len(P2_CASES)
    assert not _failures(results), "\n".join(_failures(results))
    for r in results:
        assert r["vision_params_with_grad"] > 0, r
        if r["model"].startswith("hf:qwen3_vl"):  # deepstack is in the loss: every level's merger has a grad
            assert len(r["deepstack_grad_norms"]) == len(r["levels"] or (0,)), r
            assert min(r["deepstack_grad_norms"]) > 0, r
    lone = [r for r in results if r["samples"] == [list(s) for s in hf_cases.LONE_IMAGE]]
    assert lone and all(r["whole"] == [0, 1] and r["image_tokens_per_rank"][1] == 0 for r in lone)
    auto = [r for r in results if r["sample_placement"] == "auto"]
    assert auto and all(r["whole"] == [0, 0, 1, 1, -1] for r in auto)  # the long sample (and its image) split
    packed = [list(s) for s in hf_cases.PACKED]
    whole = [r for r in results if r["sample_placement"] == "whole" and r["samples"] == packed]
    assert whole and all(min(r["whole"]) >= 0 for r in whole)


def test_parity_p3(p3):
    assert len(p3) == len(P3_CASES)
    assert not _failures(p3), "\n".join(_failures(p3))


def test_deepstack_added_at_the_local_image_rows(p2):
    """The states after each deepstack layer, put back at their global positions, equal one process's."""
    rows = [r for rank in p2 for r in rank["rows"]]
    assert len(rows) == 2 * len(ROW_CASES)
    for r in rows:
        assert r["err_after_layer0"] <= 1e-12 and r["err_after_layer1"] <= 1e-12, r
        assert r["replica_disagreement"] <= 1e-12, r
        # not vacuous: deepstack moved every image row, and no text row
        assert r["deepstack_at_image_rows"] > 1e-3 and r["deepstack_at_text_rows"] == 0.0, r
    lone = [r for r in rows if r["case"][2] == "lone_image"]
    assert lone[0]["image_tokens_per_rank"][1] == 0  # a rank adds no level, yet joined every collective


def test_one_collective_per_mode_for_all_deepstack_levels(p2):
    """Two deepstack levels ride in the main features' collective: one call, (tokens, 1 + 2, width)."""
    by_mode = {r["mode"]: r for r in p2[0]["collectives"]}
    tokens = (16 + 32 + 16) // 4  # PACKED's grids (1, 4, 4), (1, 4, 8), (1, 4, 4), merged 2x2
    assert by_mode["replicate"]["calls"] == []
    assert by_mode["allreduce_hook"]["calls"] == [("_all_reduce", (tokens, 3, 48))]  # the hook, in backward
    assert by_mode["broadcast"]["calls"] == [("broadcast", (tokens, 3, 48))]
    [(name, shape)] = by_mode["scatter"]["calls"]  # this rank's images only
    assert name == "all_gather" and shape[1:] == (3, 48) and 0 < shape[0] < tokens
    assert by_mode["hidden_shard"]["calls"] == [("all_gather", (tokens, 3, 24))]
    assert by_mode["hidden_shard"]["widths"] == [24, 24, 24]  # projector and both deepstack mergers cut
    assert by_mode["replicate"]["widths"] == [48, 48, 48]


def test_dummy_vision_zero_grads_for_every_level_in_every_mode(p2):
    """A text-only row with the dummy ViT pass (FSDP's case): same loss, every vision grad an exact zero."""
    for r in p2[0]["dummy"]:
        assert r["loss_diff"] == 0.0 and r["vision_params_not_zero"] == 0 and r["deepstack_params"] == 12, r
    assert [r["mode"] for r in p2[0]["dummy"]] == list(MODES)


# --- one process -------------------------------------------------------------------------------


def test_adapters_are_registered():
    for arch, name, last in (("qwen3_vl", "qwen3_vl", "model.visual.merger.linear_fc2"),
                             ("qwen3_vl_moe", "qwen3_vl", "model.visual.merger.linear_fc2"),
                             ("glm4v", "glm4v", "model.visual.merger.down_proj")):
        model = tiny_model(arch)
        adapter = vlmcp.hf.adapter_for(model)
        assert adapter.name == name and adapter.projector_last == last
        assert adapter.vision_modes == MODES
        assert isinstance(model.get_submodule(last), torch.nn.Linear)
        deepstack = adapter.deepstack_projectors(model)
        assert deepstack == (() if arch == "glm4v" else ("model.visual.deepstack_merger_list.0.linear_fc2",))
        assert all(isinstance(model.get_submodule(p), torch.nn.Linear) for p in deepstack)
    assert set(MROPE_ARCHS) <= set(vlmcp.hf.supported_model_types())


@pytest.mark.parametrize("arch", ARCHS)
def test_positions_are_the_models_own_per_sample(arch):
    """Interleaved M-RoPE from the model's rope index on each sample alone, (3, 1, N) into the text model."""
    model = tiny_model(arch, torch.float64)
    vlmcp.hf.parallelize(model, None)
    inputs, labels, cu = synthetic_row(model, hf_cases.PACKED)
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    assert batch.model_inputs["position_ids"].shape == (3, 1, batch.shard.num_tokens)
    for s in range(len(cu) - 1):
        a, b = int(cu[s]), int(cu[s + 1])
        sample = hf_qwen3_cases._sample_inputs(model, inputs, cu)[s]
        own, _ = model.model.get_rope_index(sample["input_ids"], sample["mm_token_type_ids"],
                                            image_grid_thw=sample.get("image_grid_thw"))
        assert torch.equal(batch.position_ids[:, a:b], own[:, 0])


def test_dummy_vision_gives_every_deepstack_merger_a_zero_gradient():
    base = tiny_model("qwen3_vl", torch.float64)
    plain, dummy = copy.deepcopy(base), copy.deepcopy(base)
    vlmcp.hf.parallelize(plain, None)
    vlmcp.hf.parallelize(dummy, None, dummy_vision=True)
    inputs, labels, cu = synthetic_row(base, ((9,), (14,)))  # no image anywhere
    losses = []
    for m in (plain, dummy):
        batch = vlmcp.hf.shard_inputs(m, inputs, None, labels=labels, cu_seqlens=cu)
        loss, _ = vlmcp.cp_cross_entropy(m(**batch.model_inputs).logits[0], batch.labels, None)
        loss.backward()
        losses.append(float(loss.detach()))
    assert losses[0] == losses[1]
    deep = list(dummy.model.visual.deepstack_merger_list.parameters())
    assert deep and all(p.grad is not None and not p.grad.any() for p in deep)
    assert all(p.grad is not None and not p.grad.any() for p in dummy.model.visual.parameters())
    assert all(p.grad is None for p in plain.model.visual.parameters())


def test_fsdp2_dp2_cp2_text_only_replica():
    """FSDP2 over DP=2 x CP=2: replica 1 trains a text-only row (dummy ViT pass, deepstack included)."""
    cases = [("qwen3_vl", "ring", "hidden_shard")]
    results = run_on_ranks(hf_cases.fsdp_grid, 4, cases, timeout=240)[0]
    for r in results:
        assert r["loss_rel_error"] <= 1e-9 and r["max_rel_grad_error"] <= 1e-9, r
        assert r["vision_grads"] > 0, r


def test_init_model_qwen3_vl_trains_at_cp2(tmp_path, monkeypatch):
    """``vlmcp init-model --arch qwen3_vl`` + ``train --model`` at CP=2 (hidden_shard: deepstack mergers cut,
    whole samples): the loss falls, and the saved model reloads with the logits it trained to."""
    from tests.test_train_hf import _check_trained, _config, _probe, _run, export_shapes
    from vlmcp.debug.init_model import init_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = init_model("qwen3_vl", tmp_path / "qwen3_vl")
    data = export_shapes(tmp_path / "shapes", 24)
    cfg = _config(model, data, tmp_path / "out", cp=2, vision_mode="hidden_shard", sample_placement="whole")
    summary, index = _run(cfg, 2, _probe)
    _check_trained(summary, index, cfg)
