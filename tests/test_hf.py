"""Hugging Face VLMs (Qwen2-VL, Qwen2.5-VL, LLaVA) under vlmcp: exact against the unmodified model.

Tiny random models built in code (no hub download). One spawned group per world size
runs a whole grid (tests/hf_cases.py); the tests below read its results.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import vlmcp  # noqa: E402
import vlmcp.hf  # noqa: E402
from tests import hf_cases  # noqa: E402
from tests.hf_archs import TINY_ARCHS  # noqa: E402
from vlmcp.debug.parity.hf import HFParityCase  # noqa: E402
from vlmcp.debug.synthetic import synthetic_row  # noqa: E402
from vlmcp.debug.tiny import tiny_model  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402

MODES = ("replicate", "allreduce_hook", "broadcast", "scatter", "hidden_shard")
BACKENDS = ("ring", "ulysses")


def _case(arch, attention="ring", mode="replicate", dtype="float64", rows="packed", gc=False,
          placement="split"):
    return HFParityCase(model=f"hf:{arch}", attention=attention, vision_mode=mode, dtype=dtype,
                        gradient_checkpointing=gc, samples=hf_cases.ROWS[rows], sample_placement=placement)


def _failures(results: list[dict]) -> list[str]:
    return [f"{r['model']} {r['attention']} {r['vision_mode']} {r['dtype']} gc={r['gradient_checkpointing']} "
            f"placement={r['sample_placement']} "
            f"samples={r['samples']}: loss {r['loss_rel_error']:.1e}, grad {r['max_rel_grad_error']:.1e} "
            f"({r['worst_param']})" for r in results if not r["passed"]]


P2_CASES = (
    [_case(a, b, m) for a in TINY_ARCHS for b in BACKENDS for m in MODES]
    + [_case(a, rows=r) for a in TINY_ARCHS for r in ("prompt_first", "two_images")]
    + [_case(a, "ulysses", "scatter", dtype="float32") for a in TINY_ARCHS]
    + [_case(a, "ring", "replicate", dtype="float32") for a in TINY_ARCHS]
    + [_case(a, "ring", m, gc=True) for a in TINY_ARCHS for m in ("replicate", "hidden_shard")]
)
WHOLE_ARCHS = ("qwen2_vl", "llava")
P2_WHOLE_CASES = (
    [_case(a, b, m, rows="mixed", placement=p) for a in WHOLE_ARCHS for b in BACKENDS for m in MODES
     for p in ("whole", "auto")]
    + [_case(a, "ring", m, rows="lone_image", placement="whole") for a in WHOLE_ARCHS for m in MODES]
    + [_case("qwen2_vl", "ulysses", "scatter", dtype="float32", rows="mixed", placement="auto")]
)
P3_CASES = [_case(a, b, m) for a in TINY_ARCHS for b in BACKENDS for m in MODES] + [
    _case("qwen2_5_vl", "ulysses", "broadcast", gc=True),
    _case("qwen2_vl", "ulysses", "hidden_shard", rows="mixed", placement="auto"),  # whole [0, 2, 2, 1, -1]
    _case("llava", "ring", "scatter", rows="mixed", placement="whole")]  # whole [1, 1, 2, 2, 0]


@pytest.fixture(scope="module")
def p2():
    return run_on_ranks(hf_cases.suite, 2, P2_CASES + P2_WHOLE_CASES, timeout=240)[0]


@pytest.fixture(scope="module")
def p3():
    return run_on_ranks(hf_cases.parity_grid, 3, P3_CASES, timeout=240)[0]


def test_parity_p2_every_arch_backend_mode_dtype_row_and_checkpointing(p2):
    results = p2["parity"][:len(P2_CASES)]
    assert len(p2["parity"]) == len(P2_CASES) + len(P2_WHOLE_CASES)
    assert not _failures(results), "\n".join(_failures(results))
    for r in results:  # the vision tower was trained, not skipped
        assert r["vision_params_with_grad"] > 0, r


def test_parity_p2_whole_and_auto_sample_placement(p2):
    results = p2["parity"][len(P2_CASES):]
    assert [r["sample_placement"] for r in results] == [c.sample_placement for c in P2_WHOLE_CASES]
    assert not _failures(results), "\n".join(_failures(results))
    for r in results:
        assert r["vision_params_with_grad"] > 0, r
        if r["samples"] == [list(s) for s in hf_cases.LONE_IMAGE]:
            # rank 1 holds no image token, yet joined every collective and its dual
            assert r["whole"] == [0, 1] and r["image_tokens_per_rank"][1] == 0, r
        elif r["sample_placement"] == "whole":  # the long sample on rank 0, the short ones on rank 1
            assert r["whole"] == [1, 1, 1, 1, 0], r
        else:  # auto: the long sample (and its image) split, the short ones whole, two per rank
            assert r["whole"] == [0, 0, 1, 1, -1], r
    worst = max(r["max_rel_grad_error"] for r in results if r["dtype"] == "float64")
    assert worst <= 1e-9


def test_shard_inputs_sample_placement_errors():
    model = tiny_model("qwen2_vl", torch.float32)
    vlmcp.hf.parallelize(model, None)
    inputs, labels, cu = synthetic_row(model, hf_cases.MIXED)
    with pytest.raises(ValueError, match="sample_placement must be one of"):
        vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu, sample_placement="all")
    other = tiny_model("llava", torch.float32)
    other.config.model_type = "my_vlm"  # no adapter: HF's own get_image_features, all images everywhere
    vlmcp.hf.parallelize(other, None)
    one, one_labels, _ = synthetic_row(other, hf_cases.PROMPT_FIRST)
    with pytest.raises(ValueError, match="needs a vlmcp adapter"):
        vlmcp.hf.shard_inputs(other, one, None, labels=one_labels, sample_placement="whole")


def test_parity_p3_every_arch_backend_mode(p3):
    assert len(p3) == len(P3_CASES)
    assert not _failures(p3), "\n".join(_failures(p3))
    assert [r["whole"] for r in p3[-2:]] == [[0, 2, 2, 1, -1], [1, 1, 2, 2, 0]]


def test_tolerances_are_the_issues(p2):
    by_dtype = {r["dtype"]: r["tolerance"] for r in p2["parity"]}
    assert by_dtype == {"float64": 1e-9, "float32": 1e-5}


def test_bad_input_errors_before_any_collective(p2):
    assert p2["bad_inputs"] == {k: "ok" for k in p2["bad_inputs"]}
    assert set(p2["bad_inputs"]) >= {"image tokens", "labels", "cu_seqlens", "architecture", "no adapter"}


def test_placeholder_vlm_without_adapter_is_exact_in_replicate(p2):
    loss_err, grad_err = p2["placeholder"]
    assert loss_err <= 1e-9 and grad_err <= 1e-9, p2["placeholder"]


def test_fsdp2_dp2_cp2_loss_scaled_by_p():
    cases = [("qwen2_vl", "ring", "replicate"), ("llava", "ulysses", "allreduce_hook"),
             ("qwen2_5_vl", "ring", "hidden_shard")]
    results = run_on_ranks(hf_cases.fsdp_grid, 4, cases, timeout=240)[0]
    for r in results:
        assert r["loss_rel_error"] <= 1e-9 and r["max_rel_grad_error"] <= 1e-9, r
        assert r["vision_grads"] > 0, r
        assert r["refused"] in ("", "ok"), r
    assert any(r["refused"] == "ok" for r in results)


# --- one process: integration details ---------------------------------------------------------


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_vit_keeps_its_own_attention(arch):
    model = tiny_model(arch, torch.float32)
    vlmcp.hf.parallelize(model, None)
    assert model.config.text_config._attn_implementation == "vlmcp"
    assert model.config.vision_config._attn_implementation == "sdpa"
    marked = [n for n, m in model.named_modules() if getattr(m, "_vlmcp_cp_attention", False)]
    assert marked and all(n.startswith("model.language_model.") for n in marked)
    inputs, _, _ = synthetic_row(model, ((5, (1, 4, 4), 3),))  # no plan: text before the image is fine
    # the ViT alone, outside any CP call: it would raise if it went through vlmcp attention
    feats = model.model.get_image_features(**{k: inputs[k] for k in ("pixel_values", "image_grid_thw")
                                              if k in inputs})
    assert sum(f.shape[0] for f in feats.pooler_output) == int((inputs["input_ids"] == 120).sum())


def test_model_called_without_the_layout_raises():
    model = tiny_model("qwen2_vl", torch.float32)
    vlmcp.hf.parallelize(model, None)
    with pytest.raises(RuntimeError, match="shard_inputs"):
        model(input_ids=torch.tensor([[5, 6, 7, 8]]))


def test_shard_inputs_contract_one_process():
    model = tiny_model("qwen2_vl", torch.float64)
    vlmcp.hf.parallelize(model, None)
    inputs, labels, cu = synthetic_row(model, hf_cases.ROWS["packed"])
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    n = batch.shard.num_tokens
    assert batch.labels.shape == (n,) and batch.model_inputs["input_ids"].shape == (1, n)
    assert batch.model_inputs["position_ids"].shape == (3, 1, n)
    assert int(batch.model_inputs["position_ids"].min()) >= 0  # never -1 into HF code
    assert "attention_mask" not in batch.model_inputs
    out = model(**batch.model_inputs)
    assert out.logits.shape == (1, n, model.config.text_config.vocab_size)


def test_shift_hf_labels_per_sample():
    labels = torch.tensor([10, 11, -100, 13, 20, 21, 22])
    cu = torch.tensor([0, 4, 7])
    assert vlmcp.hf.shift_hf_labels(labels, cu).tolist() == [11, -100, 13, -100, 21, 22, -100]


def test_parallelize_twice_raises():
    model = tiny_model("llava", torch.float32)
    with pytest.raises(ValueError, match="parallelized already"):
        vlmcp.hf.parallelize(vlmcp.hf.parallelize(model, None), None)


def test_cli_verify_model_dir(tmp_path, capsys):
    import json

    from vlmcp.cli import main

    tiny_model("qwen2_vl", torch.float64).save_pretrained(tmp_path / "m")
    assert main(["verify", "--model", str(tmp_path / "m"), "--cp", "2", "--vision-mode", "broadcast",
                 "--sample-placement", "whole", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["passed"] and result["max_rel_grad_error"] <= 1e-9 and result["cp"] == 2
    assert result["sample_placement"] == "whole" and min(result["whole"]) >= 0


def test_cli_verify_model_errors(capsys):
    from vlmcp.cli import main

    assert main(["verify", "--model", "hf:gemma"]) != 0
    assert "hf:qwen2_vl" in capsys.readouterr().err
    assert main(["verify", "--model", "hf:llava", "--dtype", "bfloat16"]) != 0
    assert "float64 or float32" in capsys.readouterr().err


def test_rows_put_the_prompt_before_the_images():
    inputs, _, _ = synthetic_row(tiny_model("qwen2_vl"), hf_cases.PACKED)
    ids = inputs["input_ids"][0]
    assert int(ids[0]) != 120 and int((ids == 120).nonzero()[0]) > 0  # the prompt comes first


def test_dummy_vision_pass_gives_zero_vision_grads_and_the_same_loss():
    import copy

    base = tiny_model("qwen2_5_vl", torch.float64)
    plain, dummy = copy.deepcopy(base), copy.deepcopy(base)
    vlmcp.hf.parallelize(plain, None)
    vlmcp.hf.parallelize(dummy, None, dummy_vision=True)
    inputs, labels, cu = synthetic_row(base, ((9,), (14,)))  # no image anywhere
    losses = []
    for m in (plain, dummy):
        batch = vlmcp.hf.shard_inputs(m, inputs, None, labels=labels, cu_seqlens=cu)
        assert ("pixel_values" in batch.model_inputs) == (m is dummy)
        loss, _ = vlmcp.cp_cross_entropy(m(**batch.model_inputs).logits[0], batch.labels, None)
        loss.backward()
        losses.append(float(loss.detach()))
    assert losses[0] == losses[1]
    assert all(p.grad is None for p in plain.model.visual.parameters())
    assert all(p.grad is not None and not p.grad.any() for p in dummy.model.visual.parameters())
