"""``--config FILE.yaml|.json``: a command's flags in a file; the flags given on the command line win.

Generic over the argparse parser it is added to (:func:`add_config_arguments`): a key is a
flag's dest (``seq_len``) or its long name without the dashes (``seq-len``); its value is
what the flag takes, as YAML/JSON (``lr: 1.0e-4``, ``resume: true``, ``data: [a.jsonl,
b.jsonl]`` for a repeatable flag). A key that is no flag of the command (or a hidden one) is
an error naming the key and the file (exit 2), so is a value of the wrong type or outside
the flag's choices. A file that has LLaMA-Factory's training keys (``model_name_or_path``,
``stage``, ``finetuning_type``, ...) is read by :mod:`vlmcp.cli.llamafactory` instead.

How it parses: the command line is parsed once to find ``--config``; the file's values then
become the namespace the command line is parsed into a second time, so a flag given on the
command line overrides the file's value (a repeatable flag given on the command line replaces
the file's list rather than extending it). :func:`resolved_config` is what the run used, every
flag's value, which :func:`write_resolved_config` writes beside the run's output (a
``--config`` file itself).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from pathlib import Path
from typing import Any

from vlmcp.cli import llamafactory
from vlmcp.cli.config_flags import config_actions, convert_value, key_to_dest

__all__ = ["RESOLVED_NAME", "add_config_arguments", "load_config", "resolved_config", "set_config_help",
           "write_resolved_config"]

RESOLVED_NAME = "vlmcp_config.yaml"
"""The file :func:`write_resolved_config` writes in the output directory."""

_RESOLVED_ATTR = "_resolved_config"


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config FILE`` to ``parser``: call it after every other flag is added.

    ``parser.parse_known_args`` (which ``parse_args`` and a subcommand's parent parser call)
    then reads the file as the module docstring says.
    """
    parser.add_argument("--config", default=None, metavar="FILE.yaml",
                        help="read flags from a YAML or JSON file (keys: the flags' names, e.g. seq_len: "
                             "4096; or a LLaMA-Factory training YAML); flags given here override it; the "
                             f"resolved configuration is written to the output directory as {RESOLVED_NAME}")
    parser.parse_known_args = functools.partial(_parse_known_args, parser, parser.parse_known_args)


def set_config_help(parser: argparse.ArgumentParser, help: str) -> None:
    """Replace ``--config``'s help on a command that writes no output directory (``plan``, ``bench``)."""
    parser._option_string_actions["--config"].help = help


def _read(path: Path) -> dict:
    if not path.is_file():
        raise ValueError(f"--config {path}: no such file")
    text = path.read_text(encoding="utf-8-sig")
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"--config {path}:{err.lineno}: not valid JSON ({err.msg})") from None
    elif suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ModuleNotFoundError:
            raise ValueError(f"--config {path}: a YAML file needs PyYAML: pip install pyyaml (or write the "
                             "file as .json)") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f":{mark.line + 1}" if mark is not None else ""
            problem = getattr(err, "problem", err)
            raise ValueError(f"--config {path}{where}: not valid YAML ({problem})") from None
    else:
        raise ValueError(f"--config {path}: vlmcp reads .yaml, .yml and .json files, not "
                         f"{suffix or 'a file without a suffix'}")
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ValueError(f"--config {path}: the file holds a mapping of flag names to values, got "
                         f"{type(data).__name__}")
    return data


def load_config(parser: argparse.ArgumentParser, path: str | os.PathLike,
                given: argparse.Namespace | None = None) -> dict[str, Any]:
    """The flag values (by dest) a config file sets, checked against ``parser``'s flags.

    Args:
        parser: the command's parser.
        path: the ``.yaml``/``.yml``/``.json`` file.
        given: the command line parsed without the file (a LLaMA-Factory file's checks that
            depend on other flags, such as ``template`` against ``--model``, read it).

    Raises:
        ValueError: naming the file and the key: an unknown key, a bad value, a LLaMA-Factory
            key vlmcp cannot honour.
    """
    path = Path(path)
    raw = _read(path)
    actions = config_actions(parser)
    if llamafactory.is_llamafactory(raw, actions):
        return llamafactory.translate(raw, path, actions, given)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        dest = key_to_dest(key, actions)
        if dest is None:
            raise ValueError(f"--config {path}: unknown key {key!r}: not a flag of this command (keys are "
                             "the "
                             "flags' names, e.g. seq_len or seq-len; see --help)")
        if dest in values:
            raise ValueError(f"--config {path}: {key!r} sets {actions[dest].option_strings[-1]} a second "
                             f"time")
        values[dest] = convert_value(actions[dest], value, f"--config {path}: {key}")
    return values


def _parse_known_args(parser, parse, args=None, namespace=None):
    """``parser.parse_known_args`` with ``--config`` (see the module docstring)."""
    first, extras = parse(args, None if namespace is None else argparse.Namespace(**vars(namespace)))
    path = getattr(first, "config", None)
    actions = config_actions(parser)
    if path is None:
        setattr(first, _RESOLVED_ATTR, {d: getattr(first, d) for d in actions if hasattr(first, d)})
        return first, extras
    try:
        values = load_config(parser, path, first)
    except ValueError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    appended = {d for d, a in actions.items() if isinstance(a, argparse._AppendAction)}
    seed = dict(vars(namespace)) if namespace is not None else {}
    seed.update({d: v for d, v in values.items() if d not in appended})
    second, extras = parse(args, argparse.Namespace(**seed))
    for dest in appended & set(values):
        if getattr(second, dest, None) == actions[dest].default:  # not on the command line
            setattr(second, dest, values[dest])
    setattr(second, _RESOLVED_ATTR, {d: getattr(second, d) for d in actions if hasattr(second, d)})
    return second, extras


def resolved_config(args: argparse.Namespace) -> dict[str, Any]:
    """Every flag's value the run uses (the file's and the command line's), by dest; ``{}`` for a
    namespace not parsed by a parser with :func:`add_config_arguments`."""
    return dict(getattr(args, _RESOLVED_ATTR, {}))


def write_resolved_config(args: argparse.Namespace, directory: str | os.PathLike) -> Path | None:
    """Write :func:`resolved_config` to ``directory/vlmcp_config.yaml`` (JSON-compatible YAML).

    The file is itself a ``--config`` file: ``vlmcp train --config OUT/vlmcp_config.yaml``
    runs the same configuration. Returns the path, or None when there is nothing to write.
    """
    values = resolved_config(args)
    if not values:
        return None
    source = getattr(args, "config", None)
    lines = ["# vlmcp train: the resolved configuration of this run"
             + (f" (--config {source} and the command line's flags)" if source else " (its flags)"),
             f"# rerun it: vlmcp train --config {Path(directory) / RESOLVED_NAME}"]
    lines += [f"{dest}: {json.dumps(value)}" for dest, value in values.items()]
    out = Path(directory) / RESOLVED_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out
