"""Training today's video models on videos (issue 26): Qwen3-VL and Qwen3.5 init-model directories at
CP=2 on real mp4 and avi files and on ``vlmcp data shapes --videos`` clips. The loss falls, the
trained model's CP logits are plain transformers' on each conversation, and ``--resume`` from a
checkpoint continues bit for bit (CPU)."""

import json

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("av")

from tests.train_cases import hf_rank  # noqa: E402
from tests.video_train_cases import check_probe_is_transformers, probe_row0, train_then_resume  # noqa: E402
from vlmcp.data.hf.export import export_shapes, write_video  # noqa: E402
from vlmcp.debug.init_model import init_model  # noqa: E402
from vlmcp.launch import spawn_ranks  # noqa: E402
from vlmcp.train.specs.hf.config import HFTrainConfig  # noqa: E402
from vlmcp.train.specs.hf.launch import plan_data, preload_model_code  # noqa: E402

pytestmark = pytest.mark.timeout(300)
STEPS, EVERY = 6, 3


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three moving-shapes clips and a bar moving right as mp4 and avi (12 frames of 64x48 at 6 fps)."""
    root = tmp_path_factory.mktemp("videos")
    shapes = export_shapes(root / "shapes", 0, videos=3)
    lines = shapes.read_text().replace('"videos/', f'"{shapes.parent}/videos/').splitlines()
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 60, (12, 48, 64, 3), dtype=np.uint8)
    for i in range(12):
        frames[i, 12:28, 4 * i:4 * i + 10] = (220, 30, 30)
    for suffix in ("mp4", "avi"):
        write_video(root / f"bar.{suffix}", frames, 6)
        lines.append(json.dumps({"videos": [str(root / f"bar.{suffix}")], "messages": [
            {"role": "user", "content": "<video>Where does the bar go?"},
            {"role": "assistant", "content": "a red bar moves right"}]}))
    path = root / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("arch, options", [
    ("qwen3_vl", {"image_strategy": "shard", "vision_mode": "scatter"}),
    ("qwen3_5", {"image_strategy": "auto", "vision_mode": "scatter", "attention": "ulysses"}),
])
def test_cp2_trains_videos_and_resumes_exactly(data, tmp_path, arch, options):


    model = init_model(arch, tmp_path / arch)
    common = dict(model=str(model), data=str(data), seq_len=256, lr=3e-3, timeout=120.0, steps=STEPS, cp=2,
                  checkpoint_dir=str(tmp_path / "checkpoints"), **options)
    cfg = HFTrainConfig(output_dir=str(tmp_path / "out"), checkpoint_every=EVERY, **common)
    resumed = HFTrainConfig(output_dir=str(tmp_path / "resumed"), resume=True, **common)
    preload_model_code(cfg.model)
    index = plan_data(cfg)
    assert len(index.conversations) == 5 and not index.unreadable
    ranks = spawn_ranks(train_then_resume, 2, cfg, resumed, index, probe_row0, timeout=280,
                        threads_per_rank=1)
    first, second = ranks[0]["first"], ranks[0]["second"]
    losses = first["losses"]
    assert len(losses) == STEPS and losses[-1] < losses[0] - 0.3, losses
    assert ranks[1]["first"]["losses"] == losses
    assert second["start_step"] == EVERY and second["losses"] == losses[EVERY:]  # bit-exact on CPU
    probe = first["probe"]
    assert {"pixel_values_videos", "video_grid_thw", "mm_token_type_ids"} <= set(probe["keys"])
    check_probe_is_transformers(probe, cfg, index)


@pytest.mark.slow
def test_long_moving_shapes_videos_train_at_cp4_with_auto_and_frame_group_scatter(tmp_path):
    """``vlmcp data shapes --videos 3 --video-frames 64``: 16 s clips, 16 frame groups each at 2 fps.
    At CP=4 with ``image_strategy auto`` the cost model shards the long video rows, ``scatter`` spreads
    each video's frame groups over the 4 ranks' ViTs, and the loss falls."""
    from tests.video_train_cases import long_video_probe
    from vlmcp.cli import main
    from vlmcp.data.hf.video import VideoSampling

    assert main(["data", "shapes", "--out", str(tmp_path / "shapes"), "--samples", "0", "--videos", "3",
                 "--video-frames", "64"]) == 0
    model = init_model("qwen3_vl", tmp_path / "qwen3_vl")
    cfg = HFTrainConfig(model=str(model), data=str(tmp_path / "shapes" / "train.jsonl"),
                        output_dir=str(tmp_path / "out"), seq_len=512, lr=3e-3, timeout=200.0, steps=4, cp=4,
                        image_strategy="auto", vision_mode="scatter",
                        video=VideoSampling(total_pixels=32 * 64 * 64))  # 64x64 frames: 16 tokens a group
    preload_model_code(cfg.model)
    index = plan_data(cfg)
    assert len(index.rows) == 3 and all(n > 300 for n in index.lengths)
    summary = spawn_ranks(hf_rank, 4, cfg, index, long_video_probe, timeout=280, threads_per_rank=1)[0]
    losses = summary["losses"]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    probe = summary["probe"]
    assert probe["strategy"] == "shard" and probe["frame_groups"] == 16
    per_group = probe["patch_rows"] // 16
    assert sorted(probe["vit_rows"]) == [4 * per_group] * 4  # 4 frame groups on each rank's ViT
