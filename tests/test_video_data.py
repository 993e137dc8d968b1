"""Videos in the data pipeline (issue 16, point 4): read in every format, sampled from headers as
qwen-vl-utils does, decoded with PyAV, and turned into Qwen2-VL's video inputs without torchvision."""

import dataclasses
import json
import pathlib
import re
import sys
import types

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
av = pytest.importorskip("av")

from tests.video_train_cases import check_probe_is_transformers, probe_row0  # noqa: E402
from vlmcp.cli import main  # noqa: E402
from vlmcp.data.builtin.shapes import COLOUR_RGB  # noqa: E402
from vlmcp.data.hf.encode import encode_conversation, sample_length, video_plans  # noqa: E402
from vlmcp.data.hf.export import export_shapes, write_video  # noqa: E402
from vlmcp.data.hf.reader import read_conversations  # noqa: E402
from vlmcp.data.hf.rows import build_index, build_row  # noqa: E402
from vlmcp.data.hf.schema import Conversation, Media, Message  # noqa: E402
from vlmcp.data.hf.video import (  # noqa: E402
    Patching,
    VideoHeader,
    VideoSampling,
    decode_frames,
    frame_bounds,
    plan_video,
    read_header,
    sample_indices,
)
from vlmcp.data.hf.video_processor import video_pixels  # noqa: E402
from vlmcp.debug.init_model import CHAT_TEMPLATES, build_processor, init_model  # noqa: E402

pytestmark = pytest.mark.timeout(120)

TINY = Patching(patch_size=8, merge_size=2, temporal_patch_size=2, min_pixels=256, max_pixels=4096,
                resample=3)
"""vlmcp init-model's Qwen patching: F = 16, frames bounded to [256, 4096] pixels."""
QWEN2_VL = Patching(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=3136, max_pixels=12845056,
                    resample=3)
"""Qwen2-VL-7B-Instruct's preprocessor_config.json."""


def _frames(n=10, height=48, width=64, seed=0) -> np.ndarray:
    """A red bar moving right over noise: every frame differs."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 60, (n, height, width, 3), dtype=np.uint8)
    for i in range(n):
        frames[i, :, (5 * i) % width:(5 * i) % width + 8] = (220, 30, 30)
    return frames


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """The same 10 frames (5 fps, 64x48) as mp4, avi, webm, mov, a directory of PNGs; a JPEG frame
    of another size; a truncated avi (header fine, frames not) and a file that is no video."""
    from PIL import Image

    root = tmp_path_factory.mktemp("media")
    frames = _frames()
    for suffix in ("mp4", "avi", "webm", "mov"):
        write_video(root / f"v.{suffix}", frames, 5)
    (root / "frames").mkdir()
    for i, frame in enumerate(frames):  # natural order: 10.png after 9.png
        Image.fromarray(frame).save(root / "frames" / f"{i + 1}.png")
    Image.fromarray(frames[0][:32]).save(root / "small.jpg")
    data = (root / "v.avi").read_bytes()
    (root / "cut.avi").write_bytes(data[:len(data) * 4 // 5])
    (root / "junk.mp4").write_bytes(b"\0" * 100)
    (root / "mixed").mkdir()
    Image.fromarray(frames[0]).save(root / "mixed" / "1.png")
    (root / "mixed" / "notes.txt").write_text("not a frame")
    return root


@pytest.fixture(scope="module")
def qwen():
    """Tiny Qwen2-VL and Qwen2.5-VL processors, with the hub's video branch in their templates."""
    out = {}
    for arch in ("qwen2_vl", "qwen2_5_vl"):
        out[arch] = build_processor(arch)
        out[arch].chat_template = CHAT_TEMPLATES[arch]
    return out


def _conv(*videos, text="Describe the video.") -> Conversation:
    prompt = "".join("<video>" for _ in videos) + text
    return Conversation(line=3, source="d.jsonl", videos=tuple(videos),
                        messages=(Message("user", prompt), Message("assistant", "a red bar moves right")))


# -- reading ------------------------------------------------------------------------------------------


def test_every_format_reads_videos(media):
    v, frames = media / "v.mp4", tuple(media / "frames" / f"{i}.png" for i in range(1, 11))
    answer = {"role": "assistant", "content": "a bar"}
    lines = [
        {"messages": [{"role": "user", "content": "<video>What?"}, answer], "videos": ["v.mp4"]},
        {"messages": [{"role": "user", "content": "<video><video>What?"}, answer],
         "videos": [{"path": "frames"}, ["frames/1.png", "frames/2.png"]]},
        {"messages": [{"role": "user", "content": [{"type": "video", "video": "v.mp4"},
                                                   {"type": "text", "text": "What?"}]}, answer]},
        {"messages": [{"role": "user", "content": [{"type": "video_url", "value": "v.mp4"},
                                                   {"type": "video_url", "video_url": {"url": "frames"}},
                                                   {"type": "text", "value": "What?"}]}, answer]},
        {"id": "1", "video": "v.mp4", "conversations": [{"from": "human", "value": "What?\n<video>"},
                                                       {"from": "gpt", "value": "a bar"}]},
        {"query": "<video>What?", "response": "a bar", "videos": "v.mp4"},
    ]
    (media / "d.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    convs = read_conversations(media / "d.jsonl").conversations
    file, directory = Media("video", path=v), Media("video", path=media / "frames", frames=frames)
    assert [c.videos for c in convs] == [(file,), (directory, Media("video", frames=frames[:2])), (file,),
                                         (file, directory), (file,), (file,)]
    assert [c.messages[0].content for c in convs] == ["<video>What?", "<video><video>What?", "<video>What?",
                                                      "<video><video>What?", "<video>\nWhat?", "<video>What?"]


@pytest.mark.parametrize("line, error", [
    ({"videos": ["v.mp4"], "messages": [{"role": "user", "content": "What?"}]},
     r"0 <video> placeholder\(s\) but 1 video\(s\)"),
    ({"videos": ["http://x/v.mp4"], "messages": [{"role": "user", "content": "<video>"}]},
     r"videos must be local files \(URL given: http://x/v.mp4\)"),
    ({"videos": ["nowhere.mp4"], "messages": [{"role": "user", "content": "<video>"}]},
     r"video file .*nowhere.mp4 does not exist"),
    ({"videos": ["small.jpg"], "messages": [{"role": "user", "content": "<video>"}]},
     r"video .*small.jpg is an image; a video is a video file, a directory of frames, or a list of frame "
     r"paths"),
    ({"messages": [{"role": "user", "content": [{"type": "video", "video": "v.mp4", "fps": 1}]}]},
     r"message 0, part 0 \(video\) needs exactly one of the keys video, path, url, got \['video', 'fps'\] "
     r"\(vlmcp samples every video by --video-fps"),
    ({"videos": [["frames/1.png", "frames/99.png"]], "messages": [{"role": "user", "content": "<video>"}]},
     r"frame file .*99.png does not exist"),
    ({"videos": ["mixed"], "messages": [{"role": "user", "content": "<video>"}]},
     r"video directory .*mixed holds 'notes.txt', which is not a frame"),
])
def test_video_specs_that_cannot_train_are_refused(media, line, error):
    line = {**line, "messages": [*line["messages"], {"role": "assistant", "content": "a"}]}
    path = media / "bad.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=rf"bad.jsonl:1: {error}"):
        read_conversations(path)


# -- sampling rules ------------------------------------------------------------------------------------


def test_frame_counts_follow_qwen_vl_utils_smart_nframes():
    d = VideoSampling()
    at = lambda total, fps, s=d: sample_indices(VideoHeader(total, fps, 48, 64), s, 2)
    assert at(100, 25.0) == (0, 14, 28, 42, 57, 71, 85, 99)  # 4 s at 2 fps: 8 frames, linspace rounded
    assert at(100, 25.0, VideoSampling(fps=1.0)) == (0, 33, 66, 99)  # 4 frames
    assert len(at(1000, 25.0, VideoSampling(max_frames=7))) == 6  # floored to a multiple of T
    assert len(at(75, 10.0, VideoSampling(fps=1.0))) == 6  # 7.5 frames floored to 6
    assert at(10, 25.0) == (0, 3, 6, 9)  # 0.8 frames at 2 fps: min_frames 4
    assert at(3, 25.0) == (0, 2)  # fewer than min_frames: floor_T(total)
    with pytest.raises(ValueError, match=r"1 frame\(s\): too few to take 2"):
        at(1, 25.0)
    # frames given as images: all, the last repeated to a multiple of T; past max_frames, evenly
    assert sample_indices(VideoHeader(5, None, 8, 8), d, 2) == (0, 1, 2, 3, 4, 4)
    assert sample_indices(VideoHeader(10, None, 8, 8), VideoSampling(max_frames=5), 2) == (0, 3, 6, 9)


def test_frame_sizes_follow_qwen_vl_utils_pixel_bounds():
    # Qwen2-VL: 128 and 768 tokens of 28x28 per frame, a 0.9 * 128000-token budget per video
    assert frame_bounds(8, VideoSampling(), QWEN2_VL) == (100352, 602112)
    assert frame_bounds(768, VideoSampling(), QWEN2_VL) == (100352, 235200)  # 90316800 / 768 * 2
    assert frame_bounds(8, VideoSampling(max_pixels=50000), QWEN2_VL) == (100352, 105369)  # >= 1.05 * min
    # bounded by the model's own [min_pixels, max_pixels]: the tiny model's images are at most 4096
    assert frame_bounds(8, VideoSampling(), TINY) == (4096, 4096)
    assert frame_bounds(8, VideoSampling(min_pixels=512, max_pixels=2048), TINY) == (512, 2048)
    assert frame_bounds(8, VideoSampling(min_pixels=512, total_pixels=2048), TINY) == (512, 537)
    plan = plan_video(VideoHeader(250, 25.0, 480, 640), VideoSampling(), QWEN2_VL)
    assert (plan.height, plan.width, plan.grid_thw, plan.tokens) == (476, 644, (10, 34, 46), 3910)
    assert plan.sample_fps == 2.0
    plan = plan_video(VideoHeader(10, 5.0, 48, 64), VideoSampling(min_pixels=512, max_pixels=2048), TINY)
    assert (plan.indices, plan.height, plan.width, plan.grid_thw, plan.tokens) == \
        ((0, 3, 6, 9), 32, 48, (2, 4, 6), 12)
    with pytest.raises(ValueError, match="--video-fps must be a number > 0, got 0"):
        VideoSampling(fps=0)
    with pytest.raises(ValueError, match="--video-max-frames must be an integer >= 2, got 1"):
        VideoSampling(max_frames=1)


# -- headers, decoding, the processor ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["v.mp4", "v.avi", "v.webm", "v.mov", "frames", "bytes"])
def test_planned_tokens_from_headers_equal_the_decoded_row(qwen, media, name):
    if name == "bytes":
        video = Media("video", data=(media / "v.mp4").read_bytes())
    elif name == "frames":
        video = Media("video", path=media / "frames", frames=tuple(media / "frames" / f"{i}.png"
                                                                   for i in range(1, 11)))
    else:
        video = Media("video", path=media / name)
    header = read_header(video)
    assert header == VideoHeader(10, None if name == "frames" else 5.0, 48, 64)
    sampling = VideoSampling(min_pixels=512, max_pixels=2048)
    for arch, processor in qwen.items():
        conv = _conv(video)
        (plan,) = video_plans(processor, conv, sampling)
        sample = encode_conversation(processor, conv, sampling)
        assert len(sample) == sample_length(processor, conv, sampling)  # planned from the header alone
        video_id = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
        assert int((sample.input_ids == video_id).sum()) == plan.tokens
        assert torch.equal(sample.mm_token_type_ids, (sample.input_ids == video_id).long() * 2)
        assert sample.pixels["video_grid_thw"].tolist() == [list(plan.grid_thw)]
        assert sample.pixels["pixel_values_videos"].shape == (np.prod(plan.grid_thw), 3 * 2 * 8 * 8)
        # files: 2 s at 2 fps, 4 of the 10 frames; frames: all 10 (t = 5), counted as taken at 2 fps
        assert plan.grid_thw == ((5 if name == "frames" else 2), 4, 6)
        if arch == "qwen2_5_vl":  # T / sampled fps: 4 of 10 frames at 5 fps, or frames at --video-fps
            assert sample.pixels["second_per_grid_ts"].tolist() == [1.0]
        else:
            assert set(sample.pixels) == {"pixel_values_videos", "video_grid_thw"}


def test_images_and_videos_in_one_conversation(qwen, media):
    from PIL import Image

    processor = qwen["qwen2_5_vl"]
    conv = dataclasses.replace(_conv(Media("video", path=media / "v.webm"), text="<image>Which moves?"),
                               images=(Media("image", path=media / "small.jpg"),))
    sampling = VideoSampling(min_pixels=512, max_pixels=2048)
    sample = encode_conversation(processor, conv, sampling)
    assert len(sample) == sample_length(processor, conv, sampling)
    ids = processor.tokenizer.convert_tokens_to_ids
    kinds = (sample.input_ids == ids("<|image_pad|>")).long() + 2 * (sample.input_ids == ids("<|video_pad|>"))
    assert torch.equal(sample.mm_token_type_ids, kinds) and set(kinds.tolist()) == {0, 1, 2}
    want = processor.image_processor(images=[Image.open(media / "small.jpg")], return_tensors="pt")
    assert torch.equal(sample.pixels["pixel_values"], want["pixel_values"])  # images as before
    assert sample.pixels["video_grid_thw"].tolist() == [[2, 4, 6]]
    assert sorted(sample.pixels) == ["image_grid_thw", "pixel_values", "pixel_values_videos",
                                     "second_per_grid_ts", "video_grid_thw"]


def test_two_identical_frames_are_the_image_processor_output_for_that_frame(qwen, media):
    from PIL import Image

    processor = qwen["qwen2_vl"]
    image = media / "odd.png"  # 37x53: resized by both paths
    Image.fromarray(_frames(1, 37, 53, seed=3)[0]).save(image)
    # video pixel bounds = the image processor's, so both pick the same size
    sampling = VideoSampling(min_pixels=256, max_pixels=4096, total_pixels=10 ** 9)
    video = Media("video", frames=(image, image))
    (plan,) = video_plans(processor, _conv(video), sampling)
    values, grid = video_pixels(processor.image_processor, decode_frames(video, plan, 3))
    want = processor.image_processor(images=[Image.open(image)], return_tensors="pt")
    assert grid == want["image_grid_thw"][0].tolist()
    assert torch.equal(values, want["pixel_values"])  # bit for bit


def _video_processor_without_torchvision():
    """transformers' own Qwen2VLVideoProcessor, its module run with ``tvF`` absent: everything it
    does but resizing (torchvision's) runs in pure torch; ``normalize`` is ``tvF.normalize``'s
    arithmetic, ``(x - mean) / std`` per channel."""
    import transformers.models.qwen2_vl as package

    path = pathlib.Path(package.__file__).with_name("video_processing_qwen2_vl.py")
    source = path.read_text().replace("import torchvision.transforms.v2.functional as tvF", "tvF = None")
    name = "transformers.models.qwen2_vl._vlmcp_test_video_processing"
    module = types.ModuleType(name)
    module.__package__, module.__file__ = package.__name__, str(path)
    sys.modules[name] = module
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    vp = module.Qwen2VLVideoProcessor(patch_size=8, merge_size=2, temporal_patch_size=2, min_pixels=256,
                                      max_pixels=4096)
    vp.normalize = lambda x, mean, std, **_: (x - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)
    return vp


def test_pixels_match_transformers_qwen2vl_video_processor(qwen, media):
    from transformers.image_utils import SizeDict

    processor = qwen["qwen2_vl"]
    ip = processor.image_processor
    video = Media("video", path=media / "v.mp4")
    (plan,) = video_plans(processor, _conv(video), VideoSampling(min_pixels=512, max_pixels=2048))
    frames = decode_frames(video, plan, 3)
    ours, grid = video_pixels(ip, frames)
    vp = _video_processor_without_torchvision()
    theirs = vp._preprocess(
        [torch.from_numpy(frames).permute(0, 3, 1, 2).float()], do_resize=False,
        size=SizeDict(shortest_edge=512, longest_edge=2048), resample=None, do_rescale=True,
        rescale_factor=ip.rescale_factor, do_normalize=True, image_mean=tuple(ip.image_mean),
        image_std=tuple(ip.image_std), patch_size=8, temporal_patch_size=2, merge_size=2,
        cap_pixels_per_frame=False, return_tensors="pt")
    assert theirs["video_grid_thw"].tolist() == [grid] == [list(plan.grid_thw)]
    # the same layout; values differ by float32 rounding only (transformers fuses rescale into normalize)
    torch.testing.assert_close(ours, theirs["pixel_values_videos"], rtol=0, atol=2e-6)
    # its token count for frames of this size, and its frame count for this header (its indices
    # are arange(0, total, total / n), qwen-vl-utils' and vlmcp's linspace(0, total - 1, n) rounded)
    assert vp.get_num_of_video_patches(len(plan.indices), plan.height, plan.width, {}) == plan.tokens * 4
    metadata = types.SimpleNamespace(total_num_frames=10, fps=5.0)
    sampled = vp.sample_frames(metadata, fps=2.0, num_frames=None)
    assert len(sampled) == len(plan.indices) and sampled.tolist() == [0, 2, 5, 7] != list(plan.indices)


def test_models_that_cannot_take_videos_say_so(media):
    conv = _conv(Media("video", path=media / "v.mp4"))
    plain = build_processor("qwen2_vl")
    plain.chat_template = plain.chat_template.replace("<|video_pad|>", "")  # a template without videos
    with pytest.raises(ValueError, match=r"d.jsonl:3: the chat template wrote 0 video placeholder\(s\) for "
                                         r"1 video\(s\); this model's chat template does not render video "
                                         r"parts"):
        sample_length(plain, conv)
    with pytest.raises(ValueError, match=r"d.jsonl:3: 1 video\(s\): vlmcp encodes videos for "
                                         r"Qwen2VLProcessor, Qwen2_5_VLProcessor, Qwen3VLProcessor, "
                                         r"Glm4vProcessor, LlavaOnevisionProcessor, not LlavaProcessor"):
        sample_length(build_processor("llava"), conv)


def test_missing_pyav_names_the_extra(qwen, media, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'vlmcp\[hf\]'"):
        sample_length(qwen["qwen2_vl"], _conv(Media("video", path=media / "v.mp4")))
    assert main(["data", "shapes", "--out", str(media / "no_av"), "--samples", "0", "--videos", "1"]) == 2
    assert "pip install 'vlmcp[hf]'" in capsys.readouterr().err


def test_bad_videos_are_skipped_at_planning_and_at_training(qwen, media):
    processor = qwen["qwen2_vl"]
    convs = [dataclasses.replace(_conv(Media("video", path=media / n)), line=k + 1)
             for k, n in enumerate(("v.mp4", "junk.mp4", "cut.avi", "v.avi"))]
    sampling = VideoSampling(min_pixels=512, max_pixels=2048)
    index = build_index(processor, convs, 512, video=sampling)  # the junk header: skipped when planned
    assert [(s.where, s.reason.split(":")[0]) for s in index.unreadable] == \
        [("d.jsonl:2", f"cannot read video {media}/junk.mp4")]
    assert index.video == sampling and index.rows == [[0, 1, 2]]
    row = build_row(processor, index, 0)  # the cut avi: header fine, frames not -> left out of the row
    assert row.skipped == (1,) and row.failures[0].where == "d.jsonl:3"
    assert re.fullmatch(f"cannot decode video {media}/cut.avi: ValueError: the stream ends after [0-9] "
                        "frames; its header says 10", row.failures[0].reason)
    assert row.inputs["video_grid_thw"].tolist() == [[2, 4, 6]] * 2
    assert row.tokens == 2 * index.lengths[0] and row.inputs["input_ids"].shape == (1, 512)
    with pytest.raises(ValueError, match=r"d.jsonl:2: cannot read video .*junk.mp4: InvalidDataError.* "
                                         r"\(drop --strict to skip"):
        build_index(processor, convs, 512, video=sampling, strict=True)


# -- the command line ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return export_shapes(tmp_path_factory.mktemp("shapes"), 2, videos=3)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = init_model("qwen2_vl", tmp_path_factory.mktemp("model") / "qwen2_vl")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATES["qwen2_vl"])
    return out


def test_data_shapes_videos_move_as_their_captions_say(shapes):
    lines = [json.loads(line) for line in shapes.read_text().splitlines()]
    assert len(lines) == 5 and [len(line.get("videos", [])) for line in lines] == [0, 0, 1, 1, 1]
    for line in lines[2:]:
        assert line["messages"][0]["content"] == "Describe the video. <video>"
        caption = line["messages"][1]["content"]
        with av.open(str(shapes.parent / line["videos"][0])) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(frames) == 8 and frames[0].shape == (64, 64, 3)
        for words in caption.split(" and "):  # "a red square moves left": its centroid goes left
            _, colour, _, moves, motion = words.split()
            rgb = np.array(COLOUR_RGB[colour]) * 255
            where = [np.argwhere(np.abs(f.astype(float) - rgb).max(-1) < 40).mean(0)
                     for f in (frames[0], frames[-1])]
            dy, dx = where[1] - where[0]
            assert moves == "moves" and {"left": -dx, "right": dx, "up": -dy, "down": dy}[motion] > 20


def test_data_show_json_on_a_video_line(model, shapes, capsys):
    argv = ["data", "show", "--model", str(model), "--data", str(shapes), "--line", "3", "--json"]
    assert main(argv) == 0
    caption = "a red cross moves right and a blue circle moves left"  # data shapes --videos' first video
    assert json.loads(capsys.readouterr().out) == {
        "text": ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nDescribe the "
                 "video. <|vision_start|><video><|vision_end|><|im_end|>\n<|im_start|>assistant\n"
                 f"{caption}<|im_end|>\n"),
        "trained": [f"{caption}<|im_end|>\n"], "tokens": 77, "images": 0, "videos": 1,
        "video_plans": [{"video": str(shapes.parent / "videos" / "000000.mp4"), "frames": 4, "of": 8,
                         "size": [64, 64], "grid": [2, 8, 8], "tokens": 32, "timestamps": []}]}
    # 8 frames at 4 fps: 4 taken, 64x64 each (the tiny model's 4096-pixel bound): 2 x 8 x 8 / 4 = 32 tokens
    assert main(argv[:-1]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == [
        f"{shapes}:3: 77 tokens (19 trained, in [[ ]]), 0 image(s) (0 tokens), 1 video(s) (32 tokens)",
        f"  video 1 ({shapes.parent / 'videos' / '000000.mp4'}): 4 of 8 frames (2 per second of video), "
        "64x64, grid (2, 8, 8): 32 tokens"]
    assert main([*argv, "--video-fps", "4"]) == 0  # all 8 frames: 64 tokens
    assert json.loads(capsys.readouterr().out)["tokens"] == 77 + 32


def test_help_names_every_video_default(capsys):
    for argv in (["train", "--help"], ["data", "show", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        text = " ".join(capsys.readouterr().out.split())
        for flag, default in (("--video-fps FPS", "(default: the model's: 2.0 for Qwen2-VL"),
                              ("--video-min-frames N", "(default: 4"),
                              ("--video-max-frames N", "(default: 768"),
                              ("--video-min-pixels PX", "(default: 128*F^2, F = patch_size*merge_size: "
                                                        "100352"),
                              ("--video-max-pixels PX", "(default: 768*F^2: 602112"),
                              ("--video-total-pixels PX", "(default: 0.9*128000*F^2: 90316800")):
            assert default in text.rsplit(flag, 1)[1].split("--video-", 1)[0], (argv, flag)  # not the usage


# -- training ------------------------------------------------------------------------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("arch, options", [
    ("qwen2_vl", {}),
    ("qwen2_5_vl", {"image_strategy": "shard", "vision_mode": "scatter"}),  # second_per_grid_ts
])
def test_cp2_trains_videos_as_videos_and_skips_a_bad_one(media, shapes, tmp_path, arch, options):
    """``data shapes --videos`` lines, a real mp4 and avi, and a cut avi, CP=2: the loss falls, the
    video inputs reach the model, the cut avi is skipped on both ranks, and the trained model's
    CP logits on a row equal plain transformers' on each of its conversations."""

    from tests.train_cases import hf_rank
    from vlmcp.launch import spawn_ranks
    from vlmcp.train.specs.hf.config import HFTrainConfig
    from vlmcp.train.specs.hf.launch import plan_data, preload_model_code

    model = init_model(arch, tmp_path / arch)
    (model / "chat_template.jinja").write_text(CHAT_TEMPLATES[arch])
    data = tmp_path / "train.jsonl"
    lines = [line for line in shapes.read_text().splitlines() if "videos" in line]
    lines = [line.replace('"videos/', f'"{shapes.parent}/videos/') for line in lines]
    for name in ("v.mp4", "v.avi", "cut.avi"):
        lines.append(json.dumps({"videos": [str(media / name)], "messages": [
            {"role": "user", "content": "<video>Where does the bar go?"},
            {"role": "assistant", "content": "a red bar moves right"}]}))
    data.write_text("\n".join(lines) + "\n")
    cfg = HFTrainConfig(model=str(model), data=str(data), output_dir=str(tmp_path / "out"), seq_len=256,
                        lr=3e-3, timeout=120.0, steps=6, cp=2, video=VideoSampling(min_pixels=512), **options)
    preload_model_code(cfg.model)
    index = plan_data(cfg)
    assert len(index.conversations) == 6 and not index.unreadable
    ranks = spawn_ranks(hf_rank, 2, cfg, index, probe_row0, timeout=200, threads_per_rank=1)
    summary = ranks[0]
    losses = summary["losses"]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.3, losses
    assert [(s.where, s.reason.split(":")[0]) for s in summary["decode_skipped"]] == \
        [(f"{data}:6", f"cannot decode video {media}/cut.avi")]
    assert ranks[1]["decode_skipped"] == summary["decode_skipped"] and ranks[1]["losses"] == losses
    probe = summary["probe"]
    videos = {"pixel_values_videos", "video_grid_thw", "mm_token_type_ids"}
    assert videos | ({"second_per_grid_ts"} if arch == "qwen2_5_vl" else set()) <= set(probe["keys"])
    check_probe_is_transformers(probe, cfg, index)
