"""A config file's key -> the flag it sets, and its value as that flag would hold it.

What both readers of ``--config`` share, the generic one (:mod:`vlmcp.cli.config_file`) and
LLaMA-Factory's (:mod:`vlmcp.cli.llamafactory`): the flags a file may set
(:func:`config_actions`), which flag a key names (:func:`key_to_dest`: a flag's dest,
``seq_len``, or its long name without the dashes, ``seq-len``), and a YAML/JSON value
converted and checked as argparse would parse the flag (:func:`convert_value`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

__all__ = ["config_actions", "convert_value", "key_to_dest"]


def config_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The flags a config file may set, by dest (hidden flags, ``--help`` and ``--config`` left out)."""
    return {a.dest: a for a in parser._actions
            if a.option_strings and a.help != argparse.SUPPRESS and a.dest not in ("help", "config")
            and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))}


def key_to_dest(key: str, actions: Mapping[str, argparse.Action]) -> str | None:
    """The dest of the flag a config file's ``key`` names (its dest, or its long name without the
    dashes), or None when it names none of ``actions``."""
    if key in actions:
        return key
    for dest, action in actions.items():
        if f"--{key}" in action.option_strings:
            return dest
    return None


def _type_name(action: argparse.Action) -> str:
    if action.type in (int, float):
        return action.type.__name__
    return "string" if action.type is None else getattr(action.type, "__name__", "value")


def convert_value(action: argparse.Action, value: Any, what: str) -> Any:
    """``value`` (from YAML or JSON) as the flag of ``action`` would hold it after parsing.

    Args:
        action: the flag.
        value: the file's value.
        what: how the message names the key, e.g. ``"seq_len (in run.yaml)"``.

    Raises:
        ValueError: a value of the wrong type, or outside the flag's choices.
    """
    flag = action.option_strings[-1]
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise ValueError(f"{what}: {flag} is a switch: true or false, got {value!r}")
        return value
    if isinstance(action, argparse._StoreConstAction) and not isinstance(action, argparse._AppendConstAction):
        if value not in (True, False):
            raise ValueError(f"{what}: {flag} takes true or false, got {value!r}")
        return action.const if value else action.default
    if value is None and action.default is None:  # null: the flag's own "not given"
        return None
    if action.nargs == "?" and value is True:  # the flag given alone (--lora-vision): its const
        return action.const
    repeated = isinstance(action, argparse._AppendAction) or action.nargs not in (None, "?")
    if repeated:
        items = value if isinstance(value, list) else [value]
        if isinstance(action, argparse._AppendAction) and action.nargs not in (None, "?"):
            raise ValueError(f"{what}: {flag} cannot be set from a config file; give it on the command line")
        return [_scalar(action, item, what) for item in items]
    if isinstance(action, argparse._StoreAction):
        return _scalar(action, value, what)
    raise ValueError(f"{what}: {flag} cannot be set from a config file; give it on the command line")


def _scalar(action: argparse.Action, value: Any, what: str) -> Any:
    flag = action.option_strings[-1]
    if isinstance(value, (dict, list)) or value is None or isinstance(value, bool):
        raise ValueError(f"{what}: {flag} takes one {_type_name(action)}, got {value!r}")
    if action.type is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if action.type is float and isinstance(value, int):
        value = float(value)
    if action.type in (int, float) and not isinstance(value, (int, float)):
        try:
            value = action.type(value)
        except (TypeError, ValueError):
            raise ValueError(f"{what}: {flag} takes a {_type_name(action)}, got {value!r}") from None
    elif action.type is int and not isinstance(value, int):
        raise ValueError(f"{what}: {flag} takes an integer, got {value!r}")
    elif action.type is None:
        if not isinstance(value, str):
            raise ValueError(f"{what}: {flag} takes a string, got {value!r}")
    elif action.type not in (int, float):
        try:
            value = action.type(value if isinstance(value, str) else str(value))
        except (TypeError, ValueError, argparse.ArgumentTypeError) as err:
            raise ValueError(f"{what}: {flag}: {err}") from None
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"{what}: {flag} takes one of {', '.join(map(str, action.choices))}, got {value!r}")
    return value
