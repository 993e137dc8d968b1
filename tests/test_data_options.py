"""``--image-max-pixels``/``--image-min-pixels`` and ``--truncate`` (issue 24, item 8): planning and
training agree, and the model's forward takes what they make."""

import pytest
import torch

pytest.importorskip("transformers")
PIL = pytest.importorskip("PIL.Image")

from vlmcp.data.hf.encode import encode_conversation, planned_tokens, sample_length  # noqa: E402
from vlmcp.data.hf.image_bounds import ImageBounds  # noqa: E402
from vlmcp.data.hf.processor import load_processor  # noqa: E402
from vlmcp.data.hf.rows import build_index, build_row  # noqa: E402
from vlmcp.data.hf.schema import Conversation, Media, Message  # noqa: E402
from vlmcp.data.hf.truncate import Cut  # noqa: E402
from vlmcp.debug.init_model import init_model  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return init_model("qwen2_vl", tmp_path_factory.mktemp("qwen2_vl"))


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return init_model("llava", tmp_path_factory.mktemp("llava"))


def _image(path, size):
    PIL.new("RGB", size, (200, 30, 30)).save(path)
    return Media(kind="image", path=path)


def _conv(images, *turns):
    messages = tuple(Message(role=("user", "assistant")[i % 2], content=t) for i, t in enumerate(turns))
    return Conversation(line=1, messages=messages, images=tuple(images), source="data.jsonl")


def test_bounds_follow_llamafactorys_rule():
    assert ImageBounds(max_pixels=250_000).size(1000, 500) == (707, 353)
    assert ImageBounds(min_pixels=400).size(10, 10) == (20, 20)
    assert ImageBounds(min_pixels=400, max_pixels=10_000).size(50, 50) == (50, 50)
    with pytest.raises(ValueError, match="--image-min-pixels 9 exceeds --image-max-pixels 4"):
        ImageBounds(min_pixels=9, max_pixels=4)


def test_pixel_bounds_count_the_same_tokens_in_planning_and_training(qwen, tmp_path):
    processor = load_processor(qwen)
    conv = _conv([_image(tmp_path / "big.png", (224, 168)), _image(tmp_path / "small.png", (20, 16))],
                 "<image><image>Compare.", "The first is larger.")
    plain = sample_length(processor, conv)
    # the tiny processor's own bounds are 256 ... 4096 pixels: these change what reaches it
    for bounds in (ImageBounds(max_pixels=32 * 32), ImageBounds(min_pixels=48 * 48),
                   ImageBounds(min_pixels=40 * 40, max_pixels=48 * 48)):
        planned = sample_length(processor, conv, images=bounds)
        sample = encode_conversation(processor, conv, bounds=bounds)
        assert len(sample) == planned != plain
        grid = sample.pixels["image_grid_thw"]
        assert int(grid.prod(-1).sum()) == sample.pixels["pixel_values"].shape[0]
    # through the planned index and the rows the ranks build
    index = build_index(processor, [conv], 512, images=ImageBounds(max_pixels=32 * 32))
    row = build_row(processor, index, 0)
    assert row.tokens == index.lengths[0] < plain


@pytest.mark.parametrize("arch", ["qwen2_vl", "llava"])
def test_truncate_cuts_before_an_image_and_drops_it_from_the_pixels(arch, qwen, llava, tmp_path):
    from transformers import AutoModelForImageTextToText

    model_dir = qwen if arch == "qwen2_vl" else llava
    processor = load_processor(model_dir)
    conv = _conv([_image(tmp_path / "a.png", (56, 56)), _image(tmp_path / "b.png", (56, 56))],
                 "<image>What is it?", "A red square.", "<image>And this one? " + "Tell me more. " * 4,
                 "Another red square, " * 6)
    _, ids, trained = planned_tokens(processor, conv)
    pad = processor.image_token_id
    second = [i for i, t in enumerate(ids) if t == pad and ids[i - 1] != pad][1]
    seq_len = second + 2  # inside the second image
    assert build_index(processor, [conv, _conv([], "hi", "ho")], seq_len).too_long[0].where == "data.jsonl:1"
    index = build_index(processor, [conv], seq_len, truncate=True)
    assert index.cuts == (Cut(tokens=second, images=1, videos=0),) and index.lengths == [second]
    full = encode_conversation(processor, conv)
    row = build_row(processor, index, 0)
    assert torch.equal(row.inputs["input_ids"][0, :second], full.input_ids[:second])
    assert torch.equal(row.labels[0, :second], full.labels[:second])
    assert (row.labels[0, second:] == -100).all()
    images = "image_grid_thw" if arch == "qwen2_vl" else "pixel_values"
    assert row.inputs[images].shape[0] == 1
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    keys = ("pixel_values", "image_grid_thw", "mm_token_type_ids")
    inputs = {k: v[:, :second] if k == "mm_token_type_ids" else v for k, v in row.inputs.items() if k in keys}
    with torch.no_grad():  # HF's own check: as many image features as image tokens
        model(input_ids=row.inputs["input_ids"][:, :second], **inputs)
    # a cut in the text after the last image keeps every image
    index = build_index(processor, [conv], len(ids) - 3, truncate=True)
    assert index.cuts == (Cut(tokens=len(ids) - 3, images=2, videos=0),)
    assert build_row(processor, index, 0).inputs[images].shape[0] == 2
    # nothing trained before the cut: skipped as too long, with why
    first_answer = trained.index(True)
    index = build_index(processor, [conv, _conv([], "hi", "ho")], first_answer, truncate=True)
    assert "nothing trains in its first" in index.too_long[0].reason


@pytest.mark.parametrize("arch", ["qwen2_vl", "llava"])
def test_an_ms_swift_pretraining_line_trains_its_text_plain(arch, qwen, llava, tmp_path):
    import json

    from vlmcp.data.hf.reader import read_conversations

    model = qwen if arch == "qwen2_vl" else llava
    processor = load_processor(model)
    _image(tmp_path / "d.png", (32, 32))
    lines = [{"messages": [{"role": "assistant", "content": "<image>is a red dog running home."}],
              "images": ["d.png"]},
             {"messages": [{"role": "assistant", "content": "Plain text, every token trained."}]}]
    (tmp_path / "pt.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    with_image, text = read_conversations(tmp_path / "pt.jsonl").conversations
    assert with_image.pretrain and text.pretrain
    tokenizer = processor.tokenizer
    for conv, words in ((with_image, "is a red dog running home."),
                        (text, "Plain text, every token trained.")):
        sample = encode_conversation(processor, conv)  # the processor's own ids: the placement is checked
        assert len(sample) == sample_length(processor, conv)
        target = tokenizer.decode(sample.input_ids[sample.labels != -100])
        assert target.replace(" ", "") == (words + tokenizer.eos_token).replace(" ", ""), target
        assert "<|im_start|>" not in tokenizer.decode(sample.input_ids)  # no chat template
    assert (encode_conversation(processor, with_image).input_ids == processor.image_token_id).sum() > 0
    # anything beside the one assistant message is a chat line, refused as before
    line = {"system": "s", "messages": lines[1]["messages"]}
    (tmp_path / "pt.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match="pt.jsonl:1: the conversation opens with an assistant message"):
        read_conversations(tmp_path / "pt.jsonl")


def test_resume_refuses_other_data_options_and_takes_old_checkpoints(tmp_path):
    from vlmcp.train.checkpoint.run import check_resumable
    from vlmcp.train.specs.hf.config import HFTrainConfig

    cfg = HFTrainConfig(model="m", data=("d.jsonl",), output_dir=str(tmp_path), steps=4)
    saved = cfg.to_dict()
    for new in ("dataset", "dataset_dir", "max_samples", "image_max_pixels", "image_min_pixels", "truncate"):
        del saved[new]  # a checkpoint written before these options: their defaults
    check_resumable(saved, cfg, 1, tmp_path)
    other = HFTrainConfig(model="m", data=("d.jsonl",), output_dir=str(tmp_path), steps=4,
                          image_max_pixels=4096, truncate=True)
    with pytest.raises(ValueError, match=r"--image-max-pixels None -> 4096, --truncate False -> True"):
        check_resumable(cfg.to_dict(), other, 1, tmp_path)


def test_eval_data_gets_the_training_datas_pixel_bounds_and_truncation(qwen, tmp_path):
    import json

    from vlmcp.train.specs.hf.config import HFTrainConfig
    from vlmcp.train.specs.hf.launch import plan_eval

    _image(tmp_path / "big.png", (224, 168))
    line = {"messages": [{"role": "user", "content": "<image>What is it?"},
                         {"role": "assistant", "content": "A red box. " * 20}], "images": ["big.png"]}
    (tmp_path / "held.jsonl").write_text(json.dumps(line) + "\n")
    processor = load_processor(qwen)
    bounds = ImageBounds(max_pixels=32 * 32)
    held = str(tmp_path / "held.jsonl")
    cfg = HFTrainConfig(model=str(qwen), data=(held,), output_dir=str(tmp_path / "o"), steps=1, seq_len=48,
                        eval_data=(held,), image_max_pixels=32 * 32, truncate=True)
    index = plan_eval(cfg, processor)
    assert index.images == bounds and index.cuts == (Cut(tokens=48, images=1, videos=0),)
    assert len(planned_tokens(processor, index.conversations[0], images=bounds)[1]) > 48
    assert build_row(processor, index, 0).tokens == 48


def test_eval_dataset_names_held_out_data_in_dataset_info(qwen, tmp_path):
    import json

    from vlmcp.train.specs.hf.config import HFTrainConfig
    from vlmcp.train.specs.hf.launch import plan_eval

    lines = [{"q": f"Question {i}?", "a": f"Answer {i}."} for i in range(3)]
    (tmp_path / "held.json").write_text(json.dumps(lines))
    info = {"held": {"file_name": "held.json", "columns": {"prompt": "q", "response": "a"}}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    processor = load_processor(qwen)
    cfg = HFTrainConfig(model=str(qwen), data=(), dataset="held", dataset_dir=str(tmp_path),
                        eval_dataset="held", max_samples=2, output_dir=str(tmp_path / "o"), steps=1,
                        seq_len=128)
    index = plan_eval(cfg, processor)
    assert [c.messages[-1].content for c in index.conversations] == ["Answer 0.", "Answer 1."]
    none = HFTrainConfig(model=str(qwen), data=("x.jsonl",), output_dir="o", steps=1)
    assert plan_eval(none, processor) is None


def test_truncate_drops_a_video_whole_before_its_first_token(qwen, tmp_path):
    import json

    from transformers import AutoModelForImageTextToText

    from vlmcp.data.hf.export import export_shapes

    pytest.importorskip("av")
    line = json.loads(export_shapes(tmp_path / "v", 0, videos=1).read_text().splitlines()[0])
    video = Media(kind="video", path=tmp_path / "v" / line["videos"][0])
    messages = (Message("user", "Hi there, who are you?"), Message("assistant", "A model of shapes."),
                Message("user", "<video>What happens?"), Message("assistant", "A shape moves. " * 5))
    conv = Conversation(line=1, messages=messages, videos=(video,), source="data.jsonl")
    processor = load_processor(qwen)
    _, ids, _ = planned_tokens(processor, conv)
    pads = [i for i, t in enumerate(ids) if t == processor.video_token_id]
    index = build_index(processor, [conv], pads[len(pads) // 2], truncate=True)  # inside the video
    assert index.cuts == (Cut(tokens=pads[0], images=0, videos=0),)
    row = build_row(processor, index, 0)
    assert "pixel_values_videos" not in row.inputs and row.tokens == pads[0]
    model = AutoModelForImageTextToText.from_pretrained(qwen).eval()
    with torch.no_grad():
        model(input_ids=row.inputs["input_ids"][:, :pads[0]])
    # a cut after the video keeps it whole
    index = build_index(processor, [conv], len(ids) - 2, truncate=True)
    assert index.cuts == (Cut(tokens=len(ids) - 2, images=0, videos=1),)
    assert build_row(processor, index, 0).inputs["video_grid_thw"].shape[0] == 1
