"""LLaMA-Factory's and ms-swift's shipped demo data on every ``vlmcp init-model`` architecture (issue 31).

transformers 5.25's Qwen3-VL processor collapses the chat template's ``<|vision_start|><|video_pad|>
<|vision_end|>`` into the frame groups, 5.24's keeps it; planning now expands with the processor's own
``get_text_with_replacements`` (Note [vlmcp data: the processor's own expansion]), and a plan the
processor would not follow is refused at planning. Shown here, on data rebuilt as the two projects
ship it (tests/demo_data.py):

* every video family's planned tokens are its processor's on six real clips (three frame rates, mp4
  and avi, 1.5 to 12.4 s: timestamps of 10 s and more), against transformers' own video processor
  where it runs without torchvision (tests/video_oracle.py);
* ``vlmcp data show`` prints each demo video's frame groups and the tokens training encodes;
* a planned expansion that differs from the processor's is refused before any rank starts, in one
  line naming ``file:line``;
* every architecture trains 2 steps at CP=2 on LLaMA-Factory's ``mllm_demo`` and ``mllm_video_demo``
  (through its ``dataset_info.json``) and ms-swift's documented lines, all ranks in one spawn; what
  an architecture cannot train is refused in one line at planning.
"""

import math

import pytest

pytest.importorskip("transformers")
pytest.importorskip("av")

from tests.demo_data import CLIPS, MORE_CLIPS, write_clip, write_llamafactory, write_ms_swift  # noqa: E402
from tests.video_oracle import decoded, transformers_inputs  # noqa: E402
from vlmcp.cli import main  # noqa: E402
from vlmcp.data.hf.encode import encode_conversation, sample_length, video_plans  # noqa: E402
from vlmcp.data.hf.processor import load_processor  # noqa: E402
from vlmcp.data.hf.schema import Conversation, Media, Message  # noqa: E402
from vlmcp.data.hf.template import render  # noqa: E402
from vlmcp.data.hf.video import video_rules  # noqa: E402
from vlmcp.debug.init_model import ARCHS, init_model  # noqa: E402

pytestmark = pytest.mark.timeout(300)

VIDEO_ARCHS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "glm4v", "llava_onevision")
"""The ``init-model`` architectures whose videos vlmcp encodes (every video family)."""
ORACLE = ("qwen3_vl", "qwen3_5", "glm4v", "llava_onevision")
"""Those whose transformers video processor runs here without torchvision (tests/video_oracle.py);
Qwen2-VL's frames follow qwen-vl-utils, and its text is its processor's own call on them."""


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def lf(tmp_path_factory):
    """LLaMA-Factory's ``data/``, and the two clips of other lengths beside its demo media."""
    root = write_llamafactory(tmp_path_factory.mktemp("llamafactory") / "data")
    for k, (name, spec) in enumerate(MORE_CLIPS.items()):
        write_clip(root / "mllm_demo_data" / name, *spec, seed=10 + k)
    return root


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {arch: init_model(arch, root / arch) for arch in ARCHS}


def _conv(path) -> Conversation:
    return Conversation(line=1, source="d.jsonl", videos=(Media("video", path=path),),
                        messages=(Message("user", "<video>What moves?"),
                                  Message("assistant", "A red square.")))


def test_every_video_family_expands_real_clips_as_its_processor(models, lf):
    """36 cases: 6 video architectures x 6 clips. The planned tokens (headers only) are the tokens
    training encodes, which are the processor's own call's (encode_conversation refuses any other);
    where transformers' video processor runs, its output on the whole decoded clip (its own
    sampling, resize, timestamps) has the same ids, token types and grid."""
    processors = {arch: load_processor(models[arch]) for arch in VIDEO_ARCHS}
    cases = 0
    for name in (*CLIPS, *MORE_CLIPS):
        path = lf / "mllm_demo_data" / name
        frames, fps = decoded(path)
        for arch, processor in processors.items():
            conv = _conv(path)
            (plan,) = video_plans(processor, conv)
            ours = encode_conversation(processor, conv)
            assert len(ours) == sample_length(processor, conv), (arch, name)
            text = processor.tokenizer.decode(ours.input_ids)
            if arch in ORACLE:
                picked = {"do_sample_frames": False} if arch == "llava_onevision" else {}
                clip = frames[list(plan.indices)] if picked else frames
                theirs = transformers_inputs(processor, render(processor, conv).text, clip, fps, **picked)
                assert ours.input_ids.tolist() == theirs["input_ids"][0].tolist(), (arch, name)
                for key in ("mm_token_type_ids", "video_grid_thw"):
                    if key in theirs:
                        mine = ours.mm_token_type_ids if key == "mm_token_type_ids" else ours.pixels[key]
                        assert mine.reshape(theirs[key].shape).tolist() == theirs[key].tolist(), (arch, key)
            if arch in ("qwen3_vl", "qwen3_5"):  # "<t seconds>", one decimal, before each frame group
                groups = [f"<{t:.1f} seconds><|vision_start|>" for t in plan.timestamps]
                assert all(g in text for g in groups), (arch, name)
                assert len(plan.timestamps) == plan.grid_thw[0]
            if arch == "glm4v":  # whole seconds after each frame group
                assert all(f"<|end_of_image|>{int(t)}" in text for t in plan.timestamps), name
            if name == "long.mp4" and arch in ("qwen3_vl", "qwen3_5", "glm4v"):
                assert max(plan.timestamps) >= 10, (arch, plan.timestamps)
            cases += 1
    assert cases == 36


@pytest.mark.parametrize("arch", ["qwen3_vl", "qwen3_5"])
def test_data_show_prints_the_demo_videos_frame_groups(models, lf, capsys, arch):
    """``vlmcp data show`` on LLaMA-Factory's mllm_video_demo.json as shipped: each line's frame groups
    and seconds, and the token count training encodes."""
    import json

    from vlmcp.data.hf.reader import read_conversations

    processor = load_processor(models[arch])
    demo = lf / "mllm_video_demo.json"
    for conv in read_conversations([demo]).conversations:
        assert main(["data", "show", "--model", str(models[arch]), "--data", str(demo), "--line",
                     str(conv.line), "--json"]) == 0
        view = json.loads(capsys.readouterr().out)
        (plan,) = video_plans(processor, conv)
        assert view["tokens"] == len(encode_conversation(processor, conv)) and view["videos"] == 1
        assert view["video_plans"][0]["timestamps"] == list(plan.timestamps) and plan.timestamps
        # <video> stands for what the processor replaces: 5.24 the pad alone, 5.25 the template's
        # vision start, pad and end
        rendered = render(processor, conv).text
        (_,), ((offset,),) = processor.get_text_with_replacements([rendered], [], ["X"])
        replaced = offset["text"]
        assert replaced in ("<|video_pad|>", "<|vision_start|><|video_pad|><|vision_end|>")
        assert view["text"] == rendered.replace(replaced, "<video>")
        assert main(["data", "show", "--model", str(models[arch]), "--data", str(demo), "--line",
                     str(conv.line)]) == 0
        head = capsys.readouterr().out.splitlines()[:2]
        assert head[0].startswith(f"{demo}:[{conv.line}]: {view['tokens']} tokens")
        stamps = ", ".join(f"{t:g}" for t in plan.timestamps[:8])
        assert f"frame groups at {stamps}" in head[1], head


def test_a_processor_without_video_rules_is_refused_by_name():
    """GLM-4.6V's processor (its own frame sampler) is not one vlmcp encodes videos for: a line with a
    video is refused at planning, naming the line and the processor."""
    glm46v = type("Glm46VProcessor", (), {"video_token": "<|video|>"})()
    with pytest.raises(ValueError, match=r"^d.jsonl:1: 1 video\(s\): vlmcp encodes videos for .*, not "
                                         r"Glm46VProcessor; drop the video lines"):
        video_plans(glm46v, _conv("clip.mp4"))


def test_a_plan_the_processor_would_not_follow_is_refused_before_any_rank(models, lf, tmp_path, capsys,
                                                                          monkeypatch):
    """vlmcp's expansion made to keep a vision start / end around each video the processor does not
    write (the 5.24-vs-5.25 bug, on either version): ``vlmcp train`` exits 2 with one line naming the
    first video line and the first different token, and no rank starts."""
    import vlmcp.data.hf.encode as encode

    real = encode.replacement_texts
    monkeypatch.setattr(encode, "replacement_texts", lambda processor, plans: [
        f"<|vision_start|>{text}<|vision_end|>" for text in real(processor, plans)])
    demo = lf / "mllm_video_demo.json"
    argv = ["train", "--model", str(models["qwen3_vl"]), "--data", str(demo), "--cp", "2", "--steps", "1",
            "--output-dir", str(tmp_path / "out")]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert line.startswith(f"vlmcp train: error: {demo}:[1]: the processor's tokens differ from the "
                           "planned ones")
    assert "first difference at token" in line and line.endswith(
        "cannot place the labels (found at planning, on the first conversation with a video: every such "
        "conversation would fail in training)")
    assert "spawning" not in out and not (tmp_path / "out" / "vlmcp_config.yaml").exists()


def _train_all(group, runs):
    """Each ``(cfg, index)`` trained in turn on the same ranks (one spawn for every architecture)."""
    from tests.train_cases import hf_rank

    return [hf_rank(group, cfg, index) for cfg, index in runs]


def _kind(conv) -> str:
    return ("pt " if conv.pretrain else "") + "/".join(
        f"{min(len(media), 2)} {what}" for what, media in (("images", conv.images), ("videos", conv.videos)))


@pytest.mark.slow
def test_every_architecture_trains_on_the_shipped_demo_data(models, lf, tmp_path):
    """Each ``init-model`` architecture, 2 steps at CP=2 on ``--dataset mllm_demo,mllm_video_demo
    --dataset-dir data`` and ms-swift's pre-training and fine-tuning lines (text only, one image, two
    images in one turn and in two, a video, an image and a video, frames as a video). Refused at
    planning, in one line naming ``file:line``: videos for the four architectures whose videos vlmcp
    does not encode, and ms-swift's pre-training lines with images for LLaVA-OneVision (its template
    writes images before the text, never in place); GLM-4.1V gets no line mixing images and videos
    (its forward cannot take both: tests/test_video_families.py)."""
    import dataclasses

    from vlmcp.data.hf.rows import row_at
    from vlmcp.launch import spawn_ranks
    from vlmcp.train.specs.hf.config import HFTrainConfig
    from vlmcp.train.specs.hf.launch import plan_data, preload_model_code

    runs, kinds = [], {}
    for arch in ARCHS:
        processor = load_processor(models[arch])
        try:
            videos, mixed = True, video_rules(processor).mixes_images_and_videos
        except ValueError:
            videos = mixed = False
        swift = write_ms_swift(tmp_path / f"swift_{arch}", lf / "mllm_demo_data", videos=videos, mixed=mixed)
        cfg = HFTrainConfig(model=str(models[arch]), data=(str(swift["pt"]), str(swift["sft"])),
                            dataset="mllm_demo,mllm_video_demo", dataset_dir=str(lf),
                            output_dir=str(tmp_path / f"out_{arch}"), steps=2, cp=2, lr=1e-3, seq_len=4096,
                            timeout=120.0)
        if not videos:
            with pytest.raises(ValueError) as err:
                plan_data(cfg)
            assert str(err.value).startswith(f"{lf / 'mllm_video_demo.json'}:[1]: 1 video(s): vlmcp encodes "
                                             "videos for ") and "\n" not in str(err.value), (arch, err.value)
            cfg = dataclasses.replace(cfg, dataset="mllm_demo")
        if arch == "llava_onevision":
            with pytest.raises(ValueError) as err:
                plan_data(cfg)
            assert str(err.value).startswith(f"{swift['pt']}:2: a pre-training line with images: "
                                             "LlavaOnevisionProcessor's chat template does not write an "
                                             "image part in place"), err.value
            cfg = dataclasses.replace(cfg, data=(str(swift["sft"]),))
        index = plan_data(cfg)
        assert not index.unreadable and not index.too_long and not index.format_skipped, arch
        kinds[arch] = {_kind(c) for c in index.conversations}
        runs.append((cfg, index))
    for arch in VIDEO_ARCHS:
        want = {"0 images/0 videos", "1 images/0 videos", "2 images/0 videos", "0 images/1 videos"}
        assert want <= kinds[arch], (arch, kinds[arch])
    assert "pt 2 images/0 videos" in kinds["qwen3_vl"] and "1 images/1 videos" in kinds["qwen3_5"]
    preload_model_code(runs[0][0].model)
    summaries = spawn_ranks(_train_all, 2, runs, timeout=None, threads_per_rank=1)[0]
    for (cfg, index), summary in zip(runs, summaries, strict=True):
        arch = cfg.model.rsplit("/", 1)[-1]
        losses = summary["losses"]
        assert len(losses) == 2 and all(math.isfinite(x) for x in losses), (arch, losses)
        assert not summary["decode_skipped"] and summary["model_dir"], arch
        rows = [index.rows[row_at(index, cfg.seed, p)] for p in range(2)]
        assert summary["tokens"] == sum(index.lengths[i] for row in rows for i in row), arch
        assert {i for row in rows for i in row} == set(range(len(index.conversations))), arch  # all trained
