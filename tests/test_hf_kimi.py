"""Kimi-K2.5 under vlmcp: DeepSeek-V3 MLA (V of its own head dim) and MoE, exact at P=2 and 3.

A tiny random Kimi-K2.5 built in code (:func:`vlmcp.debug.tiny.tiny_config`: MoonViT on 2x2 px
patches merged 2x2 per LLM token; 2 LLM layers, the second MoE, MLA with q/k of 12 and V of 6
per head). One spawned P=2 group runs the grid (ring and Ulysses; replicate, scatter and
hidden_shard; replicated and sharded image tokens) on a packed row of an image sample, a
text-only sample and a two-image sample, each compared in float64 with the unmodified model
(loss and every gradient).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import vlmcp.hf  # noqa: E402
from tests.hf_cases import PACKED, parity_grid  # noqa: E402
from vlmcp.debug.parity.hf import HFParityCase  # noqa: E402
from vlmcp.debug.synthetic import synthetic_row  # noqa: E402
from vlmcp.debug.tiny import tiny_model  # noqa: E402
from vlmcp.hf.layers.audit import audit_token_mixers  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402


def _case(attention, mode, strategy="replicate"):
    return HFParityCase(model="hf:kimi_k25", attention=attention, vision_mode=mode, samples=PACKED,
                        image_strategy=strategy)


CASES = [_case(b, m) for b in ("ring", "ulysses") for m in ("replicate", "scatter")] + [
    _case("ring", "hidden_shard", "shard"), _case("ulysses", "broadcast", "shard"),
    HFParityCase(model="hf:kimi_k25", attention="ring", vision_mode="scatter", samples=((7,), (9,)))]
"""The last case is a text-only row: the ViT runs the adapter's blank dummy image."""


@pytest.mark.timeout(300)
def test_parity_p2_ring_ulysses_vision_modes():
    results = run_on_ranks(parity_grid, 2, CASES, timeout=260)[0]
    assert len(results) == len(CASES)
    bad = [f"{r['attention']} {r['vision_mode']} {r['image_strategy']}: loss {r['loss_rel_error']:.1e}, "
           f"grad {r['max_rel_grad_error']:.1e} ({r['worst_param']})" for r in results if not r["passed"]]
    assert not bad, "\n".join(bad)
    for r in results[:-1]:
        assert r["max_rel_grad_error"] <= 1e-9 and r["vision_params_with_grad"] > 0, r


P3_CASES = [_case("ring", "replicate"), _case("ring", "scatter"), _case("ring", "hidden_shard", "shard")]
"""P=3: ring only (Ulysses needs the 4 heads divisible by P)."""


@pytest.mark.timeout(300)
def test_parity_p3_ring():
    results = run_on_ranks(parity_grid, 3, P3_CASES, timeout=260)[0]
    assert len(results) == len(P3_CASES)
    for r in results:
        assert r["passed"] and r["max_rel_grad_error"] <= 1e-9 and r["vision_params_with_grad"] > 0, r


def test_mla_attention_that_bypasses_the_interface_is_refused():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    class OwnMLA(DeepseekV3Attention):
        def forward(self, hidden_states, *args, **kwargs):  # attention of its own: no interface call
            return self.o_proj(hidden_states[..., :1].expand(-1, -1, self.o_proj.in_features)), None

    model = tiny_model("kimi_k25", torch.float64)
    layer = model.model.language_model.layers[1]
    own = OwnMLA(layer.self_attn.config, 1).to(torch.float64)
    layer.self_attn = own
    refused = r"OwnMLA \[custom_attention\] at model\.language_model\.layers\.1\.self_attn"
    with pytest.raises(ValueError, match=refused):
        audit_token_mixers(model, "model.language_model")


def test_mla_attention_is_accepted_and_marked():
    model = tiny_model("kimi_k25", torch.float64)
    mixers = audit_token_mixers(model, "model.language_model")
    assert [m.path for m in mixers] == [f"model.language_model.layers.{i}.self_attn" for i in range(2)]
    attn = model.model.language_model.layers[0].self_attn
    assert attn.q_proj is None and attn.v_head_dim != attn.qk_head_dim  # q_lora: q_a_proj/q_b_proj; MLA's V
    vlmcp.hf.parallelize(model, None)
    assert all(getattr(layer.self_attn, "_vlmcp_cp_attention", False)
               for layer in model.model.language_model.layers)


def test_image_tokens_come_from_the_grid():
    model = tiny_model("kimi_k25", torch.float64)
    inputs, _, _ = synthetic_row(model, PACKED)
    adapter = vlmcp.hf.adapter_for(model)
    pixels = {k: inputs[k] for k in ("pixel_values", "image_grid_thw")}
    counts = adapter.image_tokens(model, pixels)
    assert counts == [4, 8, 4]
    assert sum(counts) == int((inputs["input_ids"] == model.config.image_token_id).sum())
    with torch.no_grad():
        feats = model.model.get_image_features(**pixels).pooler_output
    assert [f.shape[0] for f in feats] == counts
