"""Reading a ``torch.distributed.checkpoint`` (DCP) directory without running code from it.

Note [vlmcp DCP checkpoints are unpickled through an allow-list]
----------------------------------------------------------------
torch's ``FileSystemReader`` reads a DCP checkpoint's ``.metadata`` with plain ``pickle``,
and its ``DefaultLoadPlanner`` reads every non-tensor item (the optimizer's ``param_groups``:
``lr``, ``betas``, ...) with ``torch.load(weights_only=False)``. A pickle runs whatever
callables it names, so a crafted checkpoint runs code on ``--resume``. The SHA-256 sums in
``vlmcp_meta.pt`` do not help: whoever can write the directory can recompute them. So every
pickle a DCP load would unpickle goes through a restricted reader instead:

* ``.metadata`` (and a rank's ``__R.metadata``): an unpickler whose ``find_class`` allows only
  what torch's own metadata holds (:data:`ALLOWED`: the classes of
  ``torch.distributed.checkpoint.metadata``, ``_StorageInfo``, ``torch.Size``, torch dtypes
  and layouts, ``pathlib.PosixPath``, plain containers; found by unpickling a real FSDP
  checkpoint with a recording ``find_class``), and no persistent ids;
* every bytes item: ``torch.load(weights_only=True)``, like the tensors torch already reads so;
* every ``relative_path`` the metadata names stays inside the checkpoint directory.

:func:`check_dcp_checkpoint` does all three before anything is loaded (on every rank,
:func:`vlmcp.train.checkpoint.run.load_run_checkpoint`; and on rank 0 while it verifies the
checksums), raising :class:`UnsafeCheckpoint` in one line naming the file; the load itself
then goes through :class:`SafeReader` and :class:`SafeLoadPlanner`, so a file swapped in
between the check and the load is refused the same way.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta

__all__ = ["ALLOWED", "SafeLoadPlanner", "SafeReader", "UnsafeCheckpoint", "check_dcp_checkpoint",
           "read_metadata"]

METADATA_FILE = ".metadata"

ALLOWED = frozenset({
    *(("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name (torch.strided), a dict lookup
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),  # storage_meta.checkpoint_id: no I/O
    ("pathlib._local", "PosixPath"), ("pathlib._local", "PurePosixPath"),  # Python 3.13's module
    ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
})
"""``(module, name)`` of every global a DCP ``.metadata`` may name; torch dtypes (``torch.float32``)
are allowed besides."""


class UnsafeCheckpoint(ValueError):
    """A checkpoint file would unpickle something a checkpoint never holds; nothing was loaded."""


def _refuse(path, what: str) -> UnsafeCheckpoint:
    return UnsafeCheckpoint(f"{path}: refused: it would unpickle {what}, which a DCP checkpoint never "
                            "holds (a crafted checkpoint runs code when loaded); nothing was loaded")


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                          torch.dtype)):
            return super().find_class(module, name)
        raise _refuse(self.path, f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _refuse(self.path, "a persistent id")


def read_metadata(path: str | os.PathLike) -> Metadata:
    """The DCP metadata in the file ``path``, unpickled through the allow-list.

    Raises:
        UnsafeCheckpoint: the file names a global outside :data:`ALLOWED`, or holds no metadata.
        ValueError: the file cannot be read (truncated, not a pickle).
    """
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f, path).load()
    except UnsafeCheckpoint:
        raise
    except Exception as err:
        raise ValueError(f"cannot read {path}: {type(err).__name__}: {err}") from err
    if not isinstance(metadata, Metadata):
        raise _refuse(path, f"a {type(metadata).__name__} where the metadata belongs")
    return metadata


def _load_bytes(raw: io.BytesIO, where: str) -> Any:
    try:
        return torch.load(raw, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        what = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UnsafeCheckpoint(f"{where}: refused: torch.load(weights_only=True) does not read it ({what}); "
                               "a DCP checkpoint's values are plain data; nothing was loaded") from None


def check_dcp_checkpoint(path: str | os.PathLike) -> None:
    """Unpickle, safely, everything a load of the DCP checkpoint directory ``path`` would unpickle.

    The metadata through the allow-list, every bytes item with ``weights_only=True``, and every
    file the metadata names must lie inside ``path`` (Note [vlmcp DCP checkpoints are unpickled
    through an allow-list]). Tensor items are left to the load (torch reads them with
    ``weights_only=True``).

    Raises:
        UnsafeCheckpoint: naming the file (and the item) that would unpickle something else.
        ValueError: a file cannot be read.
    """
    path = Path(path)
    metadata = read_metadata(path / METADATA_FILE)
    root = os.path.realpath(path)
    for index, info in (metadata.storage_data or {}).items():
        file = path / str(info.relative_path)
        if os.path.commonpath([root, os.path.realpath(file)]) != root:
            raise UnsafeCheckpoint(f"{path / METADATA_FILE}: refused: item {index.fqn} lies in "
                                   f"{info.relative_path!r}, outside the checkpoint; nothing was loaded")
        if not isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            continue
        if info.transform_descriptors:  # compressed items: vlmcp writes none
            raise UnsafeCheckpoint(f"{file}: refused: item {index.fqn} is stored through "
                                   f"{list(info.transform_descriptors)}, which vlmcp does not write")
        try:
            with open(file, "rb") as f:
                f.seek(info.offset)
                raw = f.read(info.length)
        except OSError as err:
            raise ValueError(f"cannot read {file}: {err.strerror or err}") from err
        _load_bytes(io.BytesIO(raw), f"{file}: item {index.fqn}")


class SafeReader(FileSystemReader):
    """torch's ``FileSystemReader`` with the metadata unpickled through the allow-list."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        metadata = read_metadata(self._get_metadata_path(rank))
        if getattr(metadata, "storage_meta", None) is None:  # as torch's read_metadata does
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """torch's ``DefaultLoadPlanner`` reading bytes items with ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        # the body of DefaultLoadPlanner.load_bytes, with weights_only=True
        from torch.distributed.checkpoint._traverse import set_element

        obj = _load_bytes(value, f"item {read_item.dest_index.fqn}")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
