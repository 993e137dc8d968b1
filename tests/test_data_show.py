"""``vlmcp data show`` (issue 15): exactly what a line trains, per format and architecture."""

import io
import json
import shutil

import numpy as np
import pytest

pytest.importorskip("transformers")

from tests.chat_templates import TOOL_TEMPLATE  # noqa: E402
from vlmcp.cli import main  # noqa: E402
from vlmcp.data.hf.encode import encode_conversation  # noqa: E402
from vlmcp.data.hf.processor import load_processor  # noqa: E402
from vlmcp.data.hf.reader import read_conversations  # noqa: E402
from vlmcp.data.hf.show import view_conversation  # noqa: E402
from vlmcp.debug.init_model import init_model  # noqa: E402

pytestmark = pytest.mark.timeout(120)

# an ms-swift / LLaMA-Factory line: top-level system, one turn not trained (loss: false)
MESSAGES = {"system": "Answer in few words.", "images": ["red.png"],
            "messages": [{"role": "user", "content": "<image>What is it?"},
                         {"role": "assistant", "content": "a red circle", "loss": False},
                         {"role": "user", "content": "And its colour?"},
                         {"role": "assistant", "content": "red"}]}
LLAVA = {"id": "7", "image": "red.png",
         "conversations": [{"from": "human", "value": "What is this?\n<image>"},
                           {"from": "gpt", "value": "A red square."}]}
TOOLS = {"system": "Be brief.", "conversations": [
    {"from": "human", "value": "Weather in Paris?"},
    {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
    {"from": "observation", "value": "18C"},
    {"from": "gpt", "value": "18C in Paris."}],
    "tools": json.dumps([{"name": "get_weather", "description": "The weather of a city"}])}

QWEN_HEAD = "<|im_start|>system\n"
WANT = {
    ("qwen2_vl", 1): {
        "text": (QWEN_HEAD + "Answer in few words.<|im_end|>\n<|im_start|>user\n<|vision_start|><image>"
                 "<|vision_end|>What is it?<|im_end|>\n<|im_start|>assistant\na red circle<|im_end|>\n"
                 "<|im_start|>user\nAnd its colour?<|im_end|>\n<|im_start|>assistant\nred<|im_end|>\n"),
        "trained": ["red<|im_end|>\n"], "tokens": 74, "images": 1, "videos": 0},
    ("qwen2_vl", 2): {
        "text": (QWEN_HEAD + "You are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|vision_start|>"
                 "<image><|vision_end|>\nWhat is this?<|im_end|>\n<|im_start|>assistant\nA red square."
                 "<|im_end|>\n"),
        "trained": ["A red square.<|im_end|>\n"], "tokens": 41, "images": 1, "videos": 0},
    # the HF LLaVA template writes "<image>\n" itself: the line's own newline is not doubled
    ("llava", 1): {
        "text": ("Answer in few words. USER: <image>\nWhat is it? ASSISTANT: a red circle</s>USER: And its "
                 "colour? ASSISTANT: red</s>"),
        "trained": [" red</s>"], "tokens": 73, "images": 1, "videos": 0},
    ("llava", 2): {
        "text": "USER: <image>\nWhat is this? ASSISTANT: A red square.</s>",
        "trained": [" A red square.</s>"], "tokens": 37, "images": 1, "videos": 0},
    ("tools", 3): {
        "text": (QWEN_HEAD + "Be brief.\n\n# Tools\n<tools>\n{\"type\": \"function\", \"function\": "
                 "{\"name\": \"get_weather\", \"description\": \"The weather of a city\"}}\n</tools>"
                 "<|im_end|>\n"
                 "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
                 "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
                 "<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
                 "18C in Paris.<|im_end|>\n"),
        "trained": ["<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                    "</tool_call><|im_end|>\n", "18C in Paris.<|im_end|>\n"],
        "tokens": 272, "images": 0, "videos": 0},
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny Qwen2-VL and LLaVA, and the Qwen2-VL with a tool-capable chat template."""
    root = tmp_path_factory.mktemp("models")
    out = {arch: init_model(arch, root / arch) for arch in ("qwen2_vl", "llava")}
    out["tools"] = shutil.copytree(out["qwen2_vl"], root / "tools")
    (out["tools"] / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """``a.jsonl``: MESSAGES, LLAVA, TOOLS; ``b.jsonl``: a line whose JPEG is cut short, MESSAGES."""
    from PIL import Image

    root = tmp_path_factory.mktemp("data")
    Image.new("RGB", (28, 28), (200, 30, 30)).save(root / "red.png")
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(buf, "JPEG")
    (root / "cut.jpg").write_bytes(buf.getvalue()[:len(buf.getvalue()) * 2 // 3])
    (root / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (MESSAGES, LLAVA, TOOLS)))
    cut = {**MESSAGES, "images": ["cut.jpg"]}
    (root / "b.jsonl").write_text(json.dumps(cut) + "\n" + json.dumps(MESSAGES) + "\n")
    return root


def _show(capsys, *argv) -> str:
    assert main(["data", "show", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("arch, line", [("qwen2_vl", 1), ("qwen2_vl", 2), ("llava", 1), ("llava", 2),
                                        ("tools", 3)])
def test_json_is_exactly_what_trains(models, data, capsys, arch, line):
    out = _show(capsys, "--model", str(models[arch]), "--data", str(data / "a.jsonl"), "--line", str(line),
                "--json")
    assert json.loads(out) == WANT[arch, line]
    # the same tokens training encodes (pixels and all)
    conv = read_conversations(data / "a.jsonl").conversations[line - 1]
    assert len(encode_conversation(load_processor(models[arch]), conv)) == WANT[arch, line]["tokens"]


def test_plain_view_marks_trained_runs_and_reads_headers_only(models, data, capsys):
    a, b = str(data / "a.jsonl"), str(data / "b.jsonl")
    # several files, read in order: line 1 of the first; the cut JPEG's line shows from its header
    first = _show(capsys, "--model", str(models["qwen2_vl"]), "--data", b, "--data", a)
    head = f"{b}:1: 78 tokens (3 trained, in [[ ]]), 1 image(s) (8 tokens), 0 video(s)"  # 56x40 pixels
    assert first.splitlines()[0] == head
    assert first.endswith("<|im_start|>assistant\na red circle<|im_end|>\n<|im_start|>user\nAnd its colour?"
                          "<|im_end|>\n<|im_start|>assistant\n[[red<|im_end|>\n]]\n")
    assert _show(capsys, "--model", str(models["tools"]), "--data", b, "--data", a, "--line", "3"
                 ).startswith(f"{a}:3: 272 tokens")  # only the second file has a line 3
    assert main(["data", "show", "--model", str(models["qwen2_vl"]), "--data", a, "--line", "9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"vlmcp data: error: --line 9: no conversation on line 9 of {a} (conversations are on "
                   "lines 1-3)"]
    assert main(["data", "show", "--model", str(models["qwen2_vl"]), "--data", a, "--line", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the chat template of this model drops the tool_call message 2" in err[0]


def test_a_long_view_is_cut_to_one_screen(models, data):
    conv = read_conversations(data / "a.jsonl").conversations[2]
    view = view_conversation(load_processor(models["tools"]), conv)
    text = view.plain(max_lines=4, more="; see it all with data show").splitlines()
    assert len(text) == 6 and text[1:5] == view.marked.splitlines()[:4]
    assert text[5] == f"... ({len(view.marked) - len(chr(10).join(text[1:5]))} more characters; see it all " \
                      "with data show)"


# ms-swift query/response/history, LLaMA-Factory v1 parts and transformers parts (the formats
# a.jsonl does not hold), each asserted exactly on the tiny Qwen2-VL
OTHER_FORMATS = [
    ({"query": "<image>And now?", "response": "a red circle", "history": [["What is red?", "a colour"]],
      "system": "Be brief.", "images": ["red.png"]},
     {"text": (QWEN_HEAD + "Be brief.<|im_end|>\n<|im_start|>user\nWhat is red?<|im_end|>\n<|im_start|>"
               "assistant\na colour<|im_end|>\n<|im_start|>user\n<|vision_start|><image><|vision_end|>"
               "And now?<|im_end|>\n<|im_start|>assistant\na red circle<|im_end|>\n"),
      "trained": ["a colour<|im_end|>\n", "a red circle<|im_end|>\n"], "tokens": 62, "images": 1,
      "videos": 0}),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "value": "red.png"},
                                                {"type": "text", "value": "What is it?"}]},
                   {"role": "assistant", "content": [{"type": "text", "value": "a red square"}]}]},
     {"text": (QWEN_HEAD + "You are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|vision_start|><image>"
               "<|vision_end|>What is it?<|im_end|>\n<|im_start|>assistant\na red square<|im_end|>\n"),
      "trained": ["a red square<|im_end|>\n"], "tokens": 39, "images": 1, "videos": 0}),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "Look: "},
                                                {"type": "image", "path": "red.png"}]},
                   {"role": "assistant", "content": "red"}]},
     {"text": (QWEN_HEAD + "You are a helpful assistant.<|im_end|>\n<|im_start|>user\nLook: <|vision_start|>"
               "<image><|vision_end|><|im_end|>\n<|im_start|>assistant\nred<|im_end|>\n"),
      "trained": ["red<|im_end|>\n"], "tokens": 34, "images": 1, "videos": 0}),
]


def test_json_of_query_response_and_structured_content_lines(models, data, capsys, tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line, _ in OTHER_FORMATS))
    for number, (_, want) in enumerate(OTHER_FORMATS, start=1):
        out = _show(capsys, "--model", str(models["qwen2_vl"]), "--data", str(path), "--line", str(number),
                    "--json", "--image-root", str(data))
        assert json.loads(out) == want
