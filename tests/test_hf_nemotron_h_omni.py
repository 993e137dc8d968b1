"""Mamba-2 (SSD) under CP and Nemotron-H-Omni, exact against transformers.

The layer: transformers' ``NemotronHMamba2Mixer`` run by vlmcp's CP forward (conv halo + SSD state
passing, or the Ulysses road) against the same module on each sample alone, in float64 with the
float32 islands lifted (Note [vlmcp float64 parity: float32 islands]): outputs, and the gradients of
the input and of every parameter summed over ranks, at P = 1, 2, 3 and 4, on packed rows with
replicated image runs, odd lengths (padding), chunks shorter than the conv halo, whole/auto placement
and sharded images. The whole tiny Nemotron-H-Omni (:mod:`vlmcp.debug.tiny.nemotron`: Mamba-2, MoE,
attention, Mamba-2, MLP; RADIO ViT) with images: loss and every gradient against the unmodified model at
P = 2 and 3, ring in every vision mode, Ulysses, whole placement. One spawned group per P runs its grid
(tests/ssd_cases.py). The kernel itself is checked against transformers' ``mamba2_chunk_scan``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import vlmcp  # noqa: E402
import vlmcp.hf  # noqa: E402
from tests import ssd_cases  # noqa: E402
from tests.test_gdn_cp import BYTE_ROWS  # noqa: E402
from vlmcp.debug.parity.hf import HFParityCase  # noqa: E402
from vlmcp.debug.synthetic import synthetic_row  # noqa: E402
from vlmcp.debug.tiny import tiny_model  # noqa: E402
from vlmcp.mixers import chunk_ssd, ssd_segment_maps  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402

PACKED = [[("t", 60), ("i", 48), ("t", 91), ("i", 32), ("t", 141)],  # two images, text between; odd lengths
          [("t", 251)],                                               # text only
          [("i", 24), ("t", 181)]]                                    # starts with an image
TINY = [[("t", 5), ("i", 8), ("t", 3)], [("t", 2)], [("t", 9)]]     # chunks shorter than the conv halo
TEXT = [[("t", 301)], [("t", 170)]]


def _layer(samples, dtype="float64", **kw):
    return {"samples": samples, "dtype": dtype, **kw}


# SMALL (4 heads in 2 groups) under Ulysses takes the all-to-all road at P = 2 and 4, state passing at P = 3;
# WIDE (24 heads in 12 groups) takes the road at every P
LAYER = {
    2: [_layer(PACKED), _layer(TINY), _layer(PACKED, placement="whole"), _layer(PACKED, placement="auto"),
        _layer(PACKED, "float32"), _layer(PACKED, backend="ulysses"),
        _layer(PACKED, dims="wide", backend="ulysses")],
    3: [_layer(PACKED), _layer(TINY), _layer(PACKED, strategy="shard"), _layer(PACKED, backend="ulysses"),
        _layer(PACKED, dims="wide", backend="ulysses")],
    4: [_layer(PACKED), _layer(TEXT), _layer(PACKED, dims="wide", backend="ulysses")],
}
BYTES = [BYTE_ROWS[2], BYTE_ROWS[3]]  # 1k and 8k tokens, an image and two samples: the same segments

SAMPLES = ((7, (4, 4), 40, (2, 4), 23), (37,), (5, (4, 8), 61))  # 193 tokens, odd lengths, a text-only sample


def _model(attention="ring", mode="replicate", placement="split", dtype="float64", strategy="replicate"):
    return HFParityCase(model="hf:nemotron_h_omni", attention=attention, vision_mode=mode, dtype=dtype,
                        samples=SAMPLES, sample_placement=placement, image_strategy=strategy)


MODES = ("replicate", "allreduce_hook", "broadcast", "scatter", "hidden_shard")
MODEL = {2: [_model("ring", m) for m in MODES] + [_model("ulysses"), _model(placement="whole"),
                                                   _model(dtype="float32")],
         3: [_model("ring", m) for m in MODES] + [_model("ulysses", "scatter"), _model(placement="auto"),
                                                   _model(strategy="shard")],
         4: []}
TOL = {"float64": 1e-12, "float32": 2e-5}
MODEL_TOL = {"float64": 1e-12, "float32": 1e-5}


@pytest.fixture(scope="module")
def groups():
    return {P: run_on_ranks(ssd_cases.suite, P, LAYER[P], BYTES if P < 4 else None, MODEL[P],
                            _model() if P == 2 else None, timeout=280)[0]
            for P in sorted(LAYER)}


@pytest.mark.parametrize("P", sorted(LAYER))
def test_mamba2_layer_matches_transformers(groups, P):
    """Outputs, input gradient and the gradient of every parameter (in_proj, conv weight and bias, dt_bias,
    A_log, D, the gated norm, out_proj), summed over ranks, equal transformers' module on each sample."""
    results = groups[P]["layer"]
    assert len(results) == len(LAYER[P])
    for r in results:
        errs = {k: v for k, v in r.items() if k == "out" or k.startswith("grad_")}
        assert len(errs) == 10 and max(errs.values()) <= TOL[r["dtype"]], r
        wide = r.get("dims") == "wide"
        road = r.get("backend") == "ulysses" and (wide or P != 3)
        assert r["ulysses_road"] == int(road), r


@pytest.mark.parametrize("P", [2, 3])
def test_mamba2_bytes_do_not_grow_with_length(groups, P):
    """Forward: one all-gather of the conv halo and one of the [a | U] maps; backward: their reduce-scatters.
    The same bytes at 1k and 8k tokens; the maps' exactly P x max(maps per rank) x H x (1 + P N) x 8."""
    rows = groups[P]["bytes"]
    assert [r["L"] for r in rows] == [1024, 8192]
    d = ssd_cases.LONG
    for r in rows:
        assert sorted(c[0] for c in r["calls"]) == ["all_gather", "all_gather", "reduce_scatter",
                                                    "reduce_scatter"], r
        maps = [c for c in r["calls"] if len(c[1]) == 3]  # (maps, H, 1 + P N)
        assert [c[1][1:] for c in maps] == [(d.heads, 1 + d.head_dim * d.state)] * 2, r
        gathered = [c for c in maps if c[0] == "all_gather"]
        assert gathered[0][2] == r["map_bytes"] == P * max(r["export_sizes"]) * d.heads * (
            1 + d.head_dim * d.state) * 8
    assert [c[2] for c in rows[0]["calls"]] == [c[2] for c in rows[1]["calls"]]


@pytest.mark.parametrize("P", [2, 3])
def test_nemotron_h_omni_matches_the_unmodified_model(groups, P):
    results = groups[P]["model"]
    assert len(results) == len(MODEL[P])
    bad = [f"{r['attention']} {r['vision_mode']} {r['dtype']} {r['sample_placement']} {r['strategy']}: loss "
           f"{r['loss_rel_error']:.1e}, grad {r['max_rel_grad_error']:.1e} ({r['worst_param']})"
           for r in results if max(r["loss_rel_error"], r["max_rel_grad_error"]) > MODEL_TOL[r["dtype"]]]
    assert not bad, "\n".join(bad)
    for r in results:
        assert r["cp"] == P and r["vision_params_with_grad"] > 0, r
        # Ulysses: 12 heads in 6 groups, the all-to-all road in both Mamba-2 layers
        assert r["ulysses_road"] == (2 if r["attention"] == "ulysses" else 0), r
    assert {r["vision_mode"] for r in results} == set(MODES)


def test_unmodified_mamba2_under_cp_is_wrong(groups):
    """The trap vlmcp's mixer closes: transformers' Mamba-2 forward on each rank's shard (zero state at every
    shard, no conv halo) trains with a gradient error of order one, and no error is raised."""
    trap = groups[2]["trap"]
    assert trap["max_rel_grad_error"] > 0.1 and not trap["passed"], trap


# --- one process -------------------------------------------------------------------------------


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _ssd_inputs(T, H=4, P=3, G=2, N=5, seed=0):
    x, dt_raw = _rand(T, H, P, seed=seed), _rand(T, H, seed=seed + 1)
    A = -torch.rand(H, generator=torch.Generator().manual_seed(seed + 2), dtype=torch.float64) * 3 - 0.5
    B, C = _rand(T, G, N, seed=seed + 3), _rand(T, G, N, seed=seed + 4)
    return [t.requires_grad_() for t in (x, dt_raw, A, B, C)]


@pytest.mark.parametrize("chunk", [8, 64])
def test_ssd_kernel_matches_transformers_float64(chunk):
    """Output, final state and every gradient (initial state, dt bias and the clamp included) against
    transformers' ``mamba2_chunk_scan``, in float64; grouped B and C, length not a multiple of the chunk."""
    from transformers.models.nemotron_h import modeling_nemotron_h as m

    from vlmcp.debug.float64 import in_dtype

    T = 70
    x, dt_raw, A, B, C = _ssd_inputs(T)
    bias = _rand(4, seed=7)
    s0 = _rand(1, 4, 3, 5, seed=8).requires_grad_()
    leaves = [x, dt_raw, A, B, C, s0]
    scan = in_dtype(m.mamba2_chunk_scan, torch.float64)
    ref, ref_final = scan(x[None], dt_raw[None], A, B[None], C[None], chunk_size=16, dt_bias=bias,
                          dt_softplus=True, initial_states=s0, dt_limit=(0.05, float("inf")),
                          return_final_states=True)
    assert ref.dtype == torch.float64
    dout, dfinal = _rand(*ref.shape, seed=9), _rand(*ref_final.shape, seed=10)
    want = torch.autograd.grad((ref * dout).sum() + (ref_final * dfinal).sum(), leaves)
    dt = torch.nn.functional.softplus(dt_raw + bias).clamp(min=0.05)
    y, final, _ = chunk_ssd(x, dt, A, B, C, torch.tensor([0, T]), s0, chunk_size=chunk)
    assert (y - ref[0]).abs().max() < 1e-13 and (final - ref_final).abs().max() < 1e-13
    got = torch.autograd.grad((y * dout[0]).sum() + (final * dfinal).sum(), leaves)
    for w, g in zip(want, got, strict=True):
        assert (w - g).abs().max() <= 1e-12 * w.abs().max()


def test_ssd_kernel_matches_transformers_float32():
    """In float32 (transformers as shipped): the same to float32 rounding; the scan accumulates in float32."""
    from transformers.models.nemotron_h import modeling_nemotron_h as m

    T = 100
    x, dt_raw, A, B, C = (t.detach().float() for t in _ssd_inputs(T))
    dt = torch.nn.functional.softplus(dt_raw)
    ref = m.mamba2_chunk_scan(x[None], dt[None], A, B[None], C[None], chunk_size=32)
    y, final, _ = chunk_ssd(x, dt, A, B, C, torch.tensor([0, T]))
    assert y.dtype == final.dtype == torch.float32 and (y - ref[0]).abs().max() < 1e-4 * ref.abs().max()


def test_packed_segments_reset_and_maps_are_affine():
    """Segments of a packed row (one empty) equal each run alone; [a | U] and a_t give any incoming state's
    run: S_out = exp(a) S_in + U, y_t = y0_t + exp(a_t) S_in C_t."""
    T, cu = 140, torch.tensor([0, 40, 40, 97, 140])
    x, dt_raw, A, B, C = (t.detach() for t in _ssd_inputs(T))
    dt = torch.nn.functional.softplus(dt_raw)
    sm = ssd_segment_maps(x, dt, A, B, C, cu, chunk_size=16)
    for s in range(4):
        a, b = int(cu[s]), int(cu[s + 1])
        S = _rand(1, 4, 3, 5, seed=s)
        y, final, _ = chunk_ssd(x[a:b], dt[a:b], A, B[a:b], C[a:b], torch.tensor([0, b - a]), S,
                                chunk_size=16)
        decay, U = sm.maps[s, :, :1], sm.maps[s, :, 1:]
        assert torch.allclose((decay.exp() * S[0].flatten(1) + U).view(4, 3, 5), final[0], atol=1e-13, rtol=0)
        read = torch.einsum("thn,hpn->thp", C[a:b].repeat_interleave(2, 1) * sm.log_decay[a:b, :, None].exp(),
                            S[0])
        assert torch.allclose(sm.out0[a:b] + read, y, atol=1e-13, rtol=0)
    assert sm.maps[1].abs().max() == 0  # the empty segment: no decay, no state


def test_mamba2_layer_one_process():
    """P = 1: vlmcp's forward of a packed row equals transformers' module on each sample alone."""
    r = ssd_cases.compare_layer(None, _layer(PACKED))
    errs = {k: v for k, v in r.items() if k == "out" or k.startswith("grad_")}
    assert len(errs) == 10 and max(errs.values()) <= 1e-12, r


def test_adapter_tokens_and_layers():
    model = tiny_model("nemotron_h_omni", torch.float64)
    adapter = vlmcp.hf.adapter_for(model)
    assert adapter.name == "nemotron_h_omni" and adapter.base_model == ""
    assert isinstance(model.get_submodule(adapter.projector_last), torch.nn.Linear)
    assert adapter.vision_module_paths(model)[-1] == "vision_final_layernorm"  # an MTP config builds it
    inputs, labels, cu = synthetic_row(model, SAMPLES)
    pixels = {k: inputs[k] for k in adapter.pixel_keys}
    assert adapter.image_tokens(model, pixels) == [4, 2, 8]
    # one image of the packed row gives exactly the features that image gives alone
    one = adapter.select_images(pixels, [1])
    assert one["image_grid_hw"].tolist() == [[2, 4]] and one["pixel_values"].shape[0] == 8
    features = model.get_image_features(**pixels).pooler_output
    assert torch.allclose(model.get_image_features(**one).pooler_output[0], features[1], atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="multiple of 2"):
        adapter.image_tokens(model, {"pixel_values": torch.zeros(6, 12),
                                     "image_grid_hw": torch.tensor([[2, 3]])})


def test_parallelize_prepares_mamba2_and_refuses_videos_and_audio():
    """parallelize runs both Mamba-2 layers through vlmcp (no layout: an error, not a shard-local scan); a
    video or audio key is refused by name before any collective."""
    model = tiny_model("nemotron_h_omni", torch.float64)
    vlmcp.hf.parallelize(model, None)
    layers = model.language_model.model.layers
    assert [i for i, b in enumerate(layers) if getattr(b.mixer, "_vlmcp_cp_mamba2", False)] == [0, 3]
    assert getattr(layers[2].mixer, "_vlmcp_cp_attention", False)
    with pytest.raises(RuntimeError, match="no CP layout"):
        layers[0].mixer(torch.zeros(1, 5, 48, dtype=torch.float64))
    inputs, labels, cu = synthetic_row(model, SAMPLES)
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    assert model(**batch.model_inputs).logits.shape[1] == batch.shard.num_tokens
    with pytest.raises(NotImplementedError, match="pixel_values_videos"):
        vlmcp.hf.shard_inputs(model, {**inputs, "pixel_values_videos": torch.zeros(1, 2, 12, 4, 4)}, None,
                              labels=labels, cu_seqlens=cu)
    with pytest.raises(ValueError, match="input_features.*audio"):
        vlmcp.hf.shard_inputs(model, {**inputs, "input_features": torch.zeros(1, 8, 4)}, None, labels=labels,
                              cu_seqlens=cu)


def _with_mixer(layer: int, mixer: torch.nn.Module):
    model = tiny_model("nemotron_h_omni", torch.float64)
    model.language_model.model.layers[layer].mixer = mixer
    return model


def test_other_mamba_classes_and_kimi_delta_attention_are_refused_by_name():
    """Only NemotronHMamba2Mixer is registered: transformers' plain Mamba2Mixer in a layer, or Kimi Delta
    Attention (per-channel decay), is refused naming the layer, the class and why."""
    from transformers import KimiLinearConfig, Mamba2Config
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    plain = Mamba2Mixer(Mamba2Config(hidden_size=48, num_heads=12, head_dim=4, n_groups=6, state_size=8,
                                     expand=1), layer_idx=0)
    with pytest.raises(ValueError, match=r"Mamba2Mixer \[state_space\] at language_model\.model\.layers\.0\."
                                         r"mixer: .*not registered"):
        vlmcp.hf.parallelize(_with_mixer(0, plain), None)
    kda = KimiLinearDeltaAttention(KimiLinearConfig(hidden_size=48, num_attention_heads=4, linear_num_heads=4,
                                                    linear_head_dim=8, num_hidden_layers=1,
                                                    layer_types=["linear_attention"]), layer_idx=0)
    with pytest.raises(ValueError, match=r"KimiLinearDeltaAttention \[linear_attention\] at language_model\."
                                         r"model\.layers\.3\.mixer: .*Kimi Delta Attention decays per key"):
        vlmcp.hf.parallelize(_with_mixer(3, kda), None)

