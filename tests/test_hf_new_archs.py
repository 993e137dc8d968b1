"""Issue 27's architectures under vlmcp: exact against the unmodified transformers model, or refused.

Tiny random models built in code (``tests/hf_archs.py``: NEW_ARCHS): Gemma 4 (sliding and full layers,
images bidirectional on the sliding ones only), GLM-4.5V (``glm4v_moe``: an MoE
language model), GLM-4.6V (``glm46v``), Mistral 4 (a ``mistral3`` model over a ``mistral4`` MLA + MoE
language model), MiniMax-M3-VL, Llama 4 (chunked RoPE layers, a NoPE layer with temperature tuning).
One spawned group per world size runs the whole grid
(``tests/hf_new_cases.py``); every case compares loss and every parameter's gradient in float64
with the unmodified model on a packed row with a text-only sample.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import vlmcp.hf  # noqa: E402
from tests import hf_new_cases  # noqa: E402
from tests.hf_archs import NEW_ARCHS  # noqa: E402
from vlmcp.debug.parity.hf import HFParityCase  # noqa: E402
from vlmcp.debug.synthetic import synthetic_row  # noqa: E402
from vlmcp.debug.tiny import VIDEO_ONLY_SAMPLES, tiny_arch, tiny_config, tiny_model  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402

MODES = ("replicate", "allreduce_hook", "broadcast", "scatter", "hidden_shard")


def _case(arch, attention="ring", mode="replicate", strategy="replicate", placement="split"):
    return HFParityCase(model=f"hf:{arch}", attention=attention, vision_mode=mode,
                        samples=tiny_arch(arch).samples, image_strategy=strategy, sample_placement=placement)


def _modes(arch):
    return vlmcp.hf.adapter_for(tiny_model(arch)).vision_modes


def _failures(results: list[dict]) -> list[str]:
    return [f"{r['model']} {r['attention']} {r['vision_mode']} {r['image_strategy']} "
            f"{r['sample_placement']}: "
            f"loss {r['loss_rel_error']:.1e}, grad {r['max_rel_grad_error']:.1e} ({r['worst_param']})"
            for r in results if not r["passed"]]


VARIANTS = {"glm46v": ("replicate", "hidden_shard")}
"""GLM-4.6V shares GLM-4.5V's adapter: two modes of its own."""
P2_CASES = (
    [_case(a, "ring", m) for a in NEW_ARCHS for m in VARIANTS.get(a, _modes(a))]
    + [_case(a, "ulysses", _modes(a)[-1]) for a in NEW_ARCHS]
    # image tokens sharded with the text
    + [_case(a, "ulysses", "broadcast", "shard") for a in ("gemma4", "glm4v_moe", "mistral4")]
    # GLM's videos: frame groups as ViT units, written with the image placeholder
    + [HFParityCase(model=f"hf:{a}", vision_mode="scatter", samples=VIDEO_ONLY_SAMPLES)
       for a in ("glm4v_moe", "glm46v")]
)
P3_CASES = [_case("gemma4", "ulysses", "scatter"), _case("glm4v_moe", "ring", "broadcast"),
            _case("mistral4", "ulysses", "hidden_shard"), _case("llama4", "ring", "replicate"),
            _case("minimax_m3_vl", "ring", "scatter", "shard")]
AUX_ARCHS = [a for a in NEW_ARCHS if a in hf_new_cases.MOE_AUX]


@pytest.fixture(scope="module")
def p2():
    return run_on_ranks(hf_new_cases.suite, 2, P2_CASES, AUX_ARCHS, list(hf_new_cases.RELABELLED),
                        timeout=300)[0]


@pytest.mark.timeout(330)
def test_parity_p2_every_arch_mode_and_backend(p2):
    results = p2["parity"]
    assert len(results) == len(P2_CASES)
    assert not _failures(results), "\n".join(_failures(results))
    for r in results:
        assert r["vision_params_with_grad"] > 0, r
    assert {r["model"] for r in results} == {f"hf:{a}" for a in NEW_ARCHS}


@pytest.mark.timeout(270)
def test_parity_p3():
    results = run_on_ranks(hf_new_cases.parity_grid, 3, P3_CASES, timeout=240)[0]
    assert len(results) == len(P3_CASES)
    assert not _failures(results), "\n".join(_failures(results))


@pytest.mark.timeout(330)
def test_moe_router_aux_loss_matches_the_model(p2):
    assert [r["arch"] for r in p2["aux"]] == AUX_ARCHS
    for r in p2["aux"]:
        assert r["aux"] > 0.1 and r["loss_err"] < 1e-12 and r["max_grad_err"] < 1e-10, r


@pytest.mark.timeout(330)
def test_long_tail_known_families_without_an_adapter_exact(p2):
    """Note [vlmcp HF long tail: image tokens from the row]: LLaVA under an unknown model type packs
    images in two samples (the row's runs give the counts); Qwen2-VL, Qwen3-VL (deepstack) and GLM-4.1V
    under unknown types run through their own get_rope_index (replicate)."""
    got = {r["arch"]: r for r in p2["relabelled"]}
    assert list(got) == list(hf_new_cases.RELABELLED)
    assert got["llava"]["adapter"] == "PlaceholderAdapter"
    assert {got[a]["adapter"] for a in ("qwen2_vl", "qwen3_vl", "glm4v")} == {"MRopePlaceholderAdapter"}
    for r in got.values():
        assert r["passed"] and r["max_rel_grad_error"] <= 1e-9 and r["cp"] == 2, r


def test_adapters_are_registered():
    """Mistral 4's checkpoints are Mistral3 models (a mistral4 text config): Mistral3's adapter."""
    for arch in NEW_ARCHS:
        model = tiny_model(arch)
        adapter = vlmcp.hf.adapter_for(model)
        want = "mistral3" if arch == "mistral4" else arch
        assert adapter.name == want == model.config.model_type and want in vlmcp.hf.supported_model_types()
        for path in adapter.vision_modules:
            model.get_submodule(path)


def _loss(model, row) -> float:
    from vlmcp.debug.float64 import float64_exact, float64_norms
    from vlmcp.debug.parity.hf import reference_step

    float64_norms(model)
    with float64_exact(torch.float64):
        return float(reference_step(model, *row))


def test_llama4_rows_notice_the_temperature_tuning_and_the_chunks():
    """The parity row would catch a wrong NoPE position (its temperature tuning changes the unmodified
    model's loss), and chunks matter: with a chunk shorter than the samples the loss changes, which is
    why vlmcp refuses such rows by name before any collective."""
    base = tiny_model("llama4", torch.float64)
    row = synthetic_row(base, tiny_arch("llama4").samples)
    loss = _loss(base, row)
    flat = tiny_model(tiny_config("llama4", text_config=dict(attn_temperature_tuning=False)), torch.float64)
    assert abs(_loss(flat, row) - loss) > 1e-6
    short = tiny_model(tiny_config("llama4", text_config=dict(attention_chunk_size=8)), torch.float64)
    assert abs(_loss(short, row) - loss) > 1e-6
    vlmcp.hf.parallelize(short, None)
    with pytest.raises(ValueError, match=r"sample 0 has 20 tokens, more than Llama 4's attention_chunk_size"):
        vlmcp.hf.shard_inputs(short, *row[:1], None, labels=row[1], cu_seqlens=row[2])


def test_llama4_forward_mended_and_vision_modes_refused():
    """transformers 5.24's Llama 4 forward raises on every call; parallelize mends that one read. 5.25
    fixed it the same way: nothing is mended there."""
    from transformers import AutoModelForImageTextToText

    from vlmcp.deps import at_least

    config = tiny_config("llama4")
    plain = AutoModelForImageTextToText.from_config(config)
    if at_least("transformers", "5.25"):
        plain(input_ids=torch.tensor([[1, 5, 6]]))
        vlmcp.hf.parallelize(plain, None)
        assert not getattr(plain, "_vlmcp_llama4_forward", False)
    else:
        with pytest.raises(AttributeError, match="image_outputs"):
            plain(input_ids=torch.tensor([[1, 5, 6]]))
        vlmcp.hf.parallelize(plain, None)
        assert plain._vlmcp_llama4_forward
    for mode in ("allreduce_hook", "broadcast", "scatter", "hidden_shard"):
        with pytest.raises(ValueError, match=f"vision_mode='{mode}'"):
            vlmcp.hf.parallelize(AutoModelForImageTextToText.from_config(config), None, vision_mode=mode)


def test_gemma4_images_bidirectional_on_sliding_layers_only():
    """Gemma 4's full-attention layers are causal over images (Gemma 3's are not): the row notices
    (without mm_token_type_ids the unmodified model's loss changes), parallelize marks those layers
    causal, and the configurations not checked under CP are refused by name."""
    from vlmcp.hf.attention import IMAGE_ATTENTION_ATTR

    model = tiny_model("gemma4", torch.float64)
    inputs, labels, cu = synthetic_row(model, tiny_arch("gemma4").samples)
    causal = {k: v for k, v in inputs.items() if k != "mm_token_type_ids"}
    assert abs(_loss(model, (causal, labels, cu)) - _loss(tiny_model("gemma4", torch.float64),
                                                         (inputs, labels, cu))) > 1e-6
    vlmcp.hf.parallelize(model, None)
    layers = model.model.language_model.layers
    assert [getattr(x.self_attn, IMAGE_ATTENTION_ATTR, None) for x in layers] == [None, "causal"] * 2
    assert [x.self_attn.sliding_window for x in layers] == [4, None, 4, None]
    # final_logit_softcapping: the chunked loss applies the cap itself, as the forward does to the logits
    capped = vlmcp.hf.parallelize(tiny_model(tiny_config("gemma4", text_config=dict(
        final_logit_softcapping=0.5)), torch.float64), None)
    batch = vlmcp.hf.shard_inputs(capped, inputs, None, labels=labels, cu_seqlens=cu)
    grads = []
    for chunk_size in (5, None):  # chunked, then the full logits (cap applied by the model's forward)
        capped.zero_grad()
        loss = vlmcp.hf.causal_lm_loss(capped, batch, None, chunk_size=chunk_size).loss
        loss.backward()
        grads.append((float(loss.detach()),
                      [p.grad.clone() for p in capped.parameters() if p.grad is not None]))
    assert capped.config.get_text_config().final_logit_softcapping == 0.5  # restored after the call
    assert abs(grads[0][0] - grads[1][0]) < 1e-12 and len(grads[0][1]) == len(grads[1][1])
    assert all(torch.allclose(a, b, rtol=1e-10, atol=1e-13)
               for a, b in zip(grads[0][1], grads[1][1], strict=True))
    uncapped = vlmcp.hf.causal_lm_loss(vlmcp.hf.parallelize(tiny_model("gemma4", torch.float64), None),
                                       batch, None).loss
    assert abs(float(uncapped) - grads[0][0]) > 1e-3  # the cap changes this row's loss
    # use_bidirectional_attention None (the config's default): every layer causal, as transformers
    def causal_cfg():  # one config per model: parallelize sets its attention implementation
        return tiny_config("gemma4", text_config=dict(use_bidirectional_attention=None))

    plain = tiny_model(causal_cfg(), torch.float64)
    ours = vlmcp.hf.parallelize(tiny_model(causal_cfg(), torch.float64), None)
    assert [getattr(x.self_attn, IMAGE_ATTENTION_ATTR, None) for x in ours.model.language_model.layers] == \
        ["causal"] * 4
    from vlmcp.debug.float64 import float64_exact, float64_norms

    float64_norms(ours)
    batch = vlmcp.hf.shard_inputs(ours, inputs, None, labels=labels, cu_seqlens=cu)
    with float64_exact(torch.float64):
        mine = float(vlmcp.hf.causal_lm_loss(ours, batch, None).loss.detach())
    assert abs(mine - _loss(plain, (inputs, labels, cu))) < 1e-12
    with pytest.raises(ValueError, match="Gemma 4 rows with images need mm_token_type_ids"):
        vlmcp.hf.shard_inputs(model, causal, None, labels=labels, cu_seqlens=cu)
    for text, match in ((dict(use_bidirectional_attention="all"), "use_bidirectional_attention='all'"),
                        (dict(num_kv_shared_layers=2), r"layers.2, model.language_model.layers.3: no token")):
        with pytest.raises(ValueError, match=match):
            vlmcp.hf.parallelize(tiny_model(tiny_config("gemma4", text_config=text), torch.float64), None)


LONG_TAIL_EXACT = ("ovis2", "qianfan_ocr")
"""transformers' image-text-to-text types with no vlmcp adapter that ``python -m vlmcp.debug.long_tail``
measured exact (docs/hf-models.md lists every type and its outcome)."""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_long_tail_coverage_verify_on_tiny_configs():
    """The long tail's coverage: every type without an adapter or a refusal is in the measured list, and
    those measured exact stay exact at P=2 (their default configs shrunk, the adapter-less path)."""
    from vlmcp.debug import long_tail

    assert set(LONG_TAIL_EXACT) <= set(long_tail.long_tail_types())
    results = run_on_ranks(long_tail.long_tail, 2, list(LONG_TAIL_EXACT), timeout=560)[0]
    assert [r["model_type"] for r in results] == list(LONG_TAIL_EXACT)
    assert all(r["status"] == "exact" for r in results), results
