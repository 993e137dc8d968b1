"""``vlmcp plan --model``'s memory estimate (``vlmcp.estimate``): held to the exact saved-bytes counter.

The validation runs tiny models through a real step (``vlmcp.bench.hf.estimate.measure``: the
busiest rank's :class:`~vlmcp.debug.meters.saved_tensors.SavedTensorMeter` bytes) at P=1 in-process
and at P=2 in one spawned group, over architectures x checkpointing x vision mode x
``image_strategy`` (float32, and bfloat16 at P=1), and asks the estimate for the same config and
row: within 10% each.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

from vlmcp.bench.hf import estimate as bench  # noqa: E402
from vlmcp.cli import main  # noqa: E402
from vlmcp.debug.tiny import tiny_archs, tiny_config  # noqa: E402
from vlmcp.estimate import EstimateSetup, estimate_memory, max_seq_len, model_states  # noqa: E402
from vlmcp.estimate.text import text_blocks  # noqa: E402
from vlmcp.estimate.towers import REFUSED, TOWERS  # noqa: E402
from vlmcp.loss import chunk_transient_bytes  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402

pytestmark = pytest.mark.timeout(240)

BOTH = ((False, "replicate", "replicate"), (True, "scatter", "shard"))
TEXT = 100


@pytest.fixture(scope="module")
def measured():
    one = [(1, r) for r in bench.measure(None, list(bench.ARCHS), BOTH, TEXT)]
    one += [(1, r) for r in bench.measure(None, ["qwen2_5_vl", "gemma3"], BOTH, TEXT, "bfloat16")]
    two = run_on_ranks(bench.measure, 2, ["qwen2_vl", "qwen3_vl", "llava"], BOTH, TEXT, timeout=200)[0]
    return one + [(2, r) for r in two]


def test_estimate_within_10_percent_of_the_counter(measured):
    assert len(measured) >= 6
    seen = set()
    for P, row in measured:
        est = bench.predicted(row, P)
        assert abs(est / row["measured"] - 1) < 0.10, (P, row["arch"], row["ckpt"], row["vision_mode"],
                                                       est, row["measured"])
        seen.add((row["arch"], row["ckpt"], P, row["vision_mode"], row["dtype"]))
    assert {s[0] for s in seen} == set(bench.ARCHS) and {s[1] for s in seen} == {False, True}
    assert {s[2] for s in seen} == {1, 2} and {s[3] for s in seen} == {"replicate", "scatter"}
    assert {s[4] for s in seen} == {"float32", "bfloat16"}


def test_checkpointing_and_cp_shrink_the_measured_bytes_as_estimated(measured):
    by = {(P, r["arch"], r["ckpt"]): r for P, r in measured if r["dtype"] == "float32"}
    for arch in ("qwen2_vl", "llava"):
        assert by[(1, arch, True)]["measured"] < by[(1, arch, False)]["measured"] / 4
        assert by[(2, arch, False)]["measured"] < by[(1, arch, False)]["measured"]


def test_every_architecture_of_the_table_is_estimated_or_refused_by_name():
    for arch in tiny_archs():
        config = tiny_config(arch, **bench.OVERRIDES.get(arch, {}))
        setup = EstimateSetup(seq_len=512, cp=2, visual_tokens=16, dtype="float32",
                              images=5 if arch == "llava_next" else None)  # its tiles
        if arch in TOWERS:
            est = estimate_memory(config, setup)
            assert est.saved > 0 and est.peak > est.saved
        else:
            assert arch in REFUSED
            with pytest.raises(NotImplementedError, match=arch):
                estimate_memory(config, setup)


def test_terms_scale_as_written():
    config = tiny_config("qwen2_vl")
    s = model_states(config)
    base = EstimateSetup(seq_len=4096, cp=4, dp=2, visual_tokens=1024, images=4, dtype="bfloat16")
    plain = estimate_memory(config, base, s)
    sharded = estimate_memory(config, EstimateSetup(**{**base.__dict__, "fsdp": True}), s)
    assert plain.terms["params"] == 2 * s.params and sharded.terms["params"] == 2 * s.params // 8
    assert sharded.terms["adamw"] == 2 * sharded.terms["grads"] and sharded.terms["fsdp_unsharded"] > 0
    assert plain.llm_tokens == 1024 + math.ceil(3072 / 4)
    shard = estimate_memory(config, EstimateSetup(**{**base.__dict__, "image_strategy": "shard"}), s)
    assert shard.llm_tokens == 1024 and shard.terms["llm"] < plain.terms["llm"]
    scatter = estimate_memory(config, EstimateSetup(**{**base.__dict__, "vision_mode": "scatter"}), s)
    assert scatter.vit_tokens == plain.vit_tokens // 4 == 1024
    offload = estimate_memory(config, EstimateSetup(**{**base.__dict__, "offload_activations": True}), s)
    text = text_blocks(config, 2)
    assert offload.saved == plain.saved and offload.terms["recompute"] >= plain.llm_tokens * text.per_layer
    assert offload.peak == plain.states + max(offload.terms["loss_chunk"], offload.terms["recompute"])
    targets = math.ceil(3072 / 4)  # bf16: one chunk, the float32 accumulator of the head, d_hidden
    assert plain.terms["loss_chunk"] == (chunk_transient_bytes(targets, text.vocab, torch.bfloat16,
                                                               hidden_size=text.hidden)
                                         + 4 * text.vocab * text.hidden + 2 * plain.llm_tokens * text.hidden)
    ckpt = estimate_memory(config, EstimateSetup(**{**base.__dict__, "activation_checkpointing": True}), s)
    assert ckpt.terms["recompute"] >= plain.llm_tokens * text.per_layer
    assert ckpt.terms["llm"] < plain.terms["llm"] / 4


def test_issue_23_figure_for_qwen2_5_vl_7b():
    """Issue 23: 28 checkpointed blocks of Qwen2.5-VL-7B at 32k tokens per rank keep ~6.6 GB."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("qwen2_5_vl", text_config=dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064), vision_config=dict(hidden_size=1280, out_hidden_size=3584))
    text = text_blocks(config, 2)
    assert text.layers * text.checkpointed * 32768 == pytest.approx(6.6e9, rel=0.01)


def test_tiled_llava_next_needs_its_tiles():
    config = tiny_config("llava_next")
    with pytest.raises(ValueError, match="give images"):
        estimate_memory(config, EstimateSetup(seq_len=512, visual_tokens=56))
    one, two = (estimate_memory(config, EstimateSetup(seq_len=512, visual_tokens=56, images=n))
                for n in (3, 6))
    assert two.vit_tokens == 2 * one.vit_tokens == 6 * 17  # 16 patches and CLS per tile


def test_bad_setups_are_refused():
    with pytest.raises(ValueError, match="images must be in"):
        EstimateSetup(seq_len=100, images=2)
    with pytest.raises(ValueError, match="visual tokens must be in"):
        EstimateSetup(seq_len=100, visual_tokens=100)
    with pytest.raises(ValueError, match="dtype must be one of"):
        EstimateSetup(seq_len=100, dtype="float64")
    with pytest.raises(NotImplementedError, match="attention 'ulysses' is not estimated"):
        EstimateSetup(seq_len=100, attention="ulysses")
    with pytest.raises(ValueError, match="are not a whole number of images"):
        estimate_memory(tiny_config("llava"), EstimateSetup(seq_len=100, visual_tokens=20))


def test_max_seq_len_is_the_boundary():
    config = tiny_config("llava")
    setup = EstimateSetup(seq_len=64, cp=2, visual_tokens=32, dtype="float32")
    s = model_states(config)
    budget = estimate_memory(config, EstimateSetup(**{**setup.__dict__, "seq_len": 5000}), s).peak
    L = max_seq_len(config, setup, budget, s)
    assert L >= 5000
    assert estimate_memory(config, EstimateSetup(**{**setup.__dict__, "seq_len": L}), s).peak <= budget
    assert estimate_memory(config, EstimateSetup(**{**setup.__dict__, "seq_len": L + 1}), s).peak > budget
    assert max_seq_len(config, setup, 1000, s) == 0


def test_plan_model_cli(tmp_path, capsys):
    tiny_config("qwen2_vl").save_pretrained(tmp_path)
    argv = ["plan", "--model", str(tmp_path), "--seq-len", "2048", "--cp", "2", "--visual-tokens", "256",
            "--images", "2", "--activation-checkpointing", "--dtype", "float32", "--gpu-memory", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for term in ("parameters", "gradients", "AdamW moments", "LLM saved", "ViT saved", "loss chunk",
                 "recompute", "**peak**", "ViT saved per vision mode", "longest --seq-len that fits"):
        assert term in out, term
    assert "busiest rank: 1,152 LLM tokens (256 visual; under shard: 1,024)" in out


def test_plan_model_reads_a_config_file(tmp_path, capsys):
    model = tmp_path / "model"
    tiny_config("llava").save_pretrained(model)
    cfg = tmp_path / "plan.yaml"
    cfg.write_text(f"model: {model}\nseq_len: 1024\nvisual_tokens: 32\ncp: 2\n"
                   "activation-checkpointing: true\ngpu_memory: 0.5\n")
    assert main(["plan", "--config", str(cfg), "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "P=2" in out and "float32" in out and "checkpointing on" in out and "(32 visual)" in out
    cfg.write_text("model: x\nseq_len: 10\nnot_a_flag: 1\n")
    with pytest.raises(SystemExit):
        main(["plan", "--config", str(cfg)])
    assert "not_a_flag" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["plan", "--seq-len", "100"], "--seq-len need --model"),
    (["plan", "--model", "DIR", "--seq-len", "9", "--image-tokens", "4"],
     "--image-tokens apply to the layout"),
    (["plan", "--model", "/nonexistent", "--seq-len", "9"], "no config.json"),
    (["plan", "--model", "{tiny}", "--seq-len", "99", "--fsdp", "--vision-mode", "scatter"],
     "fsdp takes vision_mode replicate, allreduce_hook or hidden_shard"),
])
def test_plan_flags_of_the_other_view_are_refused(argv, message, capsys, tmp_path):
    tiny_config("llava").save_pretrained(tmp_path)
    assert main([a.replace("{tiny}", str(tmp_path)) for a in argv]) == 2
    assert message in capsys.readouterr().err


def test_pixtral_mask_is_quadratic_in_the_patches():
    """Mistral3's Pixtral tower saves an (n, n) block-diagonal mask over the row's n patches."""
    config = tiny_config("mistral3")
    s = model_states(config)
    f = [estimate_memory(config, EstimateSetup(seq_len=4096, visual_tokens=v, images=4, dtype="float32"),
                         s).terms["vit"] for v in (256, 512, 768)]
    # n = 4 v patches (2x2 merge): the second difference of 4 bytes x n^2 is 4 x 16 x 2 v^2
    assert f[2] - 2 * f[1] + f[0] == 4 * 16 * 2 * 256 ** 2


def test_gemma3_with_siglip_head_is_refused():
    with pytest.raises(NotImplementedError, match="vision_use_head=True"):
        estimate_memory(tiny_config("gemma3"), EstimateSetup(seq_len=512, visual_tokens=4))


def test_plan_model_refuses_an_architecture_by_name(tmp_path, capsys):
    tiny_config("qwen3_5").save_pretrained(tmp_path)
    assert main(["plan", "--model", str(tmp_path), "--seq-len", "1024"]) == 2
    assert "qwen3_5 is not estimated: Gated DeltaNet" in capsys.readouterr().err
