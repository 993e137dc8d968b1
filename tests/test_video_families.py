"""Video data of today's video models against transformers' own processors (issue 26): Qwen3-VL and
Qwen3.5 (``Qwen3VLProcessor``), GLM-4.1V, LLaVA-OneVision.

transformers' processor runs on the whole decoded video, with its own frame sampling, resize
(torchvision's kernel, restated in torch: tests/video_oracle.py), normalize, patches and text;
vlmcp plans from the header and decodes only the planned frames, resized with PIL. Exact: the
text, its token ids, ``mm_token_type_ids``, the grid. Within rounding: the pixels, at most two
levels of 255 apart where PIL and torchvision resize a frame differently.
"""

import copy
import math

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("av")

from tests.video_oracle import decoded, transformers_inputs  # noqa: E402
from vlmcp.data.hf.encode import encode_conversation, sample_length, video_plans  # noqa: E402
from vlmcp.data.hf.export import write_video  # noqa: E402
from vlmcp.data.hf.processor import load_processor  # noqa: E402
from vlmcp.data.hf.schema import Conversation, Media, Message  # noqa: E402
from vlmcp.data.hf.template import render  # noqa: E402
from vlmcp.data.hf.video import VideoSampling, read_header  # noqa: E402
from vlmcp.debug.init_model import init_model  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _frames(n, height, width, seed=0) -> np.ndarray:
    """A red bar moving right over noise: every frame differs."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 60, (n, height, width, 3), dtype=np.uint8)
    for i in range(n):
        frames[i, height // 4:height // 2, (5 * i) % width:(5 * i) % width + 12] = (220, 30, 30)
    return frames


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """25 frames of 102x76 at 10 fps (2.5 s: an odd 5 frames at 2 fps) as mp4 and avi; 30 frames of
    90x120 at 4 fps; 8 frames as a directory of PNGs."""
    from PIL import Image

    root = tmp_path_factory.mktemp("media")
    for suffix in ("mp4", "avi"):
        write_video(root / f"bar.{suffix}", _frames(25, 76, 102), 10)
    write_video(root / "tall.mp4", _frames(30, 120, 90, seed=1), 4)
    (root / "frames").mkdir()
    for i, frame in enumerate(_frames(8, 48, 64, seed=2)):
        Image.fromarray(frame).save(root / "frames" / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """Processors of init-model Qwen3-VL and Qwen3.5 directories (Qwen3VLProcessor, loaded as vlmcp loads
    them: without torchvision, the video processor built from the saved config)."""
    root = tmp_path_factory.mktemp("models")
    return {arch: load_processor(init_model(arch, root / arch)) for arch in ("qwen3_vl", "qwen3_5")}


def _conv(video: Media) -> Conversation:
    return Conversation(line=2, source="d.jsonl", videos=(video,),
                        messages=(Message("user", "<video>Where does the bar go?"),
                                  Message("assistant", "right")))


def _compare(ours, theirs, std: float) -> None:
    """Identical ids, token types, grids; pixels at most two levels of 255 apart (one on these clips),
    under 1% of them at all."""
    assert ours.input_ids.tolist() == theirs["input_ids"][0].tolist()
    assert ours.mm_token_type_ids.tolist() == theirs["mm_token_type_ids"][0].tolist()
    assert ours.pixels["video_grid_thw"].tolist() == theirs["video_grid_thw"].tolist()
    levels = (ours.pixels["pixel_values_videos"] - theirs["pixel_values_videos"]).abs() * 255 * std
    assert float(levels.max()) <= 2 + 1e-4 and float((levels > 0.5).float().mean()) < 0.01


@pytest.mark.parametrize("arch", ["qwen3_vl", "qwen3_5"])
@pytest.mark.parametrize("name", ["bar.mp4", "bar.avi", "tall.mp4"])
def test_qwen3_videos_match_transformers_processor(qwen3, media, arch, name):
    processor = qwen3[arch]
    conv = _conv(Media("video", path=media / name))
    (plan,) = video_plans(processor, conv)
    ours = encode_conversation(processor, conv)
    assert len(ours) == sample_length(processor, conv)  # planned from the header alone
    frames, fps = decoded(media / name)
    theirs = transformers_inputs(processor, render(processor, conv).text, frames, fps)
    _compare(ours, theirs, std=0.5)
    text = processor.tokenizer.decode(ours.input_ids)
    groups = [f"<{t:.1f} seconds><|vision_start|>" for t in plan.timestamps]
    assert all(g in text for g in groups) and len(groups) == plan.grid_thw[0]
    video_id = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert int((ours.input_ids == video_id).sum()) == plan.tokens == math.prod(plan.grid_thw) // 4
    if name.startswith("bar"):  # 2.5 s at 2 fps: 5 frames, the last repeated into a third frame group
        assert plan.indices == (0, 6, 12, 18, 24) and plan.grid_thw[0] == 3
        assert plan.timestamps == (0.3, 1.5, 2.4)  # (0 + 0.6) / 2, (1.2 + 1.8) / 2, 2.4


def test_qwen3_flags_are_the_video_processors_settings(qwen3, media):
    """--video-fps, --video-max-frames, --video-total-pixels, --video-min-pixels: what transformers does
    with fps, max_frames and size set to the same."""
    processor = qwen3["qwen3_vl"]
    conv = _conv(Media("video", path=media / "tall.mp4"))
    frames, fps = decoded(media / "tall.mp4")
    text = render(processor, conv).text
    cases = [(VideoSampling(fps=3.0), {"fps": 3.0}, {}),
             (VideoSampling(max_frames=5), {}, {"max_frames": 5}),
             (VideoSampling(total_pixels=8192), {"size": {"shortest_edge": 1024, "longest_edge": 8192}}, {}),
             (VideoSampling(min_pixels=96 * 128),
              {"size": {"shortest_edge": 96 * 128 * 15, "longest_edge": 65536}}, {})]
    for sampling, kwargs, attrs in cases:
        ours = encode_conversation(processor, conv, sampling)
        assert len(ours) == sample_length(processor, conv, sampling)
        theirs_processor = copy.copy(processor)
        theirs_processor.video_processor = copy.copy(processor.video_processor)
        for k, v in attrs.items():
            setattr(theirs_processor.video_processor, k, v)
        _compare(ours, transformers_inputs(theirs_processor, text, frames, fps, **kwargs), std=0.5)
    plans = {s: video_plans(processor, conv, s)[0] for s, _, _ in cases}
    assert [len(p.indices) for p in plans.values()] == [22, 5, 15, 15]  # 7.5 s of video
    assert plans[cases[2][0]].grid_thw == (8, 2, 2)  # 15 frames of 16x16: at most 8 * 1024 pixels in all


def test_qwen3_frames_given_as_images_are_all_taken_at_the_sampling_fps(qwen3, media):
    processor = qwen3["qwen3_vl"]
    files = tuple(media / "frames" / f"{i}.png" for i in range(8))
    conv = _conv(Media("video", path=media / "frames", frames=files))
    (plan,) = video_plans(processor, conv, VideoSampling(fps=4.0))
    assert plan.indices == tuple(range(8)) and plan.timestamps == (0.1, 0.6, 1.1, 1.6)  # (0 + 0.25) / 2, ...
    sample = encode_conversation(processor, conv, VideoSampling(fps=4.0))
    assert sample.pixels["video_grid_thw"].tolist() == [list(plan.grid_thw)] == [[4, 6, 8]]


def test_a_two_hour_video_plans_from_its_header(qwen3, tmp_path, monkeypatch):
    """A 2-hour video (one frame per 5 s, 1440 frames of 16x16) plans without a frame decoded:
    768 frames (max_frames), 384 frame groups with their timestamps."""
    from fractions import Fraction

    import av

    path = tmp_path / "long.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=Fraction(1, 5))
        stream.width = stream.height = 16
        stream.pix_fmt = "yuv420p"
        for i in range(1440):
            frame = av.VideoFrame.from_ndarray(np.full((16, 16, 3), i % 255, np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    monkeypatch.setattr(av.container.InputContainer, "decode", None)  # planning decodes nothing
    media = Media("video", path=path)
    header = read_header(media)
    assert header.frames == 1440 and header.frames / header.fps == 7200
    (plan,) = video_plans(qwen3["qwen3_vl"], _conv(media))
    assert len(plan.indices) == 768 and plan.grid_thw[0] == 384 and len(plan.timestamps) == 384
    assert plan.timestamps[-1] == 7190.0  # frames 1437 and 1439, 5 s apart


@pytest.fixture(scope="module")
def others(tmp_path_factory):
    """Processors of init-model GLM-4.1V and LLaVA-OneVision directories, loaded as vlmcp loads them."""
    root = tmp_path_factory.mktemp("others")
    return {arch: load_processor(init_model(arch, root / arch)) for arch in ("glm4v", "llava_onevision")}


@pytest.mark.parametrize("name", ["bar.mp4", "tall.mp4"])
def test_glm4v_videos_match_transformers_processor(others, media, name):
    processor = others["glm4v"]
    conv = _conv(Media("video", path=media / name))
    (plan,) = video_plans(processor, conv)
    ours = encode_conversation(processor, conv)
    assert len(ours) == sample_length(processor, conv)
    frames, fps = decoded(media / name)
    theirs = transformers_inputs(processor, render(processor, conv).text, frames, fps)
    _compare(ours, theirs, std=min(processor.video_processor.image_std))
    # every frame group is image placeholders, typed 2 (video) by the processor, its whole second after it
    text = processor.tokenizer.decode(ours.input_ids)
    stamps = [f"<|end_of_image|>{int(t)}" for t in plan.timestamps]
    assert all(s in text for s in stamps) and len(stamps) == plan.grid_thw[0]
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image|>")
    assert int((ours.mm_token_type_ids == 2).sum()) == int((ours.input_ids == image_id).sum()) == plan.tokens
    if name == "bar.mp4":  # its sampler: frames ceil(i * 10 / 2), i < 5, the last repeated to an even count
        assert plan.indices == (0, 5, 10, 15, 20, 20) and plan.timestamps == (0.0, 1.0, 2.0)


def test_glm4v_keeps_images_and_videos_out_of_one_row(others, media):
    """Its forward fills both at one placeholder: a conversation with both is refused at planning, and
    rows pack the image and video conversations apart."""
    from PIL import Image

    from vlmcp.data.hf.rows import build_index, build_row

    processor = others["glm4v"]
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(media / "black.png")
    image = Media("image", path=media / "black.png")
    both = Conversation(line=4, source="d.jsonl", images=(image,),
                        videos=(Media("video", path=media / "bar.mp4"),),
                        messages=(Message("user", "<image><video>Same?"), Message("assistant", "no")))
    with pytest.raises(ValueError, match=r"d.jsonl:4: 1 image\(s\) and 1 video\(s\): Glm4vProcessor's model "
                                         r"fills images and videos at the same placeholder"):
        sample_length(processor, both)
    pictures = [Conversation(line=k, source="d.jsonl", images=(image,), messages=(
        Message("user", "<image>What?"), Message("assistant", "black"))) for k in (5, 6)]
    index = build_index(processor, [_conv(Media("video", path=media / "bar.mp4")), *pictures], 4096)
    assert index.rows == [[1, 2], [0]]  # they would fit in one row
    row = build_row(processor, index, 1)
    assert "pixel_values_videos" in row.inputs and "pixel_values" not in row.inputs


def test_llava_onevision_videos_match_transformers_processor(others, media):
    """A fixed 32 frames (LLaVA's uniform sampling), resized to the video processor's size; the processor
    writes 32 * 4 + 1 <video> tokens (frames pooled to 2x2, one newline)."""
    processor = others["llava_onevision"]
    conv = _conv(Media("video", path=media / "tall.mp4"))
    (plan,) = video_plans(processor, conv)
    assert plan.indices == tuple(np.linspace(0, 29, 32, dtype=int).tolist()) and plan.tokens == 32 * 4 + 1
    ours = encode_conversation(processor, conv)
    assert len(ours) == sample_length(processor, conv)
    frames, fps = decoded(media / "tall.mp4")
    theirs = transformers_inputs(processor, render(processor, conv).text, frames[list(plan.indices)], fps,
                                 do_sample_frames=False)
    assert ours.input_ids.tolist() == theirs["input_ids"][0].tolist()
    assert ours.pixels["pixel_values_videos"].shape == theirs["pixel_values_videos"].shape == (1, 32, 3, 8, 8)
    levels = (ours.pixels["pixel_values_videos"] - theirs["pixel_values_videos"]).abs() * 255 * 0.26
    assert float(levels.max()) <= 1.05 and float((levels > 0.5).float().mean()) < 0.05
    shorter = video_plans(processor, conv, VideoSampling(max_frames=6, total_pixels=4 * 64))[0]
    assert len(shorter.indices) == 4 and shorter.tokens == 4 * 4 + 1  # the budget: 4 frames of 8x8
    with pytest.raises(ValueError, match=r"d.jsonl:2: 1 video\(s\): --video-fps: LLaVA-OneVision takes a "
                                         r"fixed count of frames"):
        video_plans(processor, conv, VideoSampling(fps=1.0))
