"""vlmcp.hf never trains silently wrong: unsupported token mixers and input keys are refused, named.

One process, no ranks: ``parallelize(model, None)`` (and a 1-rank gloo group) runs the
token-mixer audit (Note [vlmcp HF token mixers]) before it changes anything, and
``shard_inputs`` classifies every input key by the adapter before any collective. Tiny
Qwen3.5 (Gated DeltaNet) and LFM2-VL (short convolutions) models are built in code from
transformers configs; measured without the audit, they trained at P=2 with 0.70 and 0.33
relative gradient errors and no warning.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch import nn

pytest.importorskip("transformers")

from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402

import vlmcp.hf  # noqa: E402
from tests import hf_cases  # noqa: E402
from tests.hf_archs import TINY_ARCHS  # noqa: E402
from vlmcp.debug.synthetic import synthetic_row  # noqa: E402
from vlmcp.debug.tiny import tiny_config, tiny_model  # noqa: E402
from vlmcp.hf import adapters  # noqa: E402
from vlmcp.hf.adapters import HFAdapter, InputKind  # noqa: E402
from vlmcp.hf.adapters.llava import LlavaAdapter  # noqa: E402
from vlmcp.hf.layers import audit as mixers  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _private_registries(monkeypatch):
    """Adapters and mixers registered by a test stay in that test."""
    monkeypatch.setattr(adapters, "_ADAPTERS", dict(adapters._ADAPTERS))
    monkeypatch.setattr(mixers, "_REGISTERED", dict(mixers._REGISTERED))


def tiny_qwen3_5(layers: int = 8):
    """Qwen3.5: Gated DeltaNet in 3 of every 4 layers (transformers' default layer_types)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_conv_kernel_dim=4,
                linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                linear_num_value_heads=4, max_position_embeddings=256,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
                                 "partial_rotary_factor": 1.0})
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, in_channels=3, patch_size=2,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=32, num_position_embeddings=16)
    config = Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=120, video_token_id=121,
                           vision_start_token_id=122, vision_end_token_id=123)
    torch.manual_seed(0)
    return Qwen3_5ForConditionalGeneration(config).to(torch.float64).eval()


def tiny_lfm2_vl():
    """LFM2-VL: short convolutions in layers 0 and 2, attention in 1 and 3."""
    from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration

    text = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                block_auto_adjust_ff_dim=False,
                layer_types=["conv", "full_attention", "conv", "full_attention"])
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_patches=16, patch_size=2)
    config = Lfm2VlConfig(text_config=text, vision_config=vision, image_token_id=120,
                          projector_hidden_size=32)
    torch.manual_seed(0)
    return Lfm2VlForConditionalGeneration(config).to(torch.float64).eval()


def _untouched(model: nn.Module) -> None:
    """A refused parallelize changed nothing."""
    assert model.config.text_config._attn_implementation != "vlmcp"
    assert not any(getattr(m, "_vlmcp_cp_attention", False) for m in model.modules())
    with pytest.raises(ValueError, match="not parallelized"):
        vlmcp.hf.parallel_state(model)


# --- the token-mixer audit in parallelize --------------------------------------------------------


def test_qwen3_5_gated_deltanet_runs_under_cp_through_the_registry():
    """vlmcp.hf.layers.gdn registers Qwen3.5's Gated DeltaNet: all six layers prepared, the two attention
    layers
    marked (parity: tests/test_hf_qwen3_5.py)."""
    from vlmcp.hf.layers import gdn

    model = tiny_qwen3_5()
    vlmcp.hf.parallelize(model, None)
    layers = model.model.language_model.layers
    assert [i for i, m in enumerate(layers) if getattr(m, "linear_attn", None) is not None
            and m.linear_attn.forward.__func__ is gdn.cp_forward] == [0, 1, 2, 4, 5, 6]
    assert [n for n, m in model.named_modules() if getattr(m, "_vlmcp_cp_attention", False)] == [
        "model.language_model.layers.3.self_attn", "model.language_model.layers.7.self_attn"]


def test_a_gated_deltanet_vlmcp_does_not_know_is_refused():
    """A Gated DeltaNet class that is not registered (a copy of Qwen3.5's under another name) is refused,
    named compactly: first three paths and a count, the class, the kind, why."""
    model = tiny_qwen3_5()
    _rename_classes(model, "linear_attn", "OtherGatedDeltaNet")
    with pytest.raises(ValueError) as err:
        vlmcp.hf.parallelize(model, None)
    msg = str(err.value)
    assert ("OtherGatedDeltaNet [linear_attention] at model.language_model.layers.0.linear_attn, "
            "model.language_model.layers.1.linear_attn, model.language_model.layers.2.linear_attn "
            "and 3 more: a recurrent state carried along the sequence") in msg, msg
    assert "Qwen3_5ForConditionalGeneration (model_type='qwen3_5'): 6 module(s)" in msg
    assert "layers.3" not in msg and "layers.7" not in msg  # the attention layers pass
    _untouched(model)


def test_an_m_rope_model_without_an_adapter_takes_its_own_rope_index_or_is_refused_by_name():
    """The long tail (Note [vlmcp HF long tail: M-RoPE through the model's own rope index]): Qwen3.5 as if
    vlmcp had no adapter runs through its own get_rope_index in replicate; a rope index needing a
    parameter the generic path cannot pass, and M-RoPE without any rope index, are refused by name."""
    from vlmcp.hf.adapters import generic
    from vlmcp.hf.adapters.generic import MRopePlaceholderAdapter

    model = tiny_qwen3_5(layers=4)
    del adapters._ADAPTERS["qwen3_5"]  # a private copy (the fixture): as if vlmcp had no Qwen3.5 adapter
    adapter = vlmcp.hf.adapter_for(model)
    assert isinstance(adapter, MRopePlaceholderAdapter) and adapter.vision_modes == ("replicate",)
    assert adapter.rope_keywords == generic.ROPE_KEYWORDS  # Qwen3.5 takes all four
    with pytest.raises(ValueError, match="vision_mode='scatter' needs a vlmcp adapter"):
        vlmcp.hf.parallelize(copy.deepcopy(model), None, vision_mode="scatter")
    odd = copy.deepcopy(model)
    odd.model.get_rope_index = lambda input_ids, image_grid_thw, frame_rate: None
    with pytest.raises(ValueError, match=r"model_type='qwen3_5'\) has no vlmcp adapter and its get_rope_index"
                                         r".*needs \['frame_rate'\]"):
        vlmcp.hf.parallelize(odd, None)
    _untouched(odd)
    bare = copy.deepcopy(model)
    bare.model.get_rope_index = None
    del bare.model.get_rope_index  # the instance attribute, then the class's: hide it
    type(bare.model).get_rope_index, saved = property(lambda self: (_ for _ in ()).throw(AttributeError)), \
        type(bare.model).get_rope_index
    try:
        with pytest.raises(ValueError, match=r"computes multimodal \(M-RoPE\) position ids \(rope "):
            vlmcp.hf.parallelize(bare, None)
    finally:
        type(bare.model).get_rope_index = saved
    vlmcp.hf.parallelize(model, None)  # the audit runs Qwen3.5's Gated DeltaNet as registered


def _rename_classes(model: nn.Module, attr: str, name: str) -> None:
    """Give each layer's ``attr`` module an unregistered subclass named ``name`` (a mixer vlmcp lacks)."""
    for layer in model.model.language_model.layers:
        if getattr(layer, attr, None) is not None:
            getattr(layer, attr).__class__ = type(name, (type(getattr(layer, attr)),), {})


def test_audit_runs_on_a_one_rank_gloo_group():
    model = tiny_qwen3_5(layers=4)
    _rename_classes(model, "linear_attn", "OtherGatedDeltaNet")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"OtherGatedDeltaNet \[linear_attention\]"):
            vlmcp.hf.parallelize(model, dist.group.WORLD)
    finally:
        dist.destroy_process_group()
    _untouched(model)


def test_lfm2_vl_short_convolutions_vlmcp_does_not_know_are_refused():
    model = tiny_lfm2_vl()
    _rename_classes(model, "conv", "OtherShortConv")
    with pytest.raises(ValueError) as err:
        vlmcp.hf.parallelize(model, None)
    msg = str(err.value)
    assert ("OtherShortConv [short_conv] at model.language_model.layers.0.conv, "
            "model.language_model.layers.2.conv: a convolution over neighbouring tokens") in msg, msg
    assert "model_type='lfm2_vl'" in msg and "2 module(s)" in msg
    _untouched(model)


def test_lfm2_vl_image_inputs_its_adapter_does_not_know_are_refused_by_name():
    """LFM2-VL's adapter takes its SigLIP2 NaFlex inputs (tests/test_hf_lfm2_vl.py); any other key is
    refused by name, not dropped."""
    model = tiny_lfm2_vl()
    vlmcp.hf.parallelize(model, None)
    inputs = {"input_ids": torch.tensor([[5, 6, 120, 120, 120, 120, 7]]),
              "pixel_values": torch.zeros(1, 16, 12, dtype=torch.float64),
              "pixel_attention_mask": torch.ones(1, 16, dtype=torch.bool),
              "spatial_shapes": torch.tensor([[4, 4]]), "image_sizes": torch.tensor([[8, 8]])}
    with pytest.raises(ValueError, match="image_sizes"):
        vlmcp.hf.shard_inputs(model, inputs, None)


def test_lfm2_vl_short_convolutions_run_under_cp_through_the_registry():
    """vlmcp.hf.layers.short_conv registers LFM2's short convolution (parity: tests/test_hf_qwen3_5.py)."""
    from vlmcp.hf.layers import short_conv

    model = tiny_lfm2_vl()
    vlmcp.hf.parallelize(model, None)
    layers = model.model.language_model.layers
    assert [i for i, m in enumerate(layers) if getattr(m, "conv", None) is not None
            and m.conv.forward.__func__ is short_conv.cp_forward] == [0, 2]


def test_a_registered_mixer_class_is_accepted_and_prepared():
    # what a later CP implementation of a mixer does; this stand-in only records the call
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    prepared = []
    vlmcp.hf.register_mixer(Lfm2ShortConv, prepared.append)
    model = tiny_lfm2_vl()
    vlmcp.hf.parallelize(model, None)
    layers = model.model.language_model.layers
    assert prepared == [layers[0].conv, layers[2].conv]
    assert [n for n, m in model.named_modules() if getattr(m, "_vlmcp_cp_attention", False)] == [
        "model.language_model.layers.1.self_attn", "model.language_model.layers.3.self_attn"]


def test_per_layer_sliding_window_accepted_from_the_attention_module():
    """A sliding layer whose attention module has a ``sliding_window`` passes it to vlmcp's attention."""
    model = tiny_model(tiny_config("qwen2_vl", text_config=dict(
        use_sliding_window=True, sliding_window=16, max_window_layers=1)))
    assert model.config.text_config.layer_types == ["full_attention", "sliding_attention"]
    vlmcp.hf.parallelize(model, None)
    attn = [layer.self_attn for layer in model.model.language_model.layers]
    assert [getattr(a, "_vlmcp_cp_attention", False) for a in attn] == [True, True]
    assert [a.sliding_window for a in attn] == [None, 16]


def test_a_window_other_than_the_audited_one_raises_at_run_time():
    model = vlmcp.hf.parallelize(tiny_model("llava", torch.float64), None)
    inputs, labels, cu = synthetic_row(model, ((9,),))
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    model.model.language_model.layers[0].self_attn.sliding_window = 4  # set after the audit
    with pytest.raises(RuntimeError, match=r"called vlmcp attention with sliding_window=None but its "
                                           r"sliding_window attribute is 4"):
        model(**batch.model_inputs)


@pytest.mark.parametrize("layer_type, kind", [("sliding_attention", "sliding_window"),
                                              ("chunked_attention", "local_attention"),
                                              ("linear_attention", "linear_attention")])
def test_per_layer_type_refused_from_the_config(layer_type, kind):
    # LLaMA's attention has no sliding_window attribute (its window would come from HF's mask alone,
    # which vlmcp does not use): the layer type alone must refuse the layer
    model = tiny_model("llava", torch.float32)
    model.config.text_config.layer_types = ["full_attention", layer_type]
    with pytest.raises(ValueError, match=rf"LlamaDecoderLayer \[{kind}\] at model\.language_model\.layers"
                                         rf"\.1: layer type '{layer_type}'"):
        vlmcp.hf.parallelize(model, None)
    _untouched(model)


def test_config_sliding_window_without_layer_types_still_refused():
    model = tiny_model("llava", torch.float32)
    model.config.text_config.sliding_window = 32
    with pytest.raises(ValueError, match=r"\[sliding_window\] at model\.language_model: "
                                         r"text_config\.sliding_window=32"):
        vlmcp.hf.parallelize(model, None)


def _attention_forward_without_the_interface(self, hidden_states, position_embeddings, attention_mask=None,
                                             **kwargs):
    q = self.q_proj(hidden_states)
    return self.o_proj(q), None


def _attention_forward_that_names_the_interface_but_skips_it(self, hidden_states, position_embeddings,
                                                             attention_mask=None, **kwargs):
    if hidden_states is None:  # loads the name (the audit's structural check passes), never calls it
        return ALL_ATTENTION_FUNCTIONS
    return self.o_proj(self.q_proj(hidden_states)), None


def test_attention_that_bypasses_the_attention_interface_refused():
    model = tiny_model("llava", torch.float32)
    attn = model.model.language_model.layers[0].self_attn
    attn.__class__ = type("HandRolledAttention", (type(attn),),
                          {"forward": _attention_forward_without_the_interface})
    with pytest.raises(ValueError, match=r"HandRolledAttention \[custom_attention\] at "
                                         r"model\.language_model\.layers\.0\.self_attn: its forward does not "
                                         r"dispatch through transformers' ALL_ATTENTION_FUNCTIONS"):
        vlmcp.hf.parallelize(model, None)
    _untouched(model)


def test_a_marked_attention_that_never_calls_vlmcp_attention_raises_at_its_first_forward():
    model = tiny_model("llava", torch.float32)
    attn = model.model.language_model.layers[1].self_attn
    attn.__class__ = type("SneakyAttention", (type(attn),),
                          {"forward": _attention_forward_that_names_the_interface_but_skips_it})
    vlmcp.hf.parallelize(model, None)  # the structural check is fooled on purpose
    inputs, labels, cu = synthetic_row(model, hf_cases.PROMPT_FIRST)
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    with pytest.raises(RuntimeError, match="SneakyAttention.forward returned without calling vlmcp "):
        model(**batch.model_inputs)


def test_conv_and_unknown_parameter_owners_in_a_layer_refused():
    class TokenShift(nn.Module):  # owns a parameter, name unknown: cannot be proven per-token
        def __init__(self):
            super().__init__()
            self.mix = nn.Parameter(torch.zeros(48))

    model = tiny_model("llava", torch.float32)
    layers = model.model.language_model.layers
    layers[0].mlp.conv = nn.Conv1d(48, 48, 3, groups=48)
    layers[1].shift = TokenShift()
    with pytest.raises(ValueError) as err:
        vlmcp.hf.parallelize(model, None)
    msg = str(err.value)
    assert "Conv1d [short_conv] at model.language_model.layers.0.mlp.conv" in msg, msg
    assert "TokenShift [unknown] at model.language_model.layers.1.shift: owns parameters" in msg, msg


def test_a_layer_without_attention_and_one_with_two_refused():
    model = tiny_model("llava", torch.float32)
    layers = model.model.language_model.layers
    layers[1].cross_attn = copy.deepcopy(layers[1].self_attn)  # two attention modules in layer 1
    del layers[0].self_attn.q_proj  # layer 0: a fused projection, no q/k/v triple
    layers[0].self_attn.qkv_proj = nn.Linear(48, 80)
    with pytest.raises(ValueError) as err:
        vlmcp.hf.parallelize(model, None)
    msg = str(err.value)
    assert "LlamaDecoderLayer [no_attention] at model.language_model.layers.0: no token mixer" in msg, msg
    assert "LlamaDecoderLayer [several_mixers] at model.language_model.layers.1: 2 token mixers" in msg, msg


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_supported_models_pass_the_audit_with_one_attention_per_layer(arch):
    model = tiny_model(arch, torch.float64)
    mixers_found = mixers.audit_token_mixers(model, "model.language_model")
    n = model.config.text_config.num_hidden_layers
    assert [m.path for m in mixers_found] == [f"model.language_model.layers.{i}.self_attn" for i in range(n)]
    vlmcp.hf.parallelize(model, None)
    inputs, labels, cu = synthetic_row(model, hf_cases.ROWS["packed"])
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    assert torch.isfinite(model(**batch.model_inputs).logits).all()


def test_register_mixer_checks_its_arguments():
    with pytest.raises(TypeError, match="nn.Module subclass"):
        vlmcp.hf.register_mixer("Lfm2ShortConv", lambda m: None)
    with pytest.raises(TypeError, match="callable"):
        vlmcp.hf.register_mixer(nn.Conv1d, None)


# --- input keys in shard_inputs ------------------------------------------------------------------


def _placeholder_llava():
    model = tiny_model("llava", torch.float64)
    model.config.model_type = "my_vlm"  # no adapter: the placeholder default
    return vlmcp.hf.parallelize(model, None)


@pytest.mark.parametrize("key, value, why", [
    ("image_sizes", torch.tensor([[8, 8]]), "per-image sizes of any-resolution images"),
    ("pixel_attention_mask", torch.ones(1, 8, 8, dtype=torch.bool), "padding mask of variable-size images"),
    ("spatial_shapes", torch.tensor([[4, 4]]), "per-image patch grids of native-resolution images"),
    ("token_type_ids", None, "per-token types the model reads"),
    ("mm_token_type_ids", None, "multimodal token types the model reads"),
    ("image_grid_thw", torch.tensor([[1, 4, 4]]), "M-RoPE positions need an adapter"),
    ("my_extra", torch.zeros(3), "a key vlmcp does not know"),
])
def test_a_key_the_placeholder_adapter_cannot_handle_is_refused_naming_it(key, value, why):
    model = _placeholder_llava()
    inputs, labels, cu = synthetic_row(model, hf_cases.PROMPT_FIRST)
    inputs[key] = torch.zeros_like(inputs["input_ids"]) if value is None else value
    with pytest.raises(ValueError) as err:
        vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    msg = str(err.value)
    assert msg.startswith(f"inputs[{key!r}] is not handled for LlavaForConditionalGeneration "
                          "(model_type='my_vlm', vlmcp adapter 'placeholder'): "), msg
    assert why in msg and "This adapter takes input_ids, attention_mask, pixel_values" in msg, msg


@pytest.mark.parametrize("arch", ["qwen2_vl", "llava"])
def test_an_unknown_key_is_refused_for_registered_adapters_too(arch):
    model = vlmcp.hf.parallelize(tiny_model(arch, torch.float64), None)
    inputs, labels, cu = synthetic_row(model, hf_cases.PROMPT_FIRST)
    inputs["image_sizes"] = torch.tensor([[8, 8]])
    with pytest.raises(ValueError, match=rf"inputs\['image_sizes'\] is not handled .* adapter '{arch}'"):
        vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)


def test_none_values_are_ignored():
    model = _placeholder_llava()
    inputs, labels, cu = synthetic_row(model, hf_cases.PROMPT_FIRST)
    inputs.update(image_sizes=None, pixel_attention_mask=None, my_extra=None)
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    assert set(batch.model_inputs) == {"input_ids", "position_ids", "use_cache", "pixel_values", "vlmcp_cp"}


def test_videos_are_refused_where_the_adapter_takes_none():
    model = vlmcp.hf.parallelize(tiny_model("llava", torch.float64), None)
    inputs, labels, cu = synthetic_row(model, hf_cases.PROMPT_FIRST)
    assert model_adapter(model).input_kind("pixel_values_videos") is InputKind.VIDEO
    assert not model_adapter(model).takes_videos
    for key in ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
        with pytest.raises(NotImplementedError, match=rf"videos are not supported under vlmcp CP for "
                                                      rf"LlavaForConditionalGeneration .*\['{key}'\]"):
            vlmcp.hf.shard_inputs(model, {**inputs, key: torch.ones(1, 3)}, None, labels=labels,
                                  cu_seqlens=cu)
    qwen = vlmcp.hf.parallelize(tiny_model("qwen2_vl", torch.float64), None)
    inputs, labels, cu = synthetic_row(qwen, hf_cases.PROMPT_FIRST)
    with pytest.raises(ValueError, match="without pixel_values_videos"):
        vlmcp.hf.shard_inputs(qwen, {**inputs, "video_grid_thw": torch.ones(1, 3)}, None, labels=labels,
                              cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"inputs\['second_per_grid_ts'\] is not handled .*Qwen2.5-VL"):
        vlmcp.hf.shard_inputs(qwen, {**inputs, "second_per_grid_ts": torch.ones(1)}, None, labels=labels,
                              cu_seqlens=cu)
    tt = inputs["mm_token_type_ids"].clone()
    tt[0, 0] = 2
    with pytest.raises(ValueError, match="position 0 has 2 but is a text token"):
        vlmcp.hf.shard_inputs(qwen, {**inputs, "mm_token_type_ids": tt}, None, labels=labels, cu_seqlens=cu)


def test_mm_token_type_ids_must_mark_exactly_the_image_tokens():
    model = vlmcp.hf.parallelize(tiny_model("qwen2_vl", torch.float64), None)
    inputs, labels, cu = synthetic_row(model, hf_cases.PROMPT_FIRST)
    tt = inputs["mm_token_type_ids"].clone()
    tt[0, 0] = 1
    with pytest.raises(ValueError, match="position 0 has 1 but is a text token"):
        vlmcp.hf.shard_inputs(model, {**inputs, "mm_token_type_ids": tt}, None, labels=labels, cu_seqlens=cu)


def model_adapter(model):
    return vlmcp.hf.parallel_state(model).adapter


def test_adapters_declare_their_keys():
    qwen, llava = adapters.adapter_for(tiny_model("qwen2_vl")), adapters.adapter_for(tiny_model("llava"))
    kinds = {k: qwen.input_kind(k) for k in ("input_ids", "attention_mask", "mm_token_type_ids",
                                             "pixel_values", "image_grid_thw", "video_grid_thw")}
    assert kinds == {"input_ids": InputKind.TOKENS, "attention_mask": InputKind.CONSUMED,
                     "mm_token_type_ids": InputKind.CONSUMED, "pixel_values": InputKind.IMAGE,
                     "image_grid_thw": InputKind.IMAGE, "video_grid_thw": InputKind.VIDEO}
    assert qwen.takes_videos and qwen.input_kind("second_per_grid_ts") is None  # Qwen2.5-VL's only
    assert adapters.QWEN2_5_VL.input_kind("second_per_grid_ts") is InputKind.VIDEO
    assert llava.input_kind("mm_token_type_ids") is None and llava.input_kind("image_grid_thw") is None
    assert llava.input_kind("pixel_values") is InputKind.IMAGE
    with pytest.raises(ValueError, match="must hold 'input_ids'"):
        HFAdapter(name="x", model_types=("x",), token_keys=("ids",))
    with pytest.raises(ValueError, match=r"input keys \['pixel_values'\] are in more than one"):
        HFAdapter(name="x", model_types=("x",), consumed_keys=("attention_mask", "pixel_values"))


def test_an_adapter_token_key_is_sharded_and_passed_on():
    model = tiny_model("llava", torch.float64)
    model.config.model_type = "llava_with_types"
    vlmcp.hf.register_adapter(dataclasses.replace(
        LlavaAdapter(name="llava_with_types", model_types=("llava_with_types",)),
        token_keys=("input_ids", "token_type_ids")))
    vlmcp.hf.parallelize(model, None)
    inputs, labels, cu = synthetic_row(model, hf_cases.ROWS["packed"])
    types = (inputs["input_ids"] == 120).long() + 5
    batch = vlmcp.hf.shard_inputs(model, {**inputs, "token_type_ids": types}, None, labels=labels,
                                  cu_seqlens=cu)
    local = batch.model_inputs["token_type_ids"]
    assert local.shape == batch.model_inputs["input_ids"].shape
    assert torch.equal(local[0], batch.shard.shard(types[0], fill=0))



REFUSED_BY_NAME = ("ernie4_5_vl_moe", "step3p7", "minicpmv4_6", "molmo2", "mistral4")
"""Issue 27's model types vlmcp refuses by name (vlmcp/hf/adapters/refused.py)."""


def _meta_model(model_type: str):
    """The model of ``model_type``'s default config, on the meta device (no memory, no weights)."""
    from transformers import AutoModelForImageTextToText
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(CONFIG_MAPPING[model_type]())


@pytest.mark.parametrize("model_type", REFUSED_BY_NAME)
def test_issue_27_model_types_refused_by_name_with_the_reason(model_type):
    """Without the table some would pass the placeholder default (Step3 and Molmo 2 did)."""
    model = _meta_model(model_type)
    with pytest.raises(ValueError, match=f"model_type='{model_type}'.*is refused by vlmcp: ") as e:
        vlmcp.hf.parallelize(model, None)
    assert adapters.REFUSED[model_type].split(":")[0] in str(e.value)
    assert model_type not in vlmcp.hf.supported_model_types()


@pytest.mark.parametrize("model_type, layer, kind", [
    ("mistral_large4", "MistralLarge4TextDecoderLayer", "sparse_attention"),
])
def test_sparse_attention_layers_refused_by_the_audit(model_type, layer, kind):
    """Mistral Large 4's DeepSeek sparse attention (an indexer picks each query's keys): refused per layer."""
    with pytest.raises(ValueError, match=rf"{layer} \[{kind}\] at model.language_model.layers.0"):
        vlmcp.hf.parallelize(_meta_model(model_type), None)


def test_minimax_m3_sparse_layers_refused_and_its_full_layers_run():
    """MiniMax-M3-VL's "minimax_m3_sparse" layers (a block-sparse indexer) are refused by layer; the tiny
    model of full-attention layers runs (its parity: tests/test_hf_new_archs.py)."""
    sparse = tiny_model(tiny_config("minimax_m3_vl", text_config=dict(
        layer_types=["minimax_m3_sparse", "full_attention"])), torch.float64)
    with pytest.raises(ValueError, match=r"layers.0: layer type 'minimax_m3_sparse': indexed/compressed"):
        vlmcp.hf.parallelize(sparse, None)
    vlmcp.hf.parallelize(tiny_model("minimax_m3_vl", torch.float64), None)


def test_attention_logit_softcapping_refused_not_ignored():
    """Gemma 2-style ``softcap`` reaching vlmcp's attention: refused, never computed without it."""
    from vlmcp.hf.attention import CONTEXT_KEY, vlmcp_attention_forward

    model = vlmcp.hf.parallelize(tiny_model("llava", torch.float64), None)
    inputs, labels, cu = synthetic_row(model, ((9,),))
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    attn = model.model.language_model.layers[0].self_attn
    n = batch.model_inputs["input_ids"].shape[1]
    q, kv = torch.zeros(1, 6, n, 8, dtype=torch.float64), torch.zeros(1, 2, n, 8, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="softcap=50.0"):
        vlmcp_attention_forward(attn, q, kv, kv, None, softcap=50.0,
                                **{CONTEXT_KEY: batch.model_inputs[CONTEXT_KEY]})
