"""``--config FILE.yaml|.json`` (issue 24, item 7): vlmcp's own keys, generic over the parser."""

import argparse
import json

import pytest

from vlmcp.cli import _Parser
from vlmcp.cli import train as train_cmd
from vlmcp.cli.config_file import RESOLVED_NAME, add_config_arguments, resolved_config, write_resolved_config

pytest.importorskip("yaml")


def _train_parser():
    parser = _Parser(prog="vlmcp")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    train_cmd.add_parser(sub)
    return parser


def _write(path, text):
    path.write_text(text)
    return str(path)


def test_file_values_apply_and_command_line_flags_override_them(tmp_path):
    cfg = _write(tmp_path / "run.yaml", "seq_len: 512\nlr: 1e-4\nvision-mode: broadcast\nresume: true\n"
                                        "data: [a.jsonl, b.jsonl]\ncheckpoint_dir: null\n")
    args = _train_parser().parse_args(["train", "--config", cfg, "--lr", "0.5"])
    assert (args.seq_len, args.lr, args.vision_mode, args.resume) == (512, 0.5, "broadcast", True)
    assert args.data == ["a.jsonl", "b.jsonl"] and args.checkpoint_dir is None
    # a repeatable flag on the command line replaces the file's list, it does not extend it
    args = _train_parser().parse_args(["train", "--data", "c.jsonl", "--config", cfg])
    assert args.data == ["c.jsonl"] and args.lr == 1e-4
    # JSON too, and a flag the file does not set keeps its default
    cfg = _write(tmp_path / "run.json", json.dumps({"cp": 4, "dtype": "float64"}))
    args = _train_parser().parse_args(["train", "--config", cfg])
    assert (args.cp, args.dtype) == (4, "float64")
    assert args.seq_len is None  # the parser's default: each trainer resolves its own (1024 or 4096)


@pytest.mark.parametrize("text, message", [
    ("seq_len: 512\nepochz: 3\n", "unknown key 'epochz'"),
    ("_fault: [1, 2]\n", "unknown key '_fault'"),  # a hidden flag is no key
    ("config: other.yaml\n", "unknown key 'config'"),
    ("vision_mode: nope\n", "vision_mode: --vision-mode takes one of replicate"),
    ("seq_len: 1.5\n", "seq_len: --seq-len takes an integer, got 1.5"),
    ("resume: 1\n", "resume: --resume is a switch: true or false"),
    ("seq_len: 512\nseq-len: 256\n", "'seq-len' sets --seq-len a second time"),
    ("- a\n- b\n", "holds a mapping of flag names to values"),
    ("seq_len: [\n", "not valid YAML"),
])
def test_a_key_or_value_the_command_cannot_take_exits_2_naming_key_and_file(tmp_path, capsys, text, message):
    cfg = _write(tmp_path / "bad.yaml", text)
    with pytest.raises(SystemExit) as exit_:
        _train_parser().parse_args(["train", "--config", cfg])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and str(tmp_path / "bad.yaml") in err, err
    assert err.count("\n") == 1  # one line, not the usage


def test_other_suffixes_and_missing_files_are_refused(tmp_path, capsys):
    for path in (_write(tmp_path / "run.toml", "cp = 2"), str(tmp_path / "none.yaml")):
        with pytest.raises(SystemExit):
            _train_parser().parse_args(["train", "--config", path])
    err = capsys.readouterr().err
    assert "reads .yaml, .yml and .json files, not .toml" in err and "none.yaml: no such file" in err


def test_the_resolved_config_is_itself_a_config_file_of_the_same_run(tmp_path):
    cfg = _write(tmp_path / "run.yaml", "seq_len: 512\nlr: 1.0e-05\ndata: [a.jsonl]\nimage_max_pixels: "
                                        "4096\n")
    args = _train_parser().parse_args(["train", "--config", cfg, "--cp", "4"])
    out = write_resolved_config(args, tmp_path / "out")
    assert out == tmp_path / "out" / RESOLVED_NAME and f"--config {cfg}" in out.read_text()
    again = _train_parser().parse_args(["train", "--config", str(out)])
    assert resolved_config(again) == resolved_config(args)
    assert (again.cp, again.lr, again.data, again.image_max_pixels) == (4, 1e-05, ["a.jsonl"], 4096)


def test_the_loader_is_generic_over_any_parser(tmp_path):
    parser = argparse.ArgumentParser(prog="tool")
    parser.add_argument("--size", type=int, default=1)
    parser.add_argument("--name", default="x", choices=("x", "y"))
    parser.add_argument("--tag", action="append", default=None)
    parser.add_argument("--quiet", action="store_true")
    add_config_arguments(parser)
    cfg = _write(tmp_path / "t.yaml", "size: 3\nname: y\ntag: one\nquiet: true\n")
    args = parser.parse_args(["--config", cfg, "--size", "5"])
    assert (args.size, args.name, args.tag, args.quiet) == (5, "y", ["one"], True)
    assert resolved_config(args) == {"size": 5, "name": "y", "tag": ["one"], "quiet": True}
