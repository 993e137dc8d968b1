"""LLaMA-Factory's ``dataset_info.json`` via ``--dataset NAME --dataset-dir DIR`` (issue 24, item 8)."""

import json

import pytest

from vlmcp.data.hf.dataset_info import resolve_datasets
from vlmcp.data.hf.reader import read_conversations

PIL = pytest.importorskip("PIL.Image")


def _demo(root):
    """LLaMA-Factory's data/ layout: mllm_demo.json (OpenAI-style tags) and its mllm_demo_data/ images."""
    (root / "mllm_demo_data").mkdir(parents=True)
    PIL.new("RGB", (32, 24), "red").save(root / "mllm_demo_data" / "1.jpg")
    lines = [{"messages": [{"content": "<image>Who are they?", "role": "user"},
                           {"content": "They're Kane and Gretzka.", "role": "assistant"},
                           {"content": "What are they doing?", "role": "user"},
                           {"content": "Celebrating.", "role": "assistant"}],
              "images": ["mllm_demo_data/1.jpg"]},
             {"messages": [{"content": "Hi", "role": "user"}, {"content": "Hello.", "role": "assistant"}]}]
    (root / "mllm_demo.json").write_text(json.dumps(lines))
    sharegpt = [{"conversations": [{"from": "human", "value": "<image>Name it."},
                                   {"from": "gpt", "value": "A red box."}],
                 "system": "Be brief.", "pics": ["mllm_demo_data/1.jpg"], "id": "7"}]
    (root / "share.json").write_text(json.dumps(sharegpt))
    custom = [{"dialog": [{"speaker": "me", "text": "Hi"}, {"speaker": "bot", "text": "Yo.", "loss": True}]}]
    (root / "custom.jsonl").write_text("".join(json.dumps(r) + "\n" for r in custom))
    alpaca = [{"instruction": "Translate.", "input": "chat", "output": "cat", "history": [["Q1", "A1"]],
               "system": "You translate."},
              {"instruction": "Say hi.", "output": "hi"}]
    (root / "alpaca.json").write_text(json.dumps(alpaca))
    info = {
        "mllm_demo": {"file_name": "mllm_demo.json", "formatting": "sharegpt",
                      "columns": {"messages": "messages", "images": "images"},
                      "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                               "assistant_tag": "assistant"}},
        "share": {"file_name": "share.json", "formatting": "sharegpt",
                  "columns": {"messages": "conversations", "system": "system", "images": "pics"}},
        "custom": {"file_name": "custom.jsonl", "formatting": "sharegpt", "columns": {"messages": "dialog"},
                   "tags": {"role_tag": "speaker", "content_tag": "text", "user_tag": "me",
                            "assistant_tag": "bot"}},
        "alpaca_demo": {"file_name": "alpaca.json", "columns": {"history": "history", "system": "system"}},
    }
    (root / "dataset_info.json").write_text(json.dumps(info))
    return root


def _turns(conv):
    return [(m.role, m.content, m.loss) for m in conv.messages]


def test_each_formatting_columns_and_tags_become_the_conversations_they_say(tmp_path):
    root = _demo(tmp_path / "data")
    data = read_conversations(resolve_datasets("mllm_demo, share,custom,alpaca_demo", root))
    demo, hi, share, custom, alpaca, alpaca2 = data.conversations
    assert _turns(demo)[0] == ("user", "<image>Who are they?", None) and len(demo.messages) == 4
    assert [m.path for m in demo.images] == [root / "mllm_demo_data" / "1.jpg"]  # from the dataset dir
    assert demo.where == f"{root / 'mllm_demo.json'}:[1]" and not hi.images
    # the same lines read directly as --data give the same conversation
    assert read_conversations([root / "mllm_demo.json"]).conversations[0].messages == demo.messages
    assert _turns(share) == [("system", "Be brief.", None), ("user", "<image>Name it.", None),
                             ("assistant", "A red box.", None)] and len(share.images) == 1
    assert _turns(custom) == [("user", "Hi", None), ("assistant", "Yo.", True)]
    assert _turns(alpaca) == [("system", "You translate.", None), ("user", "Q1", None),
                              ("assistant", "A1", None), ("user", "Translate.\nchat", None),
                              ("assistant", "cat", None)]
    assert _turns(alpaca2) == [("user", "Say hi.", None), ("assistant", "hi", None)]
    # --max-samples: the first N lines of each dataset
    kept = read_conversations(resolve_datasets(["mllm_demo", "alpaca_demo"], root), max_samples=1)
    kept = kept.conversations
    assert [c.where for c in kept] == [f"{root / 'mllm_demo.json'}:[1]", f"{root / 'alpaca.json'}:[1]"]


@pytest.mark.parametrize("entry, message", [
    ({"hf_hub_url": "x/y", "file_name": "share.json"}, "'hf_hub_url': vlmcp runs offline"),
    ({"file_name": "share.json", "ranking": True}, "preference data"),
    ({"file_name": "share.json", "formatting": "sharegpt", "columns": {"chosen": "c"}}, "column 'chosen'"),
    ({"file_name": "share.json", "formatting": "sharegpt", "columns": {"audios": "a"}},
     "column 'audios' is not"),
    ({"file_name": "share.json", "subset": "a"}, "key 'subset' is not one vlmcp reads"),
    ({"file_name": "share.json", "split": "test"}, "\"split\" 'test'"),
    ({"file_name": "mllm_demo_data"}, "is a directory"),
    ({"file_name": "nope.json"}, "nope.json: no such file"),
    ({"file_name": "share.json", "formatting": "ranking"}, "vlmcp reads sharegpt and alpaca"),
    ({"file_name": "share.json", "tags": {"role_tag": "from"}}, "\"tags\" are for formatting sharegpt"),
    ({"file_name": "share.json", "formatting": "sharegpt", "tags": {"tool_tag": "t"}}, "tag 'tool_tag'"),
])
def test_an_entry_vlmcp_cannot_honour_is_refused_by_name(tmp_path, entry, message):
    root = _demo(tmp_path / "data")
    info = json.loads((root / "dataset_info.json").read_text())
    (root / "dataset_info.json").write_text(json.dumps({**info, "bad": entry}))
    with pytest.raises(ValueError, match="--dataset bad") as err:
        resolve_datasets("bad", root)
    assert message in str(err.value), err.value


def test_a_line_the_entry_does_not_describe_is_refused_naming_file_line_and_key(tmp_path):
    root = _demo(tmp_path / "data")
    lines = json.loads((root / "share.json").read_text())
    (root / "share.json").write_text(json.dumps(lines + [{**lines[0], "videos": ["v.mp4"]}]))
    with pytest.raises(ValueError, match=r"share.json:\[2\]: key 'videos' is no column of dataset share"):
        read_conversations(resolve_datasets("share", root))
    (root / "custom.jsonl").write_text(json.dumps({"dialog": [{"speaker": "you", "text": "Hi"}]}) + "\n")
    with pytest.raises(ValueError, match=r"custom.jsonl:1: message 0 has role 'you', none of dataset custom"):
        read_conversations(resolve_datasets("custom", root))
    with pytest.raises(ValueError, match="--dataset other: not in .*dataset_info.json"):
        resolve_datasets("other", root)
    with pytest.raises(ValueError, match="no .*elsewhere/dataset_info.json"):
        resolve_datasets("share", tmp_path / "elsewhere")


def test_file_name_stays_inside_dataset_dir_and_its_errors_name_the_entry(tmp_path):
    """LLaMA-Factory reads any path; vlmcp refuses one that leaves --dataset-dir (a dataset_info.json
    from elsewhere must not make a run train on any file the user can read). And an error about the
    entry's file names ``--dataset NAME``, not ``--data``."""
    root = _demo(tmp_path / "data")
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"messages": [{"role": "user", "content": "x"},
                                               {"role": "assistant", "content": "y"}]}) + "\n")
    (root / "sub").mkdir()
    (root / "sub" / "inner.json").write_text((root / "alpaca.json").read_text())
    (root / "linked.jsonl").symlink_to(secret)  # put there by the directory's owner: allowed
    info = json.loads((root / "dataset_info.json").read_text())
    outside = {"up": "../secret.jsonl", "abs": str(secret), "deep": "sub/../../secret.jsonl"}
    entries = {**{name: {"file_name": f} for name, f in outside.items()},
               "fine": {"file_name": "sub/./x/../inner.json"},
               "link": {"file_name": "linked.jsonl", "formatting": "sharegpt",
                        "columns": {"messages": "messages"},
                        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                 "assistant_tag": "assistant"}},
               "empty": {"file_name": ""}, "text": {"file_name": "notes.txt"},
               "hollow": {"file_name": "e.json"}}
    (root / "notes.txt").write_text("hi")
    (root / "e.json").write_text("")
    (root / "dataset_info.json").write_text(json.dumps({**info, **entries}))
    for name, file_name in outside.items():
        with pytest.raises(ValueError) as err:
            resolve_datasets(name, root)
        assert str(err.value) == (f"--dataset {name} ({root / 'dataset_info.json'}): \"file_name\" "
                                  f"{file_name!r} lies outside --dataset-dir {root}; vlmcp reads a "
                                  "dataset's file from inside the directory that holds dataset_info.json "
                                  "(move the file there, or link it from there)")
    assert [s.path for s in resolve_datasets("fine,link", root)] == [root / "sub" / "inner.json",
                                                                    root / "linked.jsonl"]
    with pytest.raises(ValueError, match=r"--dataset empty .*\"file_name\" must name a file"):
        resolve_datasets("empty", root)
    # the file's own errors name the entry and its file
    with pytest.raises(ValueError) as err:
        read_conversations(resolve_datasets("text", root))
    assert str(err.value) == (f"--dataset text ({root / 'notes.txt'}): vlmcp reads .jsonl and .json files, "
                              "not .txt")
    with pytest.raises(ValueError) as err:
        read_conversations(resolve_datasets("hollow", root))
    assert str(err.value) == f"--dataset hollow ({root / 'e.json'}): the file holds no conversation"


def test_dataset_info_given_as_data_says_how_to_name_its_datasets(tmp_path):
    root = _demo(tmp_path / "data")
    with pytest.raises(ValueError) as err:
        read_conversations(root / "dataset_info.json")
    info = root / "dataset_info.json"
    assert str(err.value) == (f"--data {info}: this is LLaMA-Factory's dataset_info.json (a table of "
                              "datasets), not conversations; train its datasets with --dataset NAME[,NAME] "
                              f"--dataset-dir {root}")
