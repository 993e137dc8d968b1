"""JSONL conversations -> packed HF rows (issue 11): both formats, labels, packing, bad data."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from vlmcp.data.hf.encode import encode_conversation, sample_length  # noqa: E402
from vlmcp.data.hf.export import export_shapes  # noqa: E402
from vlmcp.data.hf.processor import load_processor  # noqa: E402
from vlmcp.data.hf.reader import read_conversations  # noqa: E402
from vlmcp.data.hf.rows import RowLoader, build_index, build_row, pack_first_fit, row_at  # noqa: E402
from vlmcp.debug.init_model import init_model  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return export_shapes(tmp_path_factory.mktemp("shapes"), 12)


@pytest.fixture(scope="module", params=["qwen2_vl", "llava"])
def processor(request, tmp_path_factory):
    return load_processor(init_model(request.param, tmp_path_factory.mktemp(request.param)))


def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _target_text(processor, sample):
    return processor.tokenizer.decode(sample.input_ids[sample.labels != -100])


def test_both_formats_give_the_same_sample(shapes, processor, tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes((shapes.parent / "images" / "000000_0.png").read_bytes())
    # LLaVA's reader puts its one <image> first with one newline (LLaVA's preprocess_multimodal)
    messages = {"messages": [{"role": "user", "content": "<image>\nDescribe the image."},
                             {"role": "assistant", "content": "a red circle top left"}], "images": ["a.png"]}
    llava = {"image": "a.png", "conversations": [{"from": "human", "value": "<image>Describe the image."},
                                                 {"from": "gpt", "value": "a red circle top left"}]}
    path = _write(tmp_path / "d.jsonl", [messages, llava])
    a, b = read_conversations(path, image_root=tmp_path / "pics").conversations
    assert (a.line, b.line) == (1, 2) and a.messages == b.messages and a.images == b.images
    x, y = encode_conversation(processor, a), encode_conversation(processor, b)
    assert torch.equal(x.input_ids, y.input_ids) and torch.equal(x.labels, y.labels)
    ends = ("a red circle top left<|im_end|>", "a red circle top left</s>")
    assert _target_text(processor, x).strip() in ends


def test_loss_covers_every_assistant_turn_and_nothing_else(shapes, processor, tmp_path):
    image = str(shapes.parent / "images" / "000000_0.png")  # an absolute path
    record = {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                           {"role": "user", "content": "Describe the image. <image>"},
                           {"role": "assistant", "content": "a red circle"},
                           {"role": "user", "content": "<image> and this one?"},
                           {"role": "assistant", "content": "a blue square"}], "images": [image, image]}
    (conv,) = read_conversations(_write(tmp_path / "d.jsonl", [record])).conversations
    sample = encode_conversation(processor, conv)
    assert len(sample) == sample_length(processor, conv)
    image_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    assert not (sample.labels == image_id).any()
    text = _target_text(processor, sample)
    for word in ("red", "circle", "blue", "square"):
        assert word in text
    for word in ("Describe", "helpful", "this"):
        assert word not in text


def test_bad_lines_are_named(tmp_path, shapes):
    good = json.loads(shapes.read_text().splitlines()[0])
    good["images"] = [str(shapes.parent / good["images"][0])]
    cases = [
        ("{not json", r"d.jsonl:2: not valid JSON"),
        ("[1, 2]", r"d.jsonl:2: expected a JSON object"),
        ({"text": "hi"}, r"d.jsonl:2: no --data format has the keys \['text'\]"),
        ({"messages": [{"role": "robot", "content": "x"}]}, r"d.jsonl:2: message 0 has role 'robot'"),
        ({"messages": [{"role": "user", "content": "hi"}]}, r"d.jsonl:2: no message carries loss"),
        ({**good, "images": []}, r"d.jsonl:2: 1 <image> placeholder\(s\) but 0 image\(s\)"),
        ({**good, "images": good["images"] * 2}, r"d.jsonl:2: 1 <image> placeholder\(s\) but 2 image\(s\)"),
        ({**good, "images": ["nowhere.png"]}, r"d.jsonl:2: image file .*nowhere.png does not exist"),
    ]
    for bad, match in cases:
        with pytest.raises(ValueError, match=match):
            read_conversations(_write(tmp_path / "d.jsonl", [good, bad]))
    with pytest.raises(ValueError, match="holds no conversation"):
        read_conversations(_write(tmp_path / "d.jsonl", ["", "  "]))
    with pytest.raises(ValueError, match="no such file"):
        read_conversations(tmp_path / "missing.jsonl")


def test_an_unreadable_image_is_skipped_and_named_while_planning(processor, tmp_path):
    (tmp_path / "broken.png").write_bytes(b"not a png")
    record = {"messages": [{"role": "user", "content": "<image>hi"}, {"role": "assistant", "content": "a"}],
              "images": ["broken.png"]}
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}]}
    data = read_conversations(_write(tmp_path / "d.jsonl", [record, good]))
    index = build_index(processor, data, 64)  # skipped, named and counted
    assert [c.line for c in index.conversations] == [2]
    ((where, reason),) = [(s.where, s.reason) for s in index.unreadable]
    assert where.endswith("d.jsonl:1") and reason.startswith(f"cannot read image {tmp_path}/broken.png: ")
    with pytest.raises(ValueError, match=r"d.jsonl:1: cannot read image .*broken.png: .* \(drop --strict"):
        build_index(processor, data, 64, strict=True)
    with pytest.raises(ValueError, match=r"none of the 1 conversations .*\(the first, .*d.jsonl:1: cannot"):
        build_index(processor, data.conversations[:1], 64)


def test_first_fit_packing_never_overflows():
    rows = pack_first_fit([70, 60, 40, 30, 20], 100)
    assert rows == [[0, 3], [1, 2], [4]]
    lengths = [(i * 37) % 90 + 5 for i in range(200)]
    rows = pack_first_fit(lengths, 128)
    assert sorted(i for r in rows for i in r) == list(range(200))
    assert all(sum(lengths[i] for i in r) <= 128 for r in rows)


def test_rows_fill_seq_len_skip_long_samples_and_shuffle_per_epoch(shapes, processor):
    convs = read_conversations(shapes).conversations
    lengths = [sample_length(processor, c) for c in convs]
    seq_len = max(lengths) - 1  # the longest do not fit
    index = build_index(processor, convs, seq_len)
    lines = [int(s.where.rsplit(":", 1)[1]) for s in index.too_long]
    assert lines and all(lengths[line - 1] > seq_len for line in lines)
    assert len(index.conversations) + len(index.too_long) == len(convs)
    row = build_row(processor, index, 0)
    assert row.inputs["input_ids"].shape == row.labels.shape == (1, seq_len)
    assert row.cu_seqlens[-1] == seq_len and row.tokens == sum(index.lengths[i] for i in index.rows[0])
    assert (row.labels[0, row.tokens:] == -100).all()
    with pytest.raises(ValueError, match=r"train.jsonl:\d+: the conversation is \d+ tokens, longer than"):
        build_index(processor, convs, seq_len, strict=True, source=str(shapes))
    with pytest.raises(ValueError, match="none of the 12 conversations can be trained on: 12 longer than"):
        build_index(processor, convs, 8)
    n = len(index.rows)
    epoch0 = [row_at(index, 0, g) for g in range(n)]
    epoch1 = [row_at(index, 0, g) for g in range(n, 2 * n)]
    assert sorted(epoch0) == sorted(epoch1) == list(range(n)) and epoch0 != epoch1


def test_row_loader_prefetches_the_same_rows(shapes, processor):
    index = build_index(processor, read_conversations(shapes).conversations, 160)
    loader = RowLoader(processor, index, seed=3, dp=2, dp_rank=1, start=4, steps=4, prefetch=2)
    try:
        for step in range(4):
            got, want = loader.next(), build_row(processor, index, row_at(index, 3, 4 + 2 * step + 1))
            assert got.index == want.index
            assert all(torch.equal(got.inputs[k], want.inputs[k]) for k in want.inputs)
    finally:
        loader.close()
