"""Encoding conversations (issue 15): labels on exactly the trained messages, templates that
drop a message refused, bad images named by file:line, skipped rows agreed over the CP group."""

import io
import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from tests.chat_templates import TOOL_TEMPLATE  # noqa: E402
from vlmcp.data.hf.encode import (  # noqa: E402
    MediaError,
    check_pixels,
    encode_conversation,
    sample_length,
)
from vlmcp.data.hf.planned import DataIndex  # noqa: E402
from vlmcp.data.hf.processor import load_processor  # noqa: E402
from vlmcp.data.hf.rows import HFRow, build_index, build_row  # noqa: E402
from vlmcp.data.hf.schema import Conversation, Media, Message  # noqa: E402
from vlmcp.debug.init_model import init_model  # noqa: E402

pytestmark = pytest.mark.timeout(120)

ENDS = {"qwen2_vl": "<|im_end|>\n", "llava": "</s>"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {arch: init_model(arch, root / arch) for arch in ("qwen2_vl", "llava")}


@pytest.fixture(scope="module", params=["qwen2_vl", "llava"])
def arch_processor(request, models):
    return request.param, load_processor(models[request.param])


@pytest.fixture(scope="module")
def qwen(models):
    return load_processor(models["qwen2_vl"])


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A PNG, a JPEG cut short (header fine, pixels not) and a 1x300 PNG (Qwen refuses it)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    Image.new("RGB", (28, 28), (200, 30, 30)).save(root / "red.png")
    noise = np.random.default_rng(0).integers(0, 255, (40, 56, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, "JPEG")
    (root / "cut.jpg").write_bytes(buf.getvalue()[:len(buf.getvalue()) * 2 // 3])
    Image.new("RGB", (300, 1)).save(root / "wide.png")
    return root


def conversation(*messages, images=(), line=1, tools=None) -> Conversation:
    """``messages``: ``(role, content)`` or ``(role, content, loss)``; ``images``: paths or bytes."""
    media = tuple(Media("image", data=i) if isinstance(i, bytes) else Media("image", path=i) for i in images)
    return Conversation(line=line, messages=tuple(Message(*m) for m in messages), images=media,
                        source="d.jsonl", tools=tools)


def _trained_text(processor, sample) -> str:
    return processor.tokenizer.decode(sample.input_ids[sample.labels != -100])


def test_labels_follow_loss_flags_and_the_system_slot(arch_processor, images):
    arch, processor = arch_processor
    turns = [("system", "Answer in few words."), ("user", "<image>What is it?"),
             ("assistant", "a red circle", False), ("user", "And its colour?"), ("assistant", "red")]
    conv = conversation(*turns, images=[images / "red.png"])
    sample = encode_conversation(processor, conv)
    assert len(sample) == sample_length(processor, conv)
    assert "Answer in few words." in processor.tokenizer.decode(sample.input_ids)
    assert _trained_text(processor, sample).strip() == "red" + ENDS[arch].strip()
    # loss: true on a user turn trains the whole turn, and only what is flagged
    turns[3] = ("user", "And its colour?", True)
    sample = encode_conversation(processor, conversation(*turns, images=[images / "red.png"]))
    text = _trained_text(processor, sample)
    assert "And its colour?" in text and text.rstrip().endswith("red" + ENDS[arch].strip())
    assert "circle" not in text and "What" not in text and "few words" not in text


def test_a_template_that_drops_a_message_or_the_tools_is_refused(qwen, monkeypatch):
    call = ("tool_call", json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}}))
    # the hub's Qwen2-VL template ignores tool_calls: the call would vanish from training
    with pytest.raises(ValueError, match=r"^d.jsonl:1: the chat template of this model drops the tool_call "
                                         r"message 1 .*'get_weather' is not in the rendered text"):
        sample_length(qwen, conversation(("user", "Weather in Paris?"), call, ("tool_response", "18C"),
                                         ("assistant", "18C.")))
    tools = json.dumps([{"name": "get_weather", "description": "The weather of a city"}])
    with pytest.raises(ValueError, match=r"d.jsonl:1: the chat template of this model drops the tools"):
        sample_length(qwen, conversation(("user", "Hi"), ("assistant", "Hello."), tools=tools))
    no_system = ("{% for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}\n"
                 "{% for c in m.content %}{{ c.text }}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    monkeypatch.setattr(qwen, "chat_template", no_system)
    with pytest.raises(ValueError, match=r"d.jsonl:7: the chat template of this model drops the system "
                                         r"message 0 .*'Be brief.'"):
        sample_length(qwen, conversation(("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello."),
                                         line=7))
    counting = "{{ messages | length }}" + no_system  # every prefix renders a different first character
    monkeypatch.setattr(qwen, "chat_template", counting)
    with pytest.raises(ValueError, match=r"d.jsonl:1: the chat template does not render this conversation "
                                         r"left to right"):
        sample_length(qwen, conversation(("user", "Hi"), ("assistant", "Hello.")))


def test_tool_calls_train_through_a_tool_template(qwen, monkeypatch):
    monkeypatch.setattr(qwen, "chat_template", TOOL_TEMPLATE)
    tools = json.dumps([{"name": "get_weather", "description": "The weather of a city",
                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}])
    conv = conversation(("system", "Be brief."), ("user", "Weather in Paris?"),
                        ("tool_call", '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}'),
                        ("tool_response", '{"celsius": 18}'), ("assistant", "18C."), tools=tools)
    sample = encode_conversation(qwen, conv)
    text = qwen.tokenizer.decode(sample.input_ids)
    assert '"name": "get_weather", "description": "The weather of a city"' in text  # the schema
    assert '<tool_response>\n{"celsius": 18}\n</tool_response>' in text
    assert _trained_text(qwen, sample) == ('<tool_call>\n{"name": "get_weather", "arguments": {"city": '
                                           '"Paris"}}\n</tool_call><|im_end|>\n18C.<|im_end|>\n')
    with pytest.raises(ValueError, match=r"d.jsonl:1: message 1 \(tool_call\) must be"):
        sample_length(qwen, conversation(("user", "Hi"), ("tool_call", '{"name": "f", "arguments": 3}'),
                                         ("assistant", "ok")))


def test_image_and_processor_errors_name_the_line_and_the_image(qwen, images):
    ask = [("user", "<image>What is it?"), ("assistant", "a shape")]
    with pytest.raises(MediaError, match=rf"^d.jsonl:3: the processor refuses image {images}/wide.png: "
                                         r"ValueError: absolute aspect ratio must be smaller than 200"):
        sample_length(qwen, conversation(*ask, images=[images / "wide.png"], line=3))
    cut = conversation(*ask, images=[images / "cut.jpg"], line=4)
    assert sample_length(qwen, cut) > 0  # planning reads the header only
    pattern = rf"^d.jsonl:4: cannot decode image {images}/cut.jpg: OSError: image file is truncated"
    with pytest.raises(MediaError, match=pattern):
        encode_conversation(qwen, cut)
    with pytest.raises(MediaError, match=pattern):
        check_pixels(cut)  # --strict's up-front check
    inline = conversation(*ask, images=[(images / "cut.jpg").read_bytes()], line=5)
    with pytest.raises(MediaError, match=r"^d.jsonl:5: cannot decode image <\d+ inline bytes>: OSError"):
        encode_conversation(qwen, inline)


def test_a_row_leaves_out_a_conversation_whose_image_does_not_decode(qwen, images):
    ask = [("user", "<image>What is it?"), ("assistant", "a shape")]
    convs = [conversation(*ask, images=[images / "red.png"], line=1),
             conversation(*ask, images=[images / "cut.jpg"], line=2),
             conversation(("user", "Say hi."), ("assistant", "hi"), line=3)]
    index = build_index(qwen, convs, 256)
    assert index.rows == [[0, 1, 2]]
    row = build_row(qwen, index, 0)
    assert row.skipped == (1,) and row.tokens == index.lengths[0] + index.lengths[2]
    (failure,) = row.failures
    assert failure.where == "d.jsonl:2" and failure.reason.startswith(f"cannot decode image {images}/cut.jpg")
    assert row.cu_seqlens.tolist() == [0, index.lengths[0], row.tokens, 256]
    assert (row.labels[0, row.tokens:] == -100).all() and row.inputs["image_grid_thw"].shape[0] == 1
    again = build_row(qwen, index, 0, exclude=frozenset({1}))  # what a rank told to skip it builds
    assert again.skipped == (1,) and not again.failures
    assert all(torch.equal(row.inputs[k], again.inputs[k]) for k in row.inputs)
    empty = build_row(qwen, index, 0, exclude=frozenset({0, 1, 2}))  # nothing left: all padding
    assert empty.tokens == 0 and (empty.labels == -100).all() and empty.inputs["mm_token_type_ids"].sum() == 0


def _agree_case(group):
    """Rank 1 fails on conversation 30 and rank 0 (rebuilding) on 40: both end with the union."""
    import torch.distributed as dist

    from vlmcp.data.hf.schema import Skipped
    from vlmcp.train.specs.hf.agree import DecodeSkips, agree_on_skips

    rank = dist.get_rank(group)
    planned = [10, 20, 30, 40]
    flaky = {0: {40}, 1: set()}[rank]
    calls = []

    def fake(skipped, failures=()):
        return HFRow(inputs={}, labels=torch.zeros(1, 1), cu_seqlens=torch.zeros(2), tokens=0, index=0,
                     skipped=tuple(sorted(skipped)), failures=tuple(failures))

    def rebuild(row, exclude):
        calls.append(sorted(exclude))
        new = flaky - exclude
        return fake(exclude | new, row.failures + tuple(Skipped(f"d.jsonl:{i}", f"rank {rank}") for i in new))

    first = {0: {10}, 1: {10, 30}}[rank]
    row = fake(first, [Skipped(f"d.jsonl:{i}", f"rank {rank}") for i in first])
    row = agree_on_skips(row, planned, rebuild, group, torch.device("cpu"))
    convs = [Conversation(line=i, messages=(Message("user", "x"),), source="d.jsonl") for i in range(50)]
    index = DataIndex(conversations=convs, lengths=[1] * 50, rows=[planned], seq_len=8)
    record = DecodeSkips(index, warn=False)
    record.note(row)
    return list(row.skipped), calls, [(s.where, s.reason) for s in record.gather(group)]


def test_the_cp_group_agrees_on_skips_even_when_one_rank_fails_alone():
    from vlmcp.testing import run_on_ranks

    (skips0, calls0, named), (skips1, calls1, named1) = run_on_ranks(_agree_case, 2, timeout=60)
    assert skips0 == skips1 == [10, 30, 40]
    assert calls0 == [[10, 30]] and calls1 == [[10, 30, 40]]  # two rounds of rebuilding, then agreement
    assert named == named1 == [("d.jsonl:10", "rank 0"), ("d.jsonl:30", "rank 1"), ("d.jsonl:40", "rank 0")]
