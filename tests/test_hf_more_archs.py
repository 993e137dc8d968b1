"""InternVL, LLaVA-OneVision/NeXT, SmolVLM/Idefics3, Mistral3 under vlmcp: exact against the unmodified model.

Tiny random models built in code (``tests/hf_archs.py``: ANYRES_ARCHS). One spawned group
per world size runs a whole grid (tests/hf_more_cases.py); the tests below read its
results. Every architecture: every vision mode on ring, Ulysses, packed rows with a
text-only sample, whole and auto placement, P = 2 and 3; the variants (LLaVA-NeXT,
Idefics3) share their family's adapter and get a few cases.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools

import pytest
import torch

pytest.importorskip("transformers")

import vlmcp  # noqa: E402
import vlmcp.hf  # noqa: E402
from tests import hf_more_cases  # noqa: E402
from tests.hf_archs import ANYRES_ARCHS  # noqa: E402
from tests.hf_more_cases import ROWS  # noqa: E402
from vlmcp.debug.parity.hf import HFParityCase  # noqa: E402
from vlmcp.debug.synthetic import synthetic_images, synthetic_row  # noqa: E402
from vlmcp.debug.tiny import tiny_model  # noqa: E402
from vlmcp.grads import GradRule, grad_rule, restore_grad_tags  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402

MODES = ("replicate", "allreduce_hook", "broadcast", "scatter", "hidden_shard")
MAIN = ("internvl", "llava_onevision", "smolvlm", "mistral3")
"""One per family; LLaVA-NeXT and Idefics3 share their family's adapter."""


def _case(arch, attention="ring", mode="replicate", rows="packed", placement="split"):
    return HFParityCase(model=f"hf:{arch}", attention=attention, vision_mode=mode,
                        samples=ROWS[arch][rows], sample_placement=placement)


def _failures(results: list[dict]) -> list[str]:
    return [f"{r['model']} {r['attention']} {r['vision_mode']} placement={r['sample_placement']} "
            f"samples={r['samples']}: loss {r['loss_rel_error']:.1e}, grad {r['max_rel_grad_error']:.1e} "
            f"({r['worst_param']})" for r in results if not r["passed"]]


P2_CASES = (
    [_case(a, "ring", m) for a in MAIN for m in MODES]
    + [_case(a, "ulysses", m) for a in MAIN for m in ("scatter", "hidden_shard")]
    + [_case(a, b, m, rows="mixed", placement=p) for a in MAIN
       for b, m, p in (("ring", "broadcast", "whole"), ("ulysses", "allreduce_hook", "auto"))]
    + [_case("llava_next", "ring", "hidden_shard"), _case("idefics3", "ulysses", "broadcast"),
       _case("llava_next", "ulysses", "scatter", "mixed", "whole"),
       _case("idefics3", "ring", "scatter", "mixed", "auto")]
)
DUMMY_CASES = list(zip(ANYRES_ARCHS, itertools.cycle(("hidden_shard", "scatter")), strict=False))
P3_CASES = [_case(a, b, m, rows=r, placement=p) for a, b, m, r, p in (
    ("internvl", "ulysses", "scatter", "packed", "split"),
    ("llava_onevision", "ring", "hidden_shard", "mixed", "auto"),
    ("smolvlm", "ulysses", "hidden_shard", "packed", "split"),
    ("mistral3", "ring", "allreduce_hook", "mixed", "auto"))]


@pytest.fixture(scope="module")
def p2():
    return run_on_ranks(hf_more_cases.suite, 2, P2_CASES, DUMMY_CASES, list(MODES), timeout=300)[0]


@pytest.fixture(scope="module")
def p3():
    return run_on_ranks(hf_more_cases.parity_grid, 3, P3_CASES, timeout=240)[0]


def test_parity_p2_every_family_mode_backend_and_placement(p2):
    results = p2["parity"]
    assert len(results) == len(P2_CASES)
    assert not _failures(results), "\n".join(_failures(results))
    for r in results:  # the vision tower was trained, not skipped
        assert r["vision_params_with_grad"] > 0, r
    auto = [r for r in results if r["sample_placement"] == "auto"]
    assert auto and all(r["whole"][-1] == -1 and min(r["whole"][:-1]) >= 0 for r in auto), auto
    whole = [r for r in results if r["sample_placement"] == "whole"]
    assert whole and all(min(r["whole"]) >= 0 for r in whole)


def test_parity_p3(p3):
    assert len(p3) == len(P3_CASES)
    assert not _failures(p3), "\n".join(_failures(p3))


def test_dummy_vision_zero_grads_and_the_same_loss(p2):
    """A text-only row with the dummy ViT pass (FSDP's case): same loss, every vision parameter the
    real step trains (image_newline included) gets an exact zero gradient."""
    assert [r["case"][0] for r in p2["dummy"]] == list(ANYRES_ARCHS)
    for r in p2["dummy"]:
        assert r["loss_diff"] == 0.0 and r["trained"] > 0 and not r["no_grad"] and not r["not_zero"], r


def test_image_newline_is_a_vision_parameter_in_every_mode(p2):
    """LLaVA-OneVision's image_newline: the mode's rule (FULL under allreduce_hook, this rank's columns
    under hidden_shard) and, after reduce_gradients, the single-process gradient."""
    by_mode = {r["mode"]: r for r in p2["newline"]}
    assert list(by_mode) == list(MODES)
    want = {"replicate": "share", "allreduce_hook": "full", "broadcast": "share", "scatter": "share",
            "hidden_shard": "partitioned"}
    for mode, r in by_mode.items():
        assert r["rule"] == want[mode] and r["width"] == (24 if mode == "hidden_shard" else 48), r
        assert r["kept_from_ddp"] == (mode == "hidden_shard"), r  # its slice differs per CP rank
        assert r["err"] <= 1e-12 and r["norm"] > 0, r


# --- one process -------------------------------------------------------------------------------


def test_adapters_are_registered():
    llava = ("model.language_model", "model.multi_modal_projector.linear_2")
    idefics = ("model.text_model", "model.connector.modality_projection.proj")
    want = {"internvl": llava, "llava_onevision": llava, "llava_next": llava, "smolvlm": idefics,
            "idefics3": idefics, "mistral3": llava}
    for arch in ANYRES_ARCHS:
        model = tiny_model(arch)
        adapter = vlmcp.hf.adapter_for(model)
        assert (adapter.name, adapter.language_model, adapter.projector_last) == (arch, *want[arch])
        assert adapter.vision_modes == MODES
        assert isinstance(model.get_submodule(adapter.projector_last), torch.nn.Linear)
        for path in adapter.vision_modules:
            model.get_submodule(path)
    assert set(ANYRES_ARCHS) <= set(vlmcp.hf.supported_model_types())


@pytest.mark.parametrize("arch", ["llava_onevision", "llava_next"])
def test_anyres_token_counts_match_the_model(arch):
    """Note [vlmcp anyres tokens]: counts from image_sizes alone equal what get_image_features packs,
    over sizes that pick every pinpoint, unpad either side, shrink (OneVision) or not, single and
    multi-image samples."""
    model = tiny_model(arch, torch.float64)
    adapter = vlmcp.hf.adapter_for(model)
    g = torch.Generator().manual_seed(0)
    plain = dataclasses.replace(adapter, onevision=False)  # no anyres_max shrink
    shrunk = unpadded = 0
    for h, w in itertools.product((3, 8, 13, 16, 21, 30), (2, 8, 11, 17, 24, 37)):
        for images in ([(h, w)], [(h, w), (w, h)]) if adapter.onevision else ([(h, w)],):
            pixels, ids = synthetic_images(adapter, model, images, g)
            with torch.no_grad():
                got = [f.shape[0] for f in model.model.get_image_features(**pixels).pooler_output]
            units = adapter.image_tokens(model, pixels)
            assert [len(i) for i in ids] == got and sum(units) == sum(got), (images, got, units)
            assert len(units) == (1 if adapter.onevision else len(images))  # a multi-image sample: one unit
        gh, gw = adapter._grid(model.config, (h, w))
        full = 16 + gh * 4 * (gw * 4 + 1)  # 4x4 patches per tile, a newline per row
        unpadded += plain.tokens_of(model.config, (h, w), True) < full
        shrunk += adapter.tokens_of(model.config, (h, w), True) < plain.tokens_of(model.config, (h, w), True)
    assert unpadded > 0 and (shrunk > 0) == adapter.onevision


def test_image_newline_rule_survives_a_copy():
    """The newline's rule is recorded on the base model (own parameters only): restored after a copy."""
    model = tiny_model("llava_onevision", torch.float64)
    vlmcp.hf.parallelize(model, None, vision_mode="allreduce_hook")
    assert grad_rule(model.model.image_newline) is GradRule.FULL
    twin = copy.deepcopy(model)
    for p in twin.parameters():
        p.__dict__.pop("_vlmcp_grad_tag", None)  # what a re-created parameter looks like
    assert grad_rule(twin.model.image_newline) is GradRule.SHARE
    restore_grad_tags(twin)
    assert grad_rule(twin.model.image_newline) is GradRule.FULL
    assert grad_rule(twin.model.language_model.layers[0].self_attn.q_proj.weight) is GradRule.SHARE


@pytest.mark.parametrize("arch, segment", [("internvl", (2,)), ("smolvlm", (1, 2)), ("mistral3", (2, 3)),
                                           ("llava_onevision", (6, 20))])
def test_whole_placement_one_process_and_the_vit_call_without_kwargs(arch, segment):
    """These forwards call get_image_features without **kwargs: the base model's pre-hook hands the
    wrapper the CP context (here: a one-process dummy pass must zero the features)."""
    model = vlmcp.hf.parallelize(tiny_model(arch, torch.float64), None, dummy_vision=True)
    inputs, labels, cu = synthetic_row(model, ((9,), (14,)))
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    assert set(vlmcp.hf.parallel_state(model).adapter.pixel_keys) <= set(batch.model_inputs)
    features = model.model(**batch.model_inputs).image_outputs.pooler_output
    assert sum(f.numel() for f in features) == 0  # InternVL: one tensor, the others a tuple per image
    assert model.model._vlmcp_vision_context is None  # forgotten after the call
    inputs, labels, cu = synthetic_row(model, ((3, segment, 4), (5,)))
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu, sample_placement="whole")
    assert batch.model_inputs["input_ids"].shape[1] == inputs["input_ids"].shape[1]


@pytest.mark.parametrize("arch, change, match", [
    ("llava_onevision", lambda i: i.update(pixel_values=i["pixel_values"].flatten(0, 1)),
     r"pixel_values must be \(images, tiles, 3, H, W\)"),
    ("llava_onevision", lambda i: i.update(batch_num_images=torch.tensor([5])),
     r"batch_num_images \[5\] counts 5"),
    ("llava_onevision", lambda i: i.update(pixel_values=i["pixel_values"][:, :1]), "holds 1 tiles per image"),
    ("mistral3", lambda i: i.update(image_sizes=i["image_sizes"] * 4), "exceed pixel_values"),
    ("smolvlm", lambda i: i.update(pixel_values=i["pixel_values"][0]), r"must be \(batch, tiles"),
    ("internvl", lambda i: i.update(pixel_values=i["pixel_values"][..., :6]), "square patch grid"),
])
def test_bad_image_inputs_are_named(arch, change, match):
    model = vlmcp.hf.parallelize(tiny_model(arch, torch.float64), None)
    inputs, labels, cu = synthetic_row(model, ROWS[arch]["packed"][:1])
    change(inputs)
    with pytest.raises(ValueError, match=match):
        vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)


def test_mistral3_image_rows_are_several_runs_with_text_between():
    """[IMG_BREAK]/[IMG_END] are text: sharded, trained on no target, the [IMG] runs replicated."""
    model = tiny_model("mistral3", torch.float64)
    inputs, labels, cu = synthetic_row(model, ((2, (2, 3), 3),))
    ids = inputs["input_ids"][0].tolist()
    assert ids[2:2 + 8] == [120, 120, 120, 121, 120, 120, 120, 122]  # 2 rows of 3 tokens
    assert (labels[0, 2:10] == -100).all()


def test_cli_verify_model_uses_the_familys_row(capsys):
    """``vlmcp verify --model hf:mistral3`` (or a directory of one) builds its row from its tiny registry
    entry, by ``config.model_type``: Mistral3's images are (rows, cols) of tokens, not Qwen grids."""
    import json

    from vlmcp.cli import main

    assert main(["verify", "--model", "hf:mistral3", "--cp", "2", "--vision-mode", "scatter",
                 "--attention", "ulysses", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["passed"] and result["max_rel_grad_error"] <= 1e-9 and result["cp"] == 2
    assert result["samples"] == json.loads(json.dumps(ROWS["mistral3"]["packed"]))
    assert main(["verify", "--model", "hf:internvl2"]) != 0
    assert "hf:smolvlm" in capsys.readouterr().err
