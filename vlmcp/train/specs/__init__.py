"""The model families the one loop trains, one package each behind :class:`~vlmcp.train.spec.TrainSpec`.

* :mod:`.reference` — the built-in reference VLM on its built-in rows (``vlmcp train``);
* :mod:`.hf` — a Hugging Face model directory on conversations files (``vlmcp train --model``).

Each package has a ``config`` (its :class:`~vlmcp.train.config.TrainConfig` subclass), a ``spec``
(the rank side: model, rows, loss, final save) and a ``launch`` module: what runs before any rank
starts (``CONFIG``, ``config_values``, ``outputs``, ``prepare``, ``finished``, ``record_dir``,
``announce``, ``report``; :mod:`vlmcp.cli.train` calls them). Adding a family is adding a package
and a line to :data:`LAUNCHERS`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["LAUNCHERS", "launcher", "launcher_for"]

LAUNCHERS = {"reference": "vlmcp.train.specs.reference.launch", "hf": "vlmcp.train.specs.hf.launch"}
"""Each family's launch module, by name (imported when used: the HF one reads transformers)."""


def launcher(name: str) -> ModuleType:
    """The launch module of the family ``name``."""
    return importlib.import_module(LAUNCHERS[name])


def launcher_for(cfg) -> ModuleType:
    """The launch module whose ``CONFIG`` ``cfg`` is."""
    for name in LAUNCHERS:
        module = launcher(name)
        if type(cfg) is module.CONFIG:
            return module
    raise TypeError(f"no training spec takes a {type(cfg).__name__}")
