"""Videos and sharded visual tokens in Hugging Face VLMs under vlmcp: exact against the unmodified model.

Packed rows with a video sample, a text-only sample and a sample mixing images and a video
(tests/hf_video_cases.py), float64 loss and every gradient against the model as HF ships it
run one sample at a time: P = 2 and 3, ring and Ulysses, all five vision modes,
``image_strategy`` replicate and shard (and auto), split / whole / auto sample placement;
Qwen2-VL throughout, Qwen2.5-VL (``second_per_grid_ts``), Qwen3-VL (timestamps between frame
groups, deepstack) and Qwen3-VL-MoE, Qwen3.5 and Qwen3.5-MoE (the same timestamps, Gated
DeltaNet layers, MoE MLPs), GLM-4.1V (video-only rows) and LLaVA-OneVision (``pixel_values_videos`` of whole
videos) on a few cases each, ring and Ulysses, ``replicate`` and ``scatter``, visual tokens
replicated and sharded. One spawned group per world size runs its whole grid.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import vlmcp  # noqa: E402
import vlmcp.hf  # noqa: E402
from tests import hf_cases, hf_video_cases  # noqa: E402
from vlmcp.debug.parity.hf import HFParityCase  # noqa: E402
from vlmcp.debug.synthetic import synthetic_row  # noqa: E402
from vlmcp.debug.tiny import tiny_model  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402

MODES = ("replicate", "allreduce_hook", "broadcast", "scatter", "hidden_shard")
BACKENDS = ("ring", "ulysses")
ROWS = {**hf_cases.ROWS, **hf_video_cases.ROWS}


def _case(arch, attention="ring", mode="replicate", strategy="replicate", rows="video_packed",
          placement="split", dtype="float64"):
    return HFParityCase(model=f"hf:{arch}", attention=attention, vision_mode=mode, dtype=dtype,
                        samples=ROWS[rows], sample_placement=placement, image_strategy=strategy)


def _failures(results: list[dict]) -> list[str]:
    return [f"{r['model']} {r['attention']} {r['vision_mode']} {r['image_strategy']} ({r['strategy']}) "
            f"{r['dtype']} placement={r['sample_placement']} samples={r['samples']}: loss "
            f"{r['loss_rel_error']:.1e}, grad {r['max_rel_grad_error']:.1e} ({r['worst_param']})"
            for r in results if not r["passed"]]


P2_CASES = (
    [_case("qwen2_vl", b, m, s) for s in ("replicate", "shard") for b in BACKENDS for m in MODES]
    + [_case("qwen2_vl", "ring", "scatter", "shard", rows="video_mixed", placement="auto"),
       _case("qwen2_vl", "ulysses", "hidden_shard", "shard", rows="video_mixed", placement="whole"),
       _case("qwen2_vl", "ring", "broadcast", "auto", rows="long_video"),
       _case("qwen2_vl", "ulysses", "scatter", "shard", dtype="float32")]
    + [_case("qwen2_5_vl", "ring", "scatter", "shard"), _case("qwen2_5_vl", "ulysses", "broadcast")]
    + [_case("qwen3_vl", "ulysses", "scatter", "shard"), _case("qwen3_vl", "ring", "hidden_shard"),
       _case("qwen3_vl", "ring", "allreduce_hook", "shard", rows="video_mixed", placement="auto")]
    + [_case("glm4v", "ring", "scatter", "shard", rows="video_only"),
       _case("glm4v", "ulysses", "hidden_shard", rows="video_only"),
       _case("glm4v", "ulysses", "replicate", rows="video_only")]
    # issue 26: Qwen3.5 (hybrid LM) and its MoE, LLaVA-OneVision, Qwen3-VL replicated, Qwen3-VL-MoE
    + [_case("qwen3_5", "ring"), _case("qwen3_5", "ulysses", "scatter", "shard"),
       _case("qwen3_5_moe", "ulysses", "replicate", "shard"),
       _case("qwen3_5_moe", "ring", "scatter", "shard"),
       _case("llava_onevision", "ring", rows="onevision_video"),
       _case("llava_onevision", "ulysses", "scatter", "shard", rows="onevision_video"),
       _case("qwen3_vl", "ulysses"), _case("qwen3_vl_moe", "ulysses", "scatter", "shard")]
    # images only, visual tokens sharded (the point 2 beyond videos)
    + [_case("qwen2_vl", "ulysses", "scatter", "shard", rows="packed"),
       _case("llava", "ring", "hidden_shard", "shard", rows="packed"),
       _case("llava", "ulysses", "broadcast", "shard", rows="mixed", placement="auto")]
)
P3_CASES = (
    [_case("qwen2_vl", b, m, "shard") for b in BACKENDS for m in MODES]
    + [_case("qwen2_vl", b, m) for b, m in (("ring", "scatter"), ("ulysses", "hidden_shard"))]
    + [_case("qwen2_5_vl", "ulysses", "hidden_shard", "shard"), _case("qwen3_vl", "ring", "scatter", "shard"),
       _case("glm4v", "ulysses", "broadcast", "shard", rows="video_only")]
    + [_case("qwen3_vl", "ulysses"), _case("glm4v", "ring", "scatter", rows="video_only"),
       _case("qwen3_5", "ring", "scatter", "shard"), _case("qwen3_5", "ulysses"),
       _case("qwen3_5_moe", "ulysses", "scatter", "shard"), _case("qwen3_5_moe", "ring"),
       _case("llava_onevision", "ring", "scatter", "shard", rows="onevision_video"),
       _case("llava_onevision", "ulysses", rows="onevision_video"), _case("qwen3_vl_moe", "ring")]
)


@pytest.fixture(scope="module")
def p2():
    return run_on_ranks(hf_video_cases.suite, 2, P2_CASES, timeout=300)[0]


@pytest.fixture(scope="module")
def p3():
    return run_on_ranks(hf_video_cases.parity_grid, 3, P3_CASES, timeout=300)[0]


def test_video_parity_p2_every_backend_mode_and_strategy(p2):
    results = p2["parity"]
    assert len(results) == len(P2_CASES)
    assert not _failures(results), "\n".join(_failures(results))
    for r in results:
        assert r["vision_params_with_grad"] > 0, r
        if r["image_strategy"] != "auto":
            assert r["strategy"] == r["image_strategy"], r
    auto = [r for r in results if r["image_strategy"] == "auto"]
    assert [r["strategy"] for r in auto] == ["shard"]  # one long video, little text: shard pays


def test_video_parity_p3(p3):
    assert len(p3) == len(P3_CASES)
    assert not _failures(p3), "\n".join(_failures(p3))
    assert max(r["max_rel_grad_error"] for r in p3 if r["dtype"] == "float64") <= 1e-9


def test_shard_puts_each_visual_token_on_one_rank(p2):
    packed = [list(s) for s in hf_video_cases.VIDEO_PACKED]
    split = [r for r in p2["parity"] if r["sample_placement"] == "split" and r["dtype"] == "float64"
             and r["model"] == "hf:qwen2_vl" and r["samples"] == packed]
    visual = 3 * 4 + 2 * 8 + 8 + 4  # video 3 groups of 4, video 2 groups of 8, images of 8 and 4 tokens
    for r in split:
        per_rank = r["image_tokens_per_rank"]
        assert sum(per_rank) == visual if r["image_strategy"] == "shard" else per_rank == [visual, visual], r


def test_scatter_spreads_a_long_videos_frame_groups_and_keeps_images_whole(p2):
    vit = p2["vit"]
    for strategy in ("replicate", "shard"):
        long = vit[("long_video", strategy)]
        assert long["vit_rows"] == 8 * 64 // 2  # 8 frame groups of 8x8 patches, 4 per rank
        images = vit[("two_images", strategy)]
        assert images["vit_rows"] in (32, 16)  # the (1, 4, 8) image on one rank, the (1, 4, 4) on the other
    shard = vit[("long_video", "shard")]
    assert shard["visual_travel"] and not shard["visual_replicated"]
    assert vit[("long_video", "replicate")]["visual_replicated"]
    assert not vit[("long_video", "replicate")]["visual_travel"]


def test_bench_rank_functions_measure_what_they_say(p2):
    memory = p2["benches"]["memory"]
    assert memory["visual"] == 2 * 64 and memory["tokens"] == 2 + 1 + 128 + 1 + 16
    single = memory["single"]
    replicated, chosen = memory[("replicate", "replicate")]
    assert chosen == "replicate" and 0.9 < replicated / single < 1  # the video on both ranks
    for strategy in ("shard", "auto"):
        saved, chosen = memory[(strategy, "scatter")]
        assert chosen == "shard" and saved / single <= 0.55  # about 1/P of everything
    times, per_rank = p2["benches"]["vision"]
    assert per_rank == [2, 2] and set(times) == {"replicate", "scatter"} and len(times["scatter"]) == 1
    for arch, (saved, groups) in p2["benches"]["qwen3"].items():  # --arch qwen3_vl, qwen3_5
        assert groups == [2, 2], arch
        bytes_, chosen = saved[("shard", "scatter")]
        assert chosen == "shard" and bytes_ / saved["single"] <= 0.55, arch


# --- one process: checks before any collective ------------------------------------------------


def _qwen(arch="qwen2_vl"):
    return vlmcp.hf.parallelize(tiny_model(arch, torch.float64), None)


def test_glm4v_refuses_images_and_videos_in_one_row_and_videos_without_token_types():
    model = _qwen("glm4v")
    inputs, labels, cu = synthetic_row(model, hf_video_cases.VIDEO_PACKED)
    with pytest.raises(ValueError, match="cannot take both in one row"):
        vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    inputs, labels, cu = synthetic_row(model, hf_video_cases.VIDEO_ONLY)
    no_types = {k: v for k, v in inputs.items() if k != "mm_token_type_ids"}
    with pytest.raises(ValueError, match="needs mm_token_type_ids"):
        vlmcp.hf.shard_inputs(model, no_types, None, labels=labels, cu_seqlens=cu)
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    assert int(batch.shard.is_image.sum()) == 3 * 4 + 2 * 8


def test_video_tokens_must_match_the_videos_per_sample_and_stay_contiguous():
    model = _qwen()
    inputs, labels, cu = synthetic_row(model, hf_video_cases.VIDEO_PACKED)
    grid = inputs["video_grid_thw"].clone()
    grid[0, 0] = 2  # the first video claims 2 frame groups, the row holds 3
    with pytest.raises(ValueError, match="video features and video tokens do not match"):
        vlmcp.hf.shard_inputs(model, {**inputs, "video_grid_thw": grid,
                                      "pixel_values_videos": inputs["pixel_values_videos"][16:]},
                              None, labels=labels, cu_seqlens=cu)
    ids, tt = inputs["input_ids"].clone(), inputs["mm_token_type_ids"].clone()
    last = int((ids[0] == 121).nonzero()[11])  # the first video's last token, then its end marker
    ids[0, last], ids[0, last + 1] = ids[0, last + 1].clone(), ids[0, last].clone()
    tt[0, last], tt[0, last + 1] = 0, 2
    with pytest.raises(ValueError, match="video frame group 2's 4 placeholder tokens .* not one contiguous"):
        vlmcp.hf.shard_inputs(model, {**inputs, "input_ids": ids, "mm_token_type_ids": tt}, None,
                              labels=labels, cu_seqlens=cu)


def test_image_strategy_is_checked_and_needs_an_adapter_to_shard_images():
    model = _qwen()
    inputs, labels, cu = synthetic_row(model, hf_video_cases.VIDEO_PACKED)
    with pytest.raises(ValueError, match="image_strategy must be one of"):
        vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu, image_strategy="split")
    other = tiny_model("llava", torch.float32)
    other.config.model_type = "my_vlm"  # no adapter: HF's own get_image_features, all images everywhere
    vlmcp.hf.parallelize(other, None)
    one, one_labels, _ = synthetic_row(other, hf_cases.PROMPT_FIRST)
    with pytest.raises(ValueError, match="image_strategy='shard' with images needs a vlmcp adapter"):
        vlmcp.hf.shard_inputs(other, one, None, labels=one_labels, image_strategy="shard")


def test_qwen3_vl_timestamps_sit_between_frame_groups_and_positions_are_the_models():
    model = _qwen("qwen3_vl")
    inputs, labels, cu = synthetic_row(model, ((2, ("video", 3, 4, 4), 2),))
    ids = inputs["input_ids"][0]
    video = (ids == 121).nonzero().flatten()
    # between frame groups: vision end, a 3-token timestamp, vision start
    assert video.numel() == 12 and (video[4] - video[3]) == (video[8] - video[7]) == 6
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    want, _ = model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                         video_grid_thw=inputs["video_grid_thw"])
    assert torch.equal(batch.position_ids, want[:, 0])


def test_qwen2_5_vl_positions_follow_second_per_grid_ts():
    model = _qwen("qwen2_5_vl")
    inputs, labels, cu = synthetic_row(model, hf_video_cases.VIDEO_PACKED)
    assert inputs["second_per_grid_ts"].tolist() == [1.0, 0.5]
    slow = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu).position_ids
    fast = vlmcp.hf.shard_inputs(model, {**inputs, "second_per_grid_ts": torch.tensor([2.0, 0.5])}, None,
                                 labels=labels, cu_seqlens=cu).position_ids
    assert not torch.equal(slow, fast) and torch.equal(slow[1:], fast[1:])  # only temporal ids move


def test_cli_verify_model_video(capsys):
    import json

    from vlmcp.cli import main

    assert main(["verify", "--model", "hf:qwen2_vl", "--video", "--cp", "2", "--image-strategy", "shard",
                 "--vision-mode", "scatter", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["passed"] and result["strategy"] == "shard" and result["max_rel_grad_error"] <= 1e-9
    assert any(isinstance(seg, list) and seg[0] == "video" for s in result["samples"] for seg in s)
    assert main(["verify", "--model", "hf:llava", "--video"]) != 0
    assert "takes no videos" in capsys.readouterr().err


def test_train_passes_image_strategy_on(tmp_path):
    import argparse

    from vlmcp.cli import train
    from vlmcp.train.specs.hf.config import HFTrainConfig

    parser = argparse.ArgumentParser()
    train.add_parser(parser.add_subparsers(dest="command"))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")  # a model directory: config_from_args checks it
    args = parser.parse_args(["train", "--model", str(tmp_path / "m"), "--data", "d.jsonl",
                              "--output-dir", str(tmp_path / "o"), "--image-strategy", "auto"])
    assert train.config_from_args(args).image_strategy == "auto"
    with pytest.raises(ValueError, match="--image-strategy must be one of"):
        HFTrainConfig(model="m", data="d.jsonl", output_dir="o", image_strategy="images")
