"""A function rewritten to compute in another dtype where it names float32 (float64 parity's tool).

:func:`in_dtype` copies a function with every ``torch.float32`` it names read as the given dtype and
every ``x.float()`` it calls rewritten (from its source) as ``x.to(dtype)``, so a float32 island of
transformers (Note [vlmcp float64 parity: float32 islands]) can run in float64 without a copy of its
code in vlmcp. :func:`plain_function` finds the Python function behind a decorated one or a hub
kernel's ``Func``.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
from collections.abc import Callable

import torch

__all__ = ["in_dtype", "plain_function"]


class _TorchWithFloat32As(types.ModuleType):
    def __init__(self, dtype: torch.dtype):
        super().__init__("torch")
        self.float32 = dtype

    def __getattr__(self, name):
        return getattr(torch, name)


class _FloatCallsAsFloat32(ast.NodeTransformer):
    """``x.float()`` -> ``x.to(torch.float32)`` (which :func:`in_dtype` then reads as its dtype)."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "float" and not node.args and not node.keywords:
            float32 = ast.Attribute(value=ast.Name(id="torch", ctx=ast.Load()), attr="float32",
                                    ctx=ast.Load())
            return ast.copy_location(ast.Call(func=ast.Attribute(value=func.value, attr="to", ctx=ast.Load()),
                                              args=[float32], keywords=[]), node)
        return node


def _names(code: types.CodeType) -> set[str]:
    """The names ``code`` and the code nested in it load (attributes included)."""
    return set(code.co_names).union(*(_names(c) for c in code.co_consts if isinstance(c, types.CodeType)))


@functools.cache
def _without_float_calls(raw: Callable) -> types.CodeType:
    """``raw``'s code, its ``.float()`` calls rewritten (:class:`_FloatCallsAsFloat32`), from its source."""
    if raw.__code__.co_freevars:
        raise NotImplementedError(f"in_dtype: {raw.__qualname__} has free variables "
                                  f"{raw.__code__.co_freevars}; its .float() calls cannot be rewritten")
    tree = ast.parse(textwrap.dedent(inspect.getsource(raw)))
    tree.body[0].decorator_list = []
    tree = ast.fix_missing_locations(_FloatCallsAsFloat32().visit(tree))
    ast.increment_lineno(tree, raw.__code__.co_firstlineno - 1)
    module = compile(tree, raw.__code__.co_filename, "exec")
    return next(c for c in module.co_consts if isinstance(c, types.CodeType) and c.co_name == raw.__name__)


def plain_function(fn: Callable) -> Callable:
    """The Python function behind ``fn``: its decorators unwrapped, and a hub-kernel ``Func`` opened.

    From transformers 5.25, functions that a hub kernel may replace (Qwen3.5's
    ``torch_chunk_gated_delta_rule``, Nemotron-H's ``mamba2_chunk_scan``, ...) are ``nn.Module``
    instances of the ``kernels`` package's ``Func``, whose ``forward`` calls the decorated function
    it closes over (``func``); transformers 5.24 left them plain functions.
    """
    if isinstance(fn, torch.nn.Module):
        forward = type(fn).forward
        free = forward.__code__.co_freevars
        if "func" not in free:
            raise NotImplementedError(f"{type(fn).__qualname__}: a module whose forward does not close over "
                                      f"the function it runs (free variables {free})")
        fn = forward.__closure__[free.index("func")].cell_contents
    return inspect.unwrap(fn)


def in_dtype(fn: Callable, dtype: torch.dtype) -> Callable:
    """``fn`` (:func:`plain_function`) with every ``torch.float32`` it names read as ``dtype``, and every
    ``x.float()`` it calls as ``x.to(dtype)``."""
    raw = plain_function(fn)
    namespace = dict(raw.__globals__)
    namespace["torch"] = _TorchWithFloat32As(dtype)
    code = raw.__code__
    if "float" in _names(code):
        code = _without_float_calls(raw)
    out = types.FunctionType(code, namespace, raw.__name__, raw.__defaults__, raw.__closure__)
    out.__kwdefaults__ = raw.__kwdefaults__
    return out
