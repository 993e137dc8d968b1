"""How a CP implementation of a token mixer is installed on a Hugging Face module.

Every implementation (:mod:`.gdn`, :mod:`.short_conv`) replaces the module's ``forward`` on the
instance (:func:`install_forward`), reads the CP layout from the call's keywords
(:func:`cp_context`: the :class:`~vlmcp.hf.attention.CPContext` that ``shard_inputs`` puts under
``vlmcp_cp``, as for attention), and declares its classes to the token-mixer audit
(:func:`register_classes`).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Sequence

import torch
from torch import nn

from vlmcp.hf.attention import CONTEXT_KEY, CPContext
from vlmcp.hf.hub_kernels import keep_instance_forward
from vlmcp.hf.layers import audit

__all__ = ["cp_context", "install_forward", "register_classes"]


def cp_context(module: nn.Module, hidden_states: torch.Tensor, cache, kwargs: dict) -> CPContext:
    """The call's :class:`CPContext`, after checking a token mixer's CP call (no cache, one row)."""
    ctx = kwargs.get(CONTEXT_KEY)
    if not isinstance(ctx, CPContext):
        raise RuntimeError(
            f"{type(module).__name__} runs under vlmcp CP but the call carries no CP layout: call "
            "model(**vlmcp.hf.shard_inputs(model, inputs, cp_group, ...).model_inputs)")
    if cache is not None:
        raise ValueError("vlmcp CP runs without a generation cache (shard_inputs sets use_cache=False)")
    if hidden_states.dim() != 3 or hidden_states.shape[0] != 1:
        raise ValueError(f"vlmcp CP takes one row (batch 1), got hidden states {tuple(hidden_states.shape)}")
    return ctx


def register_classes(classes, prepare_fn) -> None:
    """Register with ``prepare_fn`` each (transformers module, class name) of ``classes`` whose
    module is loaded already (a model of that class can exist only then), so registering imports
    nothing. A class registered already (by the user, with their own implementation) keeps its
    registration."""
    for module, name in classes:
        loaded = sys.modules.get(module)
        if loaded is not None and getattr(loaded, name) not in audit._REGISTERED:
            audit.register_mixer(getattr(loaded, name), prepare_fn)


def install_forward(module: nn.Module, forward: Callable, mark: str, needs: Sequence[str],
                    layout: str) -> bool:
    """Replace ``module.forward`` by ``forward`` bound to it, once; False when it was installed already.
    Hub-kernel kernelization (transformers 5.25's ``train()``/``eval()``) leaves it in place (Note [vlmcp
    instance forwards and hub kernels]).

    Args:
        module: the HF token mixer instance.
        forward: the CP forward, ``forward(self, hidden_states, ...)``.
        mark: the attribute that marks an installed module (idempotence).
        needs: the submodules and parameters ``forward`` reads; a module without one is refused.
        layout: what the module must be, for the error (``"transformers' Lfm2ShortConv"``).

    Raises:
        ValueError: ``module`` lacks one of ``needs``.
    """
    if getattr(module, mark, False):
        return False
    for name in needs:
        if not hasattr(module, name):
            raise ValueError(f"{type(module).__name__} has no {name!r}: not the layout vlmcp runs under CP "
                             f"({layout})")
    module.forward = types.MethodType(forward, module)
    keep_instance_forward(module)
    setattr(module, mark, True)
    return True
