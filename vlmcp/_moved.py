"""Old import paths of modules that moved in 0.2 (CHANGELOG.md), kept for one release.

``import vlmcp.linear`` (or ``from vlmcp.hf.tiny import tiny_config``) still works: a meta-path
finder answers the old name with the new module, under a :class:`DeprecationWarning` that names
the new path. Nothing here is imported by the new paths themselves.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["MOVED", "install"]

MOVED = {
    "vlmcp.linear": "vlmcp.mixers",
    "vlmcp.linear.cp": "vlmcp.mixers.delta_rule_cp",
    "vlmcp.linear.ulysses": "vlmcp.mixers.deltanet_ulysses",
    "vlmcp.linear.exchange": "vlmcp.mixers.state_exchange",
    "vlmcp.linear.delta_rule": "vlmcp.mixers.delta_rule",
    "vlmcp.linear.segments": "vlmcp.mixers.segments",
    "vlmcp.linear.conv_halo": "vlmcp.mixers.conv_halo",
    "vlmcp.hf.gdn": "vlmcp.hf.mixers.gdn",
    "vlmcp.hf.short_conv": "vlmcp.hf.mixers.short_conv",
    "vlmcp.hf.tiny": "vlmcp.hf.debug.tiny",
    "vlmcp.hf.tiny_anyres": "vlmcp.hf.debug.tiny.anyres",
    "vlmcp.hf.rows": "vlmcp.hf.debug.synthetic",
    "vlmcp.hf.verify": "vlmcp.hf.debug.parity",
    "vlmcp.hf.qwen3_5_float64": "vlmcp.hf.debug.float64",
    "vlmcp.hf.kimi_float64": "vlmcp.hf.debug.float64",
    "vlmcp.hf.init_model": "vlmcp.hf.debug.init_model",
    "vlmcp.hf.init_gemma3": "vlmcp.hf.debug.init_model.gemma3",
    "vlmcp.hf.init_smolvlm": "vlmcp.hf.debug.init_model.smolvlm",
    "vlmcp.verify": "vlmcp.checks.parity",
    "vlmcp.compare": "vlmcp.checks.seed_table",
    "vlmcp.memory": "vlmcp.checks.saved_tensors",
    "vlmcp.attention.comm": "vlmcp.attention.ring_comm",
    "vlmcp.attention.cp": "vlmcp.attention.dispatch",
    "vlmcp.layout.placement": "vlmcp.layout.sample_placement",
    "vlmcp.data.hf.conversations": "vlmcp.data.hf.reader",
    "vlmcp.data.hf.conversation": "vlmcp.data.hf.schema",
    "vlmcp.train.reference.checkpoint": "vlmcp.train.checkpoint",
    "vlmcp.cli.ranks": "vlmcp.ranks",
    "vlmcp.train.reference.state": "vlmcp.train.checkpoint.state",
    "vlmcp.train.state": "vlmcp.train.checkpoint.state",
    "vlmcp.train.durable": "vlmcp.train.checkpoint.durable",
    "vlmcp.train.reference": "vlmcp.train.specs.reference",
    "vlmcp.train.reference.config": "vlmcp.train.specs.reference.config",
    "vlmcp.train.reference.step": "vlmcp.train.specs.reference.step",
    "vlmcp.train.reference.loop": "vlmcp.train.specs.reference.spec",
    "vlmcp.train.hf": "vlmcp.train.specs.hf",
    "vlmcp.train.hf.config": "vlmcp.train.specs.hf.config",
    "vlmcp.train.hf.loop": "vlmcp.train.specs.hf.spec",
    "vlmcp.train.hf.agree": "vlmcp.train.specs.hf.agree",
    "vlmcp.train.hf.finetune": "vlmcp.train.specs.hf.finetune",
    "vlmcp.train.hf.finetune_config": "vlmcp.train.specs.hf.finetune_config",
    "vlmcp.train.hf.final_model": "vlmcp.train.specs.hf.final_model",
    "vlmcp.train.hf.checkpoint": "vlmcp.train.checkpoint.run",
    "vlmcp.train.hf.dcp_checkpoint": "vlmcp.train.checkpoint.dcp",
    "vlmcp.train.hf.dcp_reader": "vlmcp.train.checkpoint.dcp_reader",
    "vlmcp.train.hf.optim": "vlmcp.train.optim",
    "vlmcp.train.hf.feedback": "vlmcp.train.feedback",
    "vlmcp.train.hf.evaluate": "vlmcp.train.evaluate",
    "vlmcp.cli.train_hf": "vlmcp.train.specs.hf.launch",
    "vlmcp.cli.model_check": "vlmcp.train.specs.hf.model_check",
}
"""Old module path -> new module path."""


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {self.new}; the old path goes away in the next release",
                      DeprecationWarning, stacklevel=4)
        return importlib.import_module(self.new)

    def exec_module(self, module):
        pass  # the new module ran already


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        new = MOVED.get(name)
        if new is None:
            return None
        return importlib.util.spec_from_loader(name, _Alias(new))


def install() -> None:
    """Add the finder once (``import vlmcp`` calls it)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
