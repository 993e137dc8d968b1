"""``vlmcp init-model`` and ``vlmcp data shapes`` (issue 11): offline model directories and data files."""

import json
import os

import numpy as np
import pytest

pytest.importorskip("transformers")

from transformers import AutoModelForImageTextToText, AutoProcessor  # noqa: E402
from transformers.utils import is_torchvision_available  # noqa: E402

from vlmcp.cli import main  # noqa: E402
from vlmcp.data.hf.processor import load_processor  # noqa: E402
from vlmcp.debug.init_model import ARCHS  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    for arch in ARCHS:
        assert main(["init-model", "--arch", arch, "--out", str(root / arch)]) == 0
    return root


def _conversation():
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "a red circle top left"}]}]


def _image(h, w):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("arch", ARCHS)
def test_directory_loads_offline_and_runs(model_dirs, arch):
    path = model_dirs / arch
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja",
            "processor_config.json"} <= set(os.listdir(path))
    model = AutoModelForImageTextToText.from_pretrained(path)
    assert model.config.model_type == arch
    if arch in ("llava", "gemma3") or is_torchvision_available():  # the others' processors have a video part
        processor = AutoProcessor.from_pretrained(path)
    else:  # transformers' Qwen2-VL video processor needs torchvision; vlmcp loads images only
        processor = load_processor(path)
    assert type(processor).__name__ == {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor",
                                        "qwen3_vl": "Qwen3VLProcessor", "qwen3_5": "Qwen3VLProcessor",
                                        "llava": "LlavaProcessor", "internvl": "InternVLProcessor",
                                        "llava_onevision": "LlavaOnevisionProcessor",
                                        "gemma3": "Gemma3Processor", "smolvlm": "SmolVLMProcessor",
                                        "glm4v": "Glm4vProcessor"}[arch]
    text = processor.apply_chat_template(_conversation(), tokenize=False)
    inputs = processor(text=[text], images=[_image(32, 48)], return_tensors="pt")
    logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], len(processor.tokenizer))
    # every caption word is one token: rows stay short
    words = processor.tokenizer("a red circle top left", add_special_tokens=False)["input_ids"]
    assert len(words) == 5


@pytest.mark.parametrize("arch, size, tokens", [("qwen2_vl", (32, 48), 6), ("qwen2_vl", (16, 16), 1),
                                                ("qwen2_5_vl", (48, 48), 9), ("qwen3_5", (32, 48), 6),
                                                ("llava", (40, 24), 16),
                                                # tiles (a thumbnail when more than one) x 4
                                                ("internvl", (8, 8), 4), ("internvl", (32, 48), 20),
                                                ("internvl", (40, 24), 12),
                                                # base tile 16 + grid unpadded, shrunk, newline per row
                                                ("llava_onevision", (8, 8), 36),
                                                ("llava_onevision", (32, 48), 31),
                                                # resized to 32x32 whatever the size, pooled to 2x2
                                                ("gemma3", (32, 48), 4), ("gemma3", (8, 8), 4),
                                                # (crops + global image) x 4: longest edge 24 in 8x8 crops
                                                ("smolvlm", (32, 48), 28), ("smolvlm", (8, 8), 40),
                                                ("smolvlm", (100, 10), 16), ("smolvlm", (40, 24), 28)])
def test_processor_expands_the_image_placeholder(model_dirs, arch, size, tokens):
    processor = load_processor(model_dirs / arch)
    text = processor.apply_chat_template(_conversation(), tokenize=False)
    ids = processor(text=[text], images=[_image(*size)], return_tensors="pt")["input_ids"][0]
    # Gemma 3's processor.image_token is the placeholder <start_of_image>; its image tokens are soft tokens
    image_token = processor.tokenizer.image_token if arch == "gemma3" else processor.image_token
    image_id = processor.tokenizer.convert_tokens_to_ids(image_token)
    assert int((ids == image_id).sum()) == tokens
    # what planning writes from the size alone is the processor's expansion, in place (InternVL: with
    # <img>, </img>, which transformers 5.24 counts among its tokens and 5.25 does not)
    from vlmcp.data.hf.image_text import image_texts
    from vlmcp.data.hf.schema import Conversation, Media, Message

    one = Conversation(line=1, source="d.jsonl", images=(Media("image", path="x.png"),),
                       messages=(Message("user", "<image>"), Message("assistant", "a")))
    (planned,) = image_texts(processor, one, [size])
    assert planned.count(image_token) == tokens
    # (Gemma 3's newlines around the image tokenize with the text beside them)
    piece = processor.tokenizer(planned.strip("\n"), add_special_tokens=False)["input_ids"]
    assert any(ids[k:k + len(piece)].tolist() == piece for k in range(len(ids)))
    if arch == "internvl":
        assert planned.startswith("<img>") and planned.endswith("</img>")
    specials = {"llava": ["<image>", "</s>"],
                "internvl": ["<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"],
                "llava_onevision": ["<|im_start|>", "<|im_end|>", "<image>", "<video>", "<|endoftext|>"],
                "gemma3": ["<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                           "<image_soft_token>"],
                "smolvlm": ["<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<global-img>",
                            "<image>", "<row_1_col_1>", "<row_3_col_3>"],
                "glm4v": ["[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|begin_of_image|>", "<|image|>",
                          "<|end_of_image|>", "<|begin_of_video|>", "<|video|>", "<|end_of_video|>"]}.get(
        arch, ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|endoftext|>"])
    for token in specials:  # single ids
        assert len(processor.tokenizer(token, add_special_tokens=False)["input_ids"]) == 1


def test_gemma3_planned_tokens_are_the_processors_expansion(model_dirs, tmp_path):
    """Gemma 3 writes each image as ``\\n\\n<start_of_image>`` + 4 soft tokens + ``<end_of_image>\\n\\n``,
    whose newlines tokenize with the text around them: planning (headers only) gives the processor's
    tokens, the trained tokens are the answer's, and ``token_type_ids`` marks the soft tokens."""
    from vlmcp.data.hf.encode import encode_conversation, planned_tokens
    from vlmcp.data.hf.export import export_shapes
    from vlmcp.data.hf.reader import read_conversations

    processor = load_processor(model_dirs / "gemma3")
    data = export_shapes(tmp_path / "shapes", 8)
    convs = read_conversations(data).conversations
    assert any(c.images for c in convs) and any(not c.images for c in convs)
    tokenizer = processor.tokenizer
    soft, boi = (tokenizer.convert_tokens_to_ids(t) for t in ("<image_soft_token>", "<start_of_image>"))
    for conv in convs:
        _, ids, trained = planned_tokens(processor, conv)
        sample = encode_conversation(processor, conv)
        assert sample.input_ids.tolist() == ids
        assert sample.token_type_ids.tolist() == [int(t == soft) for t in ids]
        assert ids.count(soft) == 4 * len(conv.images) and ids.count(boi) == len(conv.images)
        if conv.images:  # the processor's "\\n\\n" before the image: one merged token, not two
            assert tokenizer.decode([ids[ids.index(boi) - 1]]).endswith("\n\n")
        answer = tokenizer.decode([t for t, on in zip(ids, trained, strict=True) if on])
        assert answer.endswith("<end_of_turn>\n") and "<start_of_image>" not in answer
        assert "token_type_ids" not in sample.pixels  # per token: rows concatenate it like input_ids
        assert ("pixel_values" in sample.pixels) == bool(conv.images)


def test_smolvlm_planned_tokens_are_the_processors_expansion(model_dirs, tmp_path):
    """SmolVLM writes each image as crops (``<fake_token_around_image><row_i_col_j>`` + 4 ``<image>``),
    a newline after each row, then ``\\n`` and the global image: planning (headers only) gives the
    processor's tokens, the trained tokens are the answer's, tiles are (1, crops + 1, 3, 8, 8)."""
    from vlmcp.data.hf.encode import encode_conversation, planned_tokens
    from vlmcp.data.hf.export import export_shapes
    from vlmcp.data.hf.reader import read_conversations

    processor = load_processor(model_dirs / "smolvlm")
    convs = read_conversations(export_shapes(tmp_path / "shapes", 8)).conversations
    assert any(c.images for c in convs) and any(not c.images for c in convs)
    tokenizer = processor.tokenizer
    image, glob = (tokenizer.convert_tokens_to_ids(t) for t in ("<image>", "<global-img>"))
    for conv in convs:
        _, ids, trained = planned_tokens(processor, conv)
        sample = encode_conversation(processor, conv)
        assert sample.input_ids.tolist() == ids
        assert ids.count(glob) == len(conv.images)
        answer = tokenizer.decode([t for t, on in zip(ids, trained, strict=True) if on])
        assert answer.endswith("<end_of_utterance>\n") and "<image>" not in answer
        if conv.images:
            pv, mask = sample.pixels["pixel_values"], sample.pixels["pixel_attention_mask"]
            assert pv.shape == (1, ids.count(image) // 4, 3, 8, 8) and mask.shape == (*pv.shape[:2], 8, 8)
        else:
            assert not sample.pixels


def test_saved_processor_round_trips(model_dirs, tmp_path):
    from vlmcp.data.hf.processor import save_processor

    for arch in ARCHS:
        processor = load_processor(model_dirs / arch)
        save_processor(processor, tmp_path / arch)
        again = load_processor(tmp_path / arch)
        assert again.chat_template == processor.chat_template
        assert again.tokenizer.get_vocab() == processor.tokenizer.get_vocab()
        assert again.image_processor.to_dict() == processor.image_processor.to_dict()


def test_data_shapes_writes_messages_and_pngs(tmp_path, capsys):
    from PIL import Image

    assert main(["data", "shapes", "--out", str(tmp_path), "--samples", "8"]) == 0
    lines = [json.loads(line) for line in open(tmp_path / "train.jsonl")]
    assert len(lines) == 8
    for record in lines:
        user, assistant = record["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        assert user["content"].count("<image>") == len(record["images"])
        for name in record["images"]:
            assert Image.open(tmp_path / name).size[0] >= 16
    assert sum(not r["images"] for r in lines) == 2  # every 4th sample is text only
    assert "wrote 8 conversations" in capsys.readouterr().out


def test_unwritable_out_is_one_line_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for argv in (["init-model", "--arch", "llava", "--out", str(blocker / "m")],
                 ["data", "shapes", "--out", str(blocker / "d"), "--samples", "2"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--out" in err[0] and "is a file, not a directory" in err[0], err
    assert main(["data", "shapes", "--out", str(tmp_path / "d"), "--samples", "0"]) == 2
    assert "--samples must be" in capsys.readouterr().err


def test_init_model_refuses_a_directory_with_files(tmp_path, capsys):
    """A trained --output-dir must not be replaced by a random model by mistake; --force overwrites."""
    (tmp_path / "config.json").write_text("{}")
    assert main(["init-model", "--arch", "llava", "--out", str(tmp_path)]) == 2
    assert "already holds files" in capsys.readouterr().err
    assert (tmp_path / "config.json").read_text() == "{}"
