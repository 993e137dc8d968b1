"""LLaMA-Factory's ``dataset_info.json``: ``--dataset NAME[,NAME] --dataset-dir DIR``.

An entry names a local file and how its lines are written::

    "mllm_demo": {"file_name": "mllm_demo.json", "formatting": "sharegpt",
                  "columns": {"messages": "messages", "images": "images"},
                  "tags": {"role_tag": "role", "content_tag": "content",
                           "user_tag": "user", "assistant_tag": "assistant"}}

Each line is rewritten into the ``messages`` format (:mod:`vlmcp.data.hf.formats.messages`)
by the entry's ``columns`` and ``tags`` (LLaMA-Factory's defaults where it leaves them out)
and then read and checked like a ``--data`` line, errors naming ``file:line``:

* ``formatting: sharegpt``: columns ``messages`` (default ``conversations``), ``system``,
  ``tools``, ``images``, ``videos``; tags ``role_tag`` (``from``), ``content_tag``
  (``value``), ``user_tag`` (``human``), ``assistant_tag`` (``gpt``), ``observation_tag``
  (``observation``), ``function_tag`` (``function_call``), ``system_tag`` (``system``).
  A turn whose role is none of the tags is an error naming it.
* ``formatting: alpaca`` (the default): columns ``prompt`` (``instruction``), ``query``
  (``input``), ``response`` (``output``), ``history``, ``system``, ``images``, ``videos``;
  the user turn is ``prompt + "\\n" + query`` (just ``prompt`` without a query), as in
  LLaMA-Factory, after the ``history`` pairs.

A key of a line that no column names is refused (the ``id``-like metadata keys excepted),
so nothing a line says is dropped. Relative image and video paths start at ``--dataset-dir``
(LLaMA-Factory's ``media_dir`` default), or at ``--image-root``. Refused by name: hub and
script sources (``hf_hub_url``, ``ms_hub_url``, ``om_hub_url``, ``script_url``,
``cloud_file_name``: vlmcp runs offline), ``ranking: true`` and the ``chosen``,
``rejected``, ``kto_tag`` columns (preference data), ``audios``, ``subset``, ``folder``,
``num_samples``, a ``split`` other than ``train``, a ``file_name`` that is a directory, and a
``file_name`` outside ``--dataset-dir`` (absolute, or up through ``..``; LLaMA-Factory allows
both, vlmcp does not: see :func:`_inside`). Every error about an entry's file names the entry
(``--dataset NAME``), not ``--data``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlmcp.data.hf.formats.base import METADATA_KEYS

__all__ = ["DataSource", "resolve_datasets"]

_ENTRY_KEYS = ("file_name", "formatting", "columns", "tags", "ranking", "split")
_NETWORK_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
_SHAREGPT_COLUMNS = {"messages": "conversations", "system": None, "tools": None, "images": None,
                     "videos": None}
_ALPACA_COLUMNS = {"prompt": "instruction", "query": "input", "response": "output", "history": None,
                   "system": None, "images": None, "videos": None}
_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
         "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}
_ROLE_OF_TAG = {"user_tag": "user", "assistant_tag": "assistant", "observation_tag": "tool_response",
                "function_tag": "tool_call", "system_tag": "system"}
_PREFERENCE = ("chosen", "rejected", "kto_tag")


@dataclass(frozen=True)
class DataSource:
    """One data file with the rewrite of its lines into a format vlmcp reads.

    Attributes:
        path: the file.
        convert: ``(record, where) -> record`` in the ``messages`` format, raising a
            ``ValueError`` that starts with ``where``; None: lines are read as they are.
        media_root: where relative image and video paths start (None: the file's directory).
        name: how messages name the source, e.g. ``dataset mllm_demo``.
    """

    path: Path
    convert: Callable[[Mapping[str, Any], str], dict] | None = None
    media_root: Path | None = None
    name: str = ""

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)


def _unmapped(record: Mapping[str, Any], used: set[str], where: str, columns: Mapping[str, str | None],
              dataset: str) -> None:
    for key in record:
        if key not in used and key not in METADATA_KEYS:
            named = ", ".join(f"{c}: {s}" for c, s in columns.items() if s)
            raise ValueError(f"{where}: key {key!r} is no column of dataset {dataset} (its columns: "
                             f"{named}); "
                             "add it to the entry's \"columns\" or remove it, so that nothing is dropped")


def _sharegpt(dataset: str, columns: Mapping[str, str | None], tags: Mapping[str, str]):
    roles = {tags[t]: role for t, role in _ROLE_OF_TAG.items()}

    def convert(record: Mapping[str, Any], where: str) -> dict:
        source = columns["messages"]
        if source not in record:
            raise ValueError(f"{where}: no {source!r} (the messages column of dataset {dataset})")
        turns = record[source]
        if not isinstance(turns, list):
            raise ValueError(f"{where}: {source!r} must be a list of messages, got {type(turns).__name__}")
        messages = []
        for i, turn in enumerate(turns):
            role_tag, content_tag = tags["role_tag"], tags["content_tag"]
            if not isinstance(turn, Mapping) or role_tag not in turn or content_tag not in turn:
                raise ValueError(f"{where}: message {i} needs {role_tag!r} and {content_tag!r} "
                                 f"(the tags of dataset {dataset})")
            tag = turn[tags["role_tag"]]
            if tag not in roles:
                raise ValueError(f"{where}: message {i} has role {tag!r}, none of dataset {dataset}'s tags "
                                 f"({', '.join(f'{t}: {v}' for t, v in tags.items() if t != 'role_tag')})")
            rest = {k: v for k, v in turn.items() if k not in (tags["role_tag"], tags["content_tag"])}
            messages.append({"role": roles[tag], "content": turn[tags["content_tag"]], **rest})
        return _with_columns(messages, record, {source}, ("system", "tools", "images", "videos"), where,
                             columns, dataset)

    return convert


def _with_columns(messages: list, record: Mapping[str, Any], used: set, optional: tuple[str, ...],
                  where: str, columns: Mapping[str, str | None], dataset: str) -> dict:
    """The converted line: ``messages``, the ``optional`` columns the record has, and its metadata.

    Every key of the record must be one of the used columns or metadata (:func:`_unmapped`).
    """
    out: dict[str, Any] = {"messages": messages}
    used = set(used)
    for column in optional:
        name = columns.get(column)
        if name and name in record:
            out[column] = record[name]
            used.add(name)
    _unmapped(record, used, where, columns, dataset)
    out.update({k: v for k, v in record.items() if k in METADATA_KEYS and k not in used})
    return out


def _alpaca(dataset: str, columns: Mapping[str, str | None]):
    def text(record, column, where, required):
        name = columns.get(column)
        value = record.get(name) if name else None
        if value is None or value == "":
            if required:
                raise ValueError(f"{where}: no {name!r} (the {column} column of dataset {dataset})")
            return None
        if not isinstance(value, str):
            raise ValueError(f"{where}: {name!r} must be a string, got {type(value).__name__}")
        return value

    def convert(record: Mapping[str, Any], where: str) -> dict:
        messages = []
        history_name = columns.get("history")
        history = record.get(history_name) if history_name else None
        for i, pair in enumerate(history or []):
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
                raise ValueError(f"{where}: {history_name!r}[{i}] must be a [prompt, response] pair of "
                                 f"strings")
            messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
        prompt = text(record, "prompt", where, True)
        query = text(record, "query", where, False)
        messages.append({"role": "user", "content": prompt if query is None else f"{prompt}\n{query}"})
        messages.append({"role": "assistant", "content": text(record, "response", where, True)})
        used = {columns[c] for c in ("prompt", "query", "response", "history") if columns.get(c)}
        return _with_columns(messages, record, used, ("system", "images", "videos"), where, columns, dataset)

    return convert


def _inside(file_name: Any, directory: Path, what: str) -> Path:
    """``directory / file_name``, refused when ``file_name`` leaves ``directory`` (absolute, or up
    through ``..``): a ``dataset_info.json`` from elsewhere (a download, a shared checkout) must not
    make a run read, and train on, any file the user can read. Checked on the name, so a link
    inside the directory may still point elsewhere (the directory's owner put it there)."""
    if not isinstance(file_name, str) or not file_name.strip():
        raise ValueError(f"{what}: \"file_name\" must name a file (a string), got {file_name!r}")
    normal = os.path.normpath(file_name)
    if os.path.isabs(normal) or normal == ".." or normal.startswith(".." + os.sep):
        raise ValueError(f"{what}: \"file_name\" {file_name!r} lies outside --dataset-dir {directory}; "
                         "vlmcp reads a dataset's file from inside the directory that holds "
                         "dataset_info.json (move the file there, or link it from there)")
    return directory / normal


def _source(name: str, entry: Any, info: Path, directory: Path) -> DataSource:
    what = f"--dataset {name} ({info})"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{what}: the entry must be an object, got {type(entry).__name__}")
    for key in entry:
        if key in _NETWORK_KEYS:
            raise ValueError(f"{what}: {key!r}: vlmcp runs offline and reads local files only; download the "
                             "data and name it with \"file_name\"")
        if key not in _ENTRY_KEYS:
            raise ValueError(f"{what}: key {key!r} is not one vlmcp reads (it reads "
                             f"{', '.join(_ENTRY_KEYS)})")
    if entry.get("ranking", False) is not False:
        raise ValueError(f"{what}: \"ranking\": preference data (DPO, reward models) is not supervised "
                         "fine-tuning; vlmcp train trains conversations")
    if entry.get("split", "train") != "train":
        raise ValueError(f"{what}: \"split\" {entry['split']!r}: vlmcp reads the whole local file (split "
                         f"train)")
    if "file_name" not in entry:
        raise ValueError(f"{what}: no \"file_name\"")
    path = _inside(entry["file_name"], directory, what)
    if path.is_dir():
        raise ValueError(f"{what}: {path} is a directory; vlmcp reads one .json or .jsonl file per dataset")
    if not path.is_file():
        raise ValueError(f"{what}: {path}: no such file")
    formatting = entry.get("formatting", "alpaca")
    if formatting not in ("sharegpt", "alpaca"):
        raise ValueError(f"{what}: \"formatting\" {formatting!r}: vlmcp reads sharegpt and alpaca")
    defaults = _SHAREGPT_COLUMNS if formatting == "sharegpt" else _ALPACA_COLUMNS
    columns = entry.get("columns", {}) or {}
    if not isinstance(columns, Mapping):
        raise ValueError(f"{what}: \"columns\" must be an object")
    for column, value in columns.items():
        if column in _PREFERENCE:
            raise ValueError(f"{what}: column {column!r}: preference data is not supervised fine-tuning")
        if column not in defaults:
            raise ValueError(f"{what}: column {column!r} is not one vlmcp reads for {formatting} (it reads "
                             f"{', '.join(defaults)})")
        if not isinstance(value, str):
            raise ValueError(f"{what}: column {column!r} must name a key (a string), got {value!r}")
    columns = {**defaults, **columns}
    tags = entry.get("tags", {}) or {}
    if tags and formatting != "sharegpt":
        raise ValueError(f"{what}: \"tags\" are for formatting sharegpt, not {formatting}")
    if not isinstance(tags, Mapping):
        raise ValueError(f"{what}: \"tags\" must be an object")
    for tag, value in tags.items():
        if tag not in _TAGS:
            raise ValueError(f"{what}: tag {tag!r} is not one vlmcp reads (it reads {', '.join(_TAGS)})")
        if not isinstance(value, str):
            raise ValueError(f"{what}: tag {tag!r} must be a string, got {value!r}")
    tags = {**_TAGS, **tags}
    convert = _sharegpt(name, columns, tags) if formatting == "sharegpt" else _alpaca(name, columns)
    return DataSource(path=path, convert=convert, media_root=directory, name=f"dataset {name}")


def resolve_datasets(names: str | Sequence[str], dataset_dir: str | os.PathLike | None) -> list[DataSource]:
    """The data files of ``--dataset NAME[,NAME]`` in ``DIR/dataset_info.json``, in order.

    Raises:
        ValueError: naming the dataset and the file: no ``dataset_info.json``, a name it does not
            have, or an entry vlmcp cannot honour (see the module docstring).
    """
    if isinstance(names, str):
        names = [names]
    names = [n.strip() for group in names for n in str(group).split(",") if n.strip()]
    if not names:
        return []
    directory = Path(dataset_dir if dataset_dir is not None else "data")
    info = directory / "dataset_info.json"
    if not info.is_file():
        raise ValueError(f"--dataset {','.join(names)}: no {info} (--dataset-dir names the directory that "
                         "holds "
                         "dataset_info.json; default ./data, as in LLaMA-Factory)")
    try:
        table = json.loads(info.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{info}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(table, dict):
        raise ValueError(f"{info}: must hold an object of datasets by name")
    sources = []
    for name in names:
        if name not in table:
            known = ", ".join(sorted(table)[:10]) + (", ..." if len(table) > 10 else "")
            raise ValueError(f"--dataset {name}: not in {info} (it has {known})")
        sources.append(_source(name, table[name], info, directory))
    return sources
