"""``--data`` formats (issue 15): every format users ship read into the exact Conversation,
and everything vlmcp cannot honour refused with ``file:line``. No model needed."""

import base64
import json

import pytest
from PIL import Image

from vlmcp.data.hf.formats import (
    DataFormat,
    Detection,
    build_conversation,
    data_formats,
    register_format,
    registry,
)
from vlmcp.data.hf.reader import read_conversations
from vlmcp.data.hf.schema import Conversation, Media, Message, Skipped

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pics(tmp_path):
    for name, color in (("a.png", "red"), ("b.png", "blue")):
        Image.new("RGB", (4, 4), color).save(tmp_path / name)
    return tmp_path


def _jsonl(path, *records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _read(path, **kw):
    return read_conversations(path, **kw).conversations


def _one(path, record, **kw) -> Conversation:
    (conv,) = _read(_jsonl(path, record), **kw)
    return conv


def _image(directory, name):
    return Media("image", path=directory / name)


def _conv(path, line, messages, images=(), **kw):
    return Conversation(line=line, messages=tuple(Message(*m) for m in messages), images=tuple(images),
                        source=str(path), **kw)


def test_llamafactory_mllm_demo_json_list(pics):
    data = [
        {"messages": [{"content": "<image>Who are they?", "role": "user"},
                      {"content": "Kane and Gretzka.", "role": "assistant"},
                      {"content": "What are they doing?<image>", "role": "user"},
                      {"content": "Celebrating.", "role": "assistant"}],
         "images": ["a.png", "a.png"]},
        {"messages": [{"content": "<image>Who is he?", "role": "user"},
                      {"content": "Thomas Muller.", "role": "assistant"}],
         "images": ["b.png"]},
    ]
    path = pics / "mllm_demo.json"
    path.write_text(json.dumps(data, indent=2))
    first, second = _read(path)
    assert first == _conv(path, 1, [("user", "<image>Who are they?"), ("assistant", "Kane and Gretzka."),
                                    ("user", "What are they doing?<image>"), ("assistant", "Celebrating.")],
                          [_image(pics, "a.png")] * 2)
    assert second == _conv(path, 2, [("user", "<image>Who is he?"), ("assistant", "Thomas Muller.")],
                           [_image(pics, "b.png")])
    assert second.where == f"{path}:[2]"
    bad = [data[0], {**data[1], "images": []}]
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"mllm_demo.json:\[2\]: 1 <image> placeholder\(s\) but 0 image"):
        _read(path)
    path.write_text(json.dumps(data[1]))  # one object is one conversation
    assert _read(path)[0].messages == second.messages


def test_sharegpt_with_system_tools_function_call_observation(pics):
    tools = [{"name": "weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    call = '{"name": "weather", "arguments": {"city": "Paris"}}'
    record = {"conversations": [{"from": "human", "value": "<image>Weather where this is?"},
                                {"from": "function_call", "value": call},
                                {"from": "observation", "value": "18C, sunny"},
                                {"from": "gpt", "value": "18C and sunny."}],
              "system": "You check the weather.", "tools": json.dumps(tools), "images": ["a.png"]}
    path = pics / "glaive.jsonl"
    assert _one(path, record) == _conv(
        path, 1, [("system", "You check the weather."), ("user", "<image>Weather where this is?"),
                  ("tool_call", call), ("tool_response", "18C, sunny"), ("assistant", "18C and sunny.")],
        [_image(pics, "a.png")], tools=json.dumps(tools))
    # a leading system message is read the same; a top-level system beside it is ambiguous
    lead = {"conversations": [{"from": "system", "value": "Be brief."}, *record["conversations"][:1],
                              {"from": "gpt", "value": "Paris."}], "images": ["a.png"]}
    assert _one(path, lead).messages[0] == Message("system", "Be brief.")
    with pytest.raises(ValueError, match=r"glaive.jsonl:1: the line has a top-level \"system\" and a lead"):
        _one(path, {**lead, "system": "Other."})
    # LLaMA-Factory's empty system column is no system (the template's default)
    no_system = {**lead, "conversations": lead["conversations"][1:], "system": ""}
    assert _one(path, no_system).messages[0].role == "user"


def test_ms_swift_lines_with_system_loss_tools_and_image_objects(pics):
    png = base64.b64encode((pics / "b.png").read_bytes()).decode()
    record = {"system": "You are a helpful assistant.",
              "tools": [{"type": "function", "function": {"name": "click", "parameters": {}}}],
              "messages": [{"role": "user", "content": "<image>What time is it?"},
                           {"role": "assistant", "content": "Let me look.", "loss": False},
                           {"role": "tool_call", "content": {"name": "click", "arguments": {"x": 1, "y": 2}}},
                           {"role": "tool", "content": "{\"images\": \"<image>\", \"status\": \"ok\"}"},
                           {"role": "assistant", "content": "Eleven.", "loss": True},
                           {"role": "user", "content": "Thanks"},
                           {"role": "assistant", "content": "You're welcome.", "loss": None}],
              "images": [{"path": "a.png"}, {"bytes": png}]}
    path = pics / "agent.jsonl"
    conv = _one(path, record)
    assert conv == _conv(
        path, 1, [("system", "You are a helpful assistant."), ("user", "<image>What time is it?"),
                  ("assistant", "Let me look.", False),
                  ("tool_call", '{"name": "click", "arguments": {"x": 1, "y": 2}}'),
                  ("tool_response", "{\"images\": \"<image>\", \"status\": \"ok\"}"),
                  ("assistant", "Eleven.", True),
                  ("user", "Thanks"), ("assistant", "You're welcome.")],
        [_image(pics, "a.png"), Media("image", data=(pics / "b.png").read_bytes())],
        tools=json.dumps(record["tools"]))
    assert [m.trained for m in conv.messages] == [False, False, False, True, False, True, False, True]
    assert conv.images[1].open_image().size == (4, 4)
    # parallel calls (a list) and a Hugging Face datasets Image column ({"bytes", "path"}, bytes win)
    parallel = {"messages": [{"role": "user", "content": "<image>Both?"},
                             {"role": "tool_call", "content": '[{"name": "a"}, {"name": "b"}]'},
                             {"role": "tool_response", "content": {"a": 1}},
                             {"role": "assistant", "content": "Done."}],
                "images": [{"bytes": png, "path": "gone.png"}]}
    conv = _one(path, parallel)
    assert conv.messages[2] == Message("tool_response", '{"a": 1}')
    assert conv.images == (Media("image", data=(pics / "b.png").read_bytes()),)


def test_query_response_with_history(pics):
    record = {"system": "Be brief.", "query": "<image>And this one?", "response": "A blue square.",
              "history": [["<image>What is this?", "A red square."]], "images": ["a.png", "b.png"]}
    path = pics / "qr.jsonl"
    assert _one(path, record) == _conv(
        path, 1, [("system", "Be brief."), ("user", "<image>What is this?"), ("assistant", "A red square."),
                  ("user", "<image>And this one?"), ("assistant", "A blue square.")],
        [_image(pics, "a.png"), _image(pics, "b.png")])
    assert _one(path, {"query": "hi", "response": "hello", "history": None}).messages == (
        Message("user", "hi"), Message("assistant", "hello"))
    with pytest.raises(ValueError, match=r"qr.jsonl:1: \"history\"\[0\] must be a \[query, response\] pair"):
        _one(path, {"query": "q", "response": "r", "history": [["only"]]})
    with pytest.raises(ValueError, match=r"qr.jsonl:1: a query/response line needs \"response\""):
        _one(path, {"query": "q"})


def test_llamafactory_v1_structured_content(pics):
    record = {"messages": [
        {"role": "system", "content": [{"type": "text", "value": "You see."}], "loss_weight": 0.0},
        {"role": "user", "content": [{"type": "image_url", "value": "a.png"},
                                     {"type": "text", "value": "What is it?"}], "loss_weight": 0.0},
        {"role": "assistant", "content": [{"type": "text", "value": "A red square."}], "loss_weight": 1.0},
        {"role": "user", "content": [{"type": "text", "value": "And "},
                                     {"type": "image_url", "value": "b.png"},
                                     {"type": "text", "value": "?"}], "loss_weight": 0},
        {"role": "assistant", "content": [{"type": "text", "value": "Blue."}], "loss_weight": 1}]}
    path = pics / "v1.jsonl"
    assert _one(path, record) == _conv(
        path, 1, [("system", "You see.", False), ("user", "<image>What is it?", False),
                  ("assistant", "A red square.", True), ("user", "And <image>?", False),
                  ("assistant", "Blue.", True)],
        [_image(pics, "a.png"), _image(pics, "b.png")])


def test_transformers_and_openai_parts(pics):
    png = base64.b64encode((pics / "a.png").read_bytes()).decode()
    record = {"messages": [
        {"role": "user", "content": [{"type": "image", "path": "a.png"}, {"type": "image", "url": "b.png"},
                                     {"type": "image", "image": str(pics / "a.png")},
                                     {"type": "image_url", "image_url": {"url": f"file://{pics / 'b.png'}"}},
                                     {"type": "image_url", "image_url": f"data:image/png;base64,{png}"},
                                     {"type": "image", "base64": png},
                                     {"type": "text", "text": "Which differ?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "The colours."}]}]}
    path = pics / "parts.jsonl"
    data = (pics / "a.png").read_bytes()
    assert _one(path, record) == _conv(
        path, 1, [("user", "<image>" * 6 + "Which differ?"), ("assistant", "The colours.")],
        [_image(pics, "a.png"), _image(pics, "b.png"), _image(pics, "a.png"), _image(pics, "b.png"),
         Media("image", data=data), Media("image", data=data)])


def test_llava_lines(pics):
    lines = [
        {"id": "1", "image": "a.png", "conversations": [
            {"from": "gpt", "value": "Hi there."},
            {"from": "human", "value": "What is it?\n<image>"}, {"from": "gpt", "value": "A red square."}]},
        {"id": "2", "image": "a.png", "conversations": [
            {"from": "human", "value": "<image>\n\nWhat colour? "}, {"from": "gpt", "value": "Red."},
            {"from": "human", "value": "  Sure?  "}, {"from": "gpt", "value": "Yes."}]},
        {"id": "3", "image": ["a.png", "b.png"], "conversations": [
            {"from": "human", "value": "<image>\n<image>\nCompare."},
            {"from": "gpt", "value": "Red, blue."}]},
        {"id": "4", "image": "a.png", "conversations": [
            {"from": "gpt", "value": "Hello."}, {"from": "human", "value": "<image>\nBye."}]},
        {"id": "5", "model": "", "conversations": [
            {"from": "human", "value": "Hello"}, {"from": "gpt", "value": "Hi!"}]},
    ]
    path = pics / "llava.json"
    path.write_text(json.dumps(lines))
    got = read_conversations(path)
    assert got.conversations == [
        _conv(path, 1, [("user", "<image>\nWhat is it?"), ("assistant", "A red square.")],
              [_image(pics, "a.png")], dropped_turns=1),
        _conv(path, 2, [("user", "<image>\nWhat colour?"), ("assistant", "Red."), ("user", "  Sure?  "),
                        ("assistant", "Yes.")], [_image(pics, "a.png")]),
        _conv(path, 3, [("user", "<image>\n<image>\nCompare."), ("assistant", "Red, blue.")],
              [_image(pics, "a.png"), _image(pics, "b.png")]),
        _conv(path, 5, [("user", "Hello"), ("assistant", "Hi!")]),
    ]
    assert got.skipped == [Skipped(f"{path}:[4]", "nothing left to train after dropping a leading gpt turn")]
    assert got.dropped_turns == 1


def test_llava_or_sharegpt_is_decided_by_the_file_or_refused(pics):
    ambiguous = {"conversations": [{"from": "gpt", "value": "Hello."}, {"from": "human", "value": "Hi"},
                                   {"from": "gpt", "value": "How can I help?"}]}
    llava = {"image": "a.png", "conversations": [{"from": "human", "value": "<image>What?"},
                                                 {"from": "gpt", "value": "Red."}]}
    sharegpt = {"images": ["a.png"], "conversations": llava["conversations"]}
    # in a LLaVA file it is LLaVA's: the leading gpt turn dropped
    conv = _read(_jsonl(pics / "l.jsonl", llava, ambiguous))[1]
    assert conv.messages == (Message("user", "Hi"), Message("assistant", "How can I help?"))
    assert conv.dropped_turns == 1
    # in a sharegpt file it is sharegpt's, which refuses a conversation opening with the assistant
    with pytest.raises(ValueError, match=r"s.jsonl:2: the conversation opens with an assistant message"):
        _read(_jsonl(pics / "s.jsonl", sharegpt, ambiguous))
    # alone, nothing tells: an error, not a guess
    with pytest.raises(ValueError, match=r"a.jsonl:1: the line reads differently as messages: refused .* "
                                         r"and as llava: 2 message\(s\), 1 turn\(s\) dropped"):
        _read(_jsonl(pics / "a.jsonl", ambiguous))
    # where the readings agree, there is nothing to decide
    plain = {"conversations": ambiguous["conversations"][1:]}
    assert _read(_jsonl(pics / "p.jsonl", plain))[0].messages == conv.messages
    with pytest.raises(ValueError, match=r"b.jsonl:1: the line fits several formats: "
                                         r"messages \(has \"images\"\), llava \(has \"image\"\)"):
        _read(_jsonl(pics / "b.jsonl", {**llava, "images": ["a.png"]}))


def test_images_must_be_local_files(pics):
    path = pics / "u.jsonl"

    def line(images, content="<image>Hi"):
        return {"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "a"}],
                "images": images}

    for url in ("http://x.org/a.png", "https://x.org/a.png", "s3://bucket/a.png", "gs://b/a.png"):
        with pytest.raises(ValueError, match=rf"u.jsonl:1: images must be local files \(URL given: {url}\)"):
            _one(path, line([url]))
    with pytest.raises(ValueError, match=r"u.jsonl:1: images must be local files \(URL given: https://x.org/p.png"):
        _one(path, {"messages": [{"role": "user", "content": [{"type": "image_url", "value": "https://x.org/p.png"}]},
                                 {"role": "assistant", "content": "a"}]})
    with pytest.raises(ValueError, match=r"u.jsonl:1: image file .*nowhere.png does not exist"):
        _one(path, line(["nowhere.png"]))
    with pytest.raises(ValueError, match=r"u.jsonl:1: an image's \"bytes\" is not valid base64"):
        _one(path, line([{"bytes": "not base64!"}]))
    with pytest.raises(ValueError, match=r"u.jsonl:1: an image given as an object .* key\(s\) \['url'\]"):
        _one(path, line([{"url": "a.png"}]))
    (pics / "imgs").mkdir()
    (pics / "imgs" / "c.png").write_bytes((pics / "a.png").read_bytes())
    assert _one(path, line("c.png"), image_root=pics / "imgs").images == (_image(pics / "imgs", "c.png"),)
    assert _one(path, line([f"file://{pics / 'a.png'}"])).images == (Media("image", path=pics / "a.png"),)


@pytest.mark.parametrize("record", [
    {"messages": [{"role": "user", "content": "<video>Hi"}, {"role": "assistant", "content": "a"}],
     "videos": ["v.mp4"]},
    {"messages": [{"role": "user", "content": [{"type": "video", "path": "v.mp4"}]},
                  {"role": "assistant", "content": "a"}]},
    {"video": "v.mp4", "conversations": [{"from": "human", "value": "<video>"},
                                         {"from": "gpt", "value": "a"}]},
    {"query": "<video>Q", "response": "a", "videos": ["v.mp4"]},
])
def test_videos_are_read_in_every_format(tmp_path, record):
    (tmp_path / "v.mp4").write_bytes(b"decoded at planning, not when read")  # test_video_data.py decodes
    conv = _one(tmp_path / "v.jsonl", record)
    assert conv.videos == (Media("video", path=tmp_path / "v.mp4"),)
    assert sum(m.content.count("<video>") for m in conv.messages) == 1


def test_a_video_placeholder_without_its_video_is_refused(tmp_path):
    record = {"messages": [{"role": "user", "content": "<video>Hi"}, {"role": "assistant", "content": "a"}]}
    with pytest.raises(ValueError, match=r"v.jsonl:1: 1 <video> placeholder\(s\) but 0 video\(s\); each "
                                         r"video needs one <video> where it goes"):
        _one(tmp_path / "v.jsonl", record)


def test_empty_video_and_image_columns_are_none(pics):
    record = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "a"}],
              "images": None, "videos": [], "tools": ""}
    conv = _one(pics / "e.jsonl", record)
    assert conv.images == conv.videos == () and conv.tools is None


def test_several_files_bom_and_crlf(pics):
    first = {"messages": [{"role": "user", "content": "<image>One"}, {"role": "assistant", "content": "1"}],
             "images": ["a.png"]}
    second = {"query": "Two", "response": "2"}
    crlf = pics / "crlf.jsonl"
    crlf.write_bytes(b"\xef\xbb\xbf" + json.dumps(first).encode() + b"\r\n\r\n"
                     + json.dumps(second).encode() + b"\r\n")
    listed = pics / "more.json"
    listed.write_bytes(b"\xef\xbb\xbf" + json.dumps([second, first], indent=1).replace("\n", "\r\n").encode())
    got = _read([crlf, str(listed)])
    assert [(c.source, c.line) for c in got] == [(str(crlf), 1), (str(crlf), 3),
                                                 (str(listed), 1), (str(listed), 2)]
    assert [c.messages[-1].content for c in got] == ["1", "2", "2", "1"]
    assert got[0].images == got[3].images == (_image(pics, "a.png"),)


def _u(content, **keys):
    return {"role": "user", "content": content, **keys}


def _a(content, role="assistant", **keys):
    return {"role": role, "content": content, **keys}


def _msgs(*turns, **line):
    return {"messages": list(turns), **line}


@pytest.mark.parametrize("record, match", [
    (_msgs(_u("Hi"), _a("a"), audios=["x.wav"]),
     r"the line has key 'audios', which vlmcp does not read \(it reads: messages, conversations, system"),
    (_msgs(_u("Hi"), _a("a"), rejected_response="b"), r"the line has key 'rejected_response'"),
    (_msgs(_u("Hi", name="bob"), _a("a")), r"message 0 has key 'name'"),
    (_msgs(_u("Hi"), _a(None, tool_calls=[])), r"message 1 has key 'tool_calls'"),
    (_msgs(_u("x", role="robot")),
     r"message 0 has role 'robot'; vlmcp reads the roles user, human, assistant, gpt, system, tool_call"),
    ({"conversations": [{"from": "human", "value": "Hi"}, {"from": "function", "value": "{}"}],
      "system": "s"}, r"message 1 has role 'function'"),
    ({"image": "a.png", "conversations": [{"from": "human", "value": "<image>"},
                                          {"from": "assistant", "value": "a"}]},
     r"the line fits several formats: messages \(a turn is from 'assistant'\), llava \(has \"image\"\)"),
    ({"image": "a.png", "conversations": [{"from": "human", "value": "<image>", "weight": 0},
                                          {"from": "gpt", "value": "a"}]}, r"turn 0 has key 'weight'"),
    ({"query": "q", "response": "r", "prompt": "p"}, r"the line has key 'prompt'"),
    ({"instruction": "q", "output": "r"},
     r"no --data format has the keys \['instruction', 'output'\]; vlmcp reads messages: .*; "
     r"query_response: .*; llava: "),
    (_msgs(_u([{"type": "text", "value": "<image>hi"}]), _a("a")),
     r"message 0, part 0: a text part holds a literal <image>"),
    (_msgs(_u([{"type": "image_url", "value": "a.png"}]), _a("a"), images=["a.png"]),
     r"the line gives images twice"),
    (_msgs(_u([{"type": "audio", "path": "x.wav"}]), _a("a")),
     r"message 0, part 0 has type 'audio'; vlmcp reads parts of type text"),
    (_msgs(_u([{"type": "text", "text": "a", "value": "b"}]), _a("a")),
     r"message 0, part 0 \(text\) needs exactly one of the keys text, value"),
    (_msgs(_u([{"type": "image_url", "image_url": {"url": "a.png", "detail": "low"}}]), _a("a")),
     r"message 0, part 0: \"image_url\" must be \{\"url\": ...\}"),
    (_msgs(_u("Hi"), _a("a", loss_weight=0.5)), r"message 1's \"loss_weight\" is 0.5: vlmcp trains a"),
    (_msgs(_u("Hi"), _a("a", loss="yes")), r"message 1's \"loss\" must be true, false or null"),
    (_msgs(_u("Hi"), _a("a", loss=True, loss_weight=1)), r"message 1 has both \"loss\" and \"loss_weight\""),
    (_msgs(_u("Hi"), _a('{"arguments": {}}', role="tool_call")),
     r"message 1 is a tool call: a JSON object with a \"name\""),
    (_msgs(_u("Hi"), _a("weather(Paris)", role="tool_call")), r"message 1 is a tool call but not JSON"),
    (_msgs(_u("Hi"), _a("a"), tools='[{"x": 1}]'), r"\"tools\"\[0\] must be a tool schema with a \"name\""),
    (_msgs(_u("Hi"), _a("a"), tools="{not json"), r"\"tools\" is not valid JSON"),
    (_msgs(_a("I love music"), _u("Me too")), r"the conversation opens with an assistant message"),
    (_msgs(_u("Hi"), _a("a", loss=False)), r"no message carries loss"),
    (_msgs(_u("Hi"), _a("a"), conversations=[]), r"the line has both \"messages\" and \"conversations\""),
    (_msgs(_u("Hi"), _a("a"), system=["s"]), r"\"system\" must be a string, got list"),
])
def test_what_vlmcp_cannot_honour_is_refused(pics, record, match):
    path = pics / "r.jsonl"
    with pytest.raises(ValueError, match=r"^" + str(path).replace("\\", "\\\\") + r":1: " + match):
        _one(path, record)


def test_containers_are_named(tmp_path):
    good = {"query": "q", "response": "r"}
    with pytest.raises(ValueError, match=r"--data .*missing.jsonl: no such file"):
        read_conversations(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match=r"e.jsonl: the file holds no conversation"):
        read_conversations(_jsonl(tmp_path / "e.jsonl", "", "  "))
    (tmp_path / "e.json").write_text("[]")
    with pytest.raises(ValueError, match=r"e.json: the file holds no conversation"):
        read_conversations(tmp_path / "e.json")
    (tmp_path / "bad.json").write_text('[\n  {"query": "q",\n   "response": }\n]')
    with pytest.raises(ValueError, match=r"bad.json:3: not valid JSON \(Expecting value at column 16\)"):
        read_conversations(tmp_path / "bad.json")
    (tmp_path / "lines.json").write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(ValueError, match=r"lines.json: holds one JSON object per line \(JSON Lines\)"):
        read_conversations(tmp_path / "lines.json")
    (tmp_path / "items.json").write_text(json.dumps([good, "text"]))
    with pytest.raises(ValueError, match=r"items.json:\[2\]: expected a JSON object, got str"):
        read_conversations(tmp_path / "items.json")
    with pytest.raises(ValueError, match=r"d.jsonl:2: not valid JSON"):
        read_conversations(_jsonl(tmp_path / "d.jsonl", good, "{not json"))
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    with pytest.raises(ValueError, match=r"d.parquet: vlmcp reads .jsonl and .json files, not .parquet"):
        read_conversations(tmp_path / "d.parquet")
    with pytest.raises(ValueError, match=r"--data: no file given"):
        read_conversations([])
    with pytest.raises(ValueError, match=r"--image-root .*nowhere: no such directory"):
        read_conversations(_jsonl(tmp_path / "d.jsonl", good), image_root=tmp_path / "nowhere")
    skipped = {"conversations": [{"from": "human", "value": "<image>"}], "image": "x.png"}
    (tmp_path / "x.png").write_bytes(b"")
    with pytest.raises(ValueError, match=r"nothing to train, every line was skipped "
                                         r"\(1; the first, .*s.jsonl:1: no gpt turn"):
        read_conversations(_jsonl(tmp_path / "s.jsonl", skipped))


def test_a_format_is_a_registered_file(tmp_path, monkeypatch):
    assert [f.name for f in data_formats()] == ["messages", "query_response", "llava"]

    class Alpaca(DataFormat):
        name, signature = "alpaca", '"instruction" and "output"'

        def detect(self, record):
            return Detection(True, 'has "instruction"') if "instruction" in record else None

        def read(self, record, line):
            return build_conversation(line, [Message("user", record["instruction"]),
                                             Message("assistant", record["output"])])

    monkeypatch.setattr(registry, "_FORMATS", dict(registry._FORMATS))
    register_format(Alpaca())
    conv = _one(tmp_path / "a.jsonl", {"instruction": "q", "output": "r"})
    assert conv.messages == (Message("user", "q"), Message("assistant", "r"))
