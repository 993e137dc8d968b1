"""The token-mixer audit: every module of the language model that mixes tokens must run under CP.

Note [vlmcp HF token mixers]
----------------------------
Under CP a rank holds a shard of the row. A module that mixes tokens and is not
parallelized by vlmcp sees only that shard and trains wrong, without an error: measured
here, a tiny Qwen3.5 (Gated DeltaNet layers) at P=2 has a 0.70 relative gradient error,
an LFM2-VL (short convolutions) 0.33. So :func:`vlmcp.hf.parallelize` audits the language
model before it changes anything and before any collective (:func:`audit_token_mixers`)::

    language model, walked top-down (a classified module's children are not visited)
      class in register_mixer      -> accepted (a CP implementation prepares it)
      class or type in KINDS       -> refused: Gated DeltaNet / linear attention, Mamba, RG-LRU,
                                      convolutions over the sequence
      q_proj/k_proj/v_proj module, -> softmax attention, accepted when its forward dispatches
      or an MLA module (q_proj or     through ALL_ATTENTION_FUNCTIONS[config._attn_implementation]
      q_b_proj; kv_a_proj_with_mqa    and has no sinks; else refused. MLA (DeepSeek-V3, Kimi-K2.5)
      and kv_b_proj)                  expands its latent K/V per head before that call: q/k of
                                      nope+rope dims, V of v_head_dim, which cp_attention takes.
                                      A sliding_window attribute is the layer's window, which the
                                      call passes to vlmcp's attention (cp_attention(sliding_window=W),
                                      ring and Ulysses)
      owns parameters, not a known -> refused: vlmcp cannot tell that it is per-token
      per-token module
    each decoder layer: exactly one accepted token mixer (zero for an MLP-only "moe" or "mlp" layer)
    config.layer_types: "full_attention"; "sliding_attention" where the layer's attention module
                        has a sliding_window attribute (Gemma 3, Qwen2-VL); or served by a
                        registered class
    config.sliding_window without any windowed attention module -> refused (the window would
                        come from HF's mask alone, which vlmcp does not use)

The error names every offending module (path, class, kind, why), first few of each kind
plus a count. The checks are structural: ``forward``'s bytecode must load
``ALL_ATTENTION_FUNCTIONS`` (decorators unwrapped); :mod:`vlmcp.hf.attention` adds the
runtime half (a marked module whose forward returns without calling vlmcp's attention
raises).

A later CP implementation of a mixer (e.g. Qwen3.5's Gated DeltaNet) calls
:func:`register_mixer` with the module class and a ``prepare`` that readies one instance;
the audit then accepts that class in any layer type it appears in.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import CodeType

from torch import nn

from vlmcp.hf import attention as hf_attention

__all__ = ["KINDS", "MixerKind", "TokenMixer", "audit_token_mixers", "dispatches_via_interface",
           "register_mixer"]

MixerPrepare = Callable[[nn.Module], None]
"""Readies one module for CP, in place (called by ``parallelize`` after every check passed)."""

_QKV = ("q_proj", "k_proj", "v_proj")
_MLA_KV = ("kv_a_proj_with_mqa", "kv_b_proj")  # MLA's latent K/V projections (DeepSeek-V2/V3)
_SHOWN = 3  # offending modules listed per kind; the rest are counted


@dataclass(frozen=True, kw_only=True)
class MixerKind:
    """A kind of token mixer vlmcp recognizes and does not run under CP (yet)."""

    name: str
    """Short name shown in the error, e.g. ``"linear_attention"``."""
    why: str
    """Why it is wrong under CP (one clause)."""
    layer_types: tuple[str, ...] = ()
    """``config.layer_types`` entries of this kind."""
    class_names: tuple[str, ...] = ()
    """Substrings of module class names of this kind (e.g. ``"GatedDeltaNet"``)."""
    modules: tuple[type[nn.Module], ...] = ()
    """``torch.nn`` types of this kind (``isinstance``)."""


KINDS: tuple[MixerKind, ...] = (
    MixerKind(name="linear_attention",
              why="a recurrent state carried along the sequence (Gated DeltaNet, Lightning, KDA; with a "
                  "causal conv1d): each rank would start from a zero state at its shard. vlmcp runs "
                  "Qwen3.5's Gated DeltaNet (one decay per head); Kimi Delta Attention decays per key "
                  "channel, which its kernel does not take",
              layer_types=("linear_attention",),
              class_names=("GatedDeltaNet", "DeltaNet", "LinearAttention", "LightningAttention",
                           "DeltaAttention")),
    MixerKind(name="state_space",
              why="a Mamba/SSM scan carried along the sequence (vlmcp runs Nemotron-H's "
                  "NemotronHMamba2Mixer; this class is not registered)",
              layer_types=("mamba", "mamba2", "hybrid", "hybrid_sliding"),
              class_names=("Mamba", "Mixer", "SSM")),
    MixerKind(name="recurrent", why="an RG-LRU recurrence carried along the sequence",
              layer_types=("recurrent",), class_names=("RecurrentBlock", "Rglru", "RGLRU")),
    MixerKind(name="short_conv",
              why="a convolution over neighbouring tokens: at a shard boundary its k-1 predecessors sit on "
                  "another rank",
              layer_types=("conv",), class_names=("ShortConv",),
              modules=(nn.Conv1d, nn.Conv2d, nn.ConvTranspose1d)),
    MixerKind(name="sliding_window",
              why="a sliding-window layer whose attention module has no sliding_window attribute: its window "
                  "would come from HF's mask alone, which vlmcp does not use",
              layer_types=("sliding_attention", "reference_sliding_attention")),
    MixerKind(name="local_attention",
              why="chunked or windowed attention: vlmcp's plan masks by sample only",
              layer_types=("chunked_attention", "window_attention")),
    MixerKind(name="sparse_attention",
              why="indexed/compressed sparse attention: vlmcp computes dense attention",
              layer_types=("indexed_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                           "minimax_m3_sparse")),
)
"""The token mixers vlmcp recognizes by ``layer_types`` entry, class name or ``nn`` type."""

_CUSTOM_WHY = ("its forward does not dispatch through transformers' ALL_ATTENTION_FUNCTIONS"
               "[config._attn_implementation], so vlmcp's attention never runs and each rank would "
               "attend to its own shard only")
_SINKS_WHY = "attention sinks (a per-head logit outside q.k), which vlmcp's attention does not take"
_UNKNOWN_WHY = ("owns parameters but is neither attention nor a known per-token module (Linear, Embedding, "
                "norm, activation, MoE experts/router): vlmcp cannot tell that it does not mix tokens")
_SEVERAL_WHY = ("{} token mixers in one layer ({}), e.g. cross-attention: vlmcp runs one causal "
                "self-attention per layer")
_NONE_WHY = ("no token mixer vlmcp runs: no attention module with q_proj/k_proj/v_proj or MLA's "
             "kv_a_proj_with_mqa/kv_b_proj (a fused qkv projection?) and no registered mixer")
# Per-token modules that own parameters (every token is transformed on its own).
_PER_TOKEN_TYPES = (nn.Linear, nn.Embedding, nn.LayerNorm, nn.RMSNorm, nn.PReLU)
_PER_TOKEN_NAME = re.compile(r"(Norm|Linear|Embedding|Experts|Router|TopK|Activation)")
_FULL, _SLIDING = "full_attention", "sliding_attention"
_MLP_ONLY = ("moe", "mlp")  # layer types without a token mixer (Nemotron-H: "moe" and "mlp" blocks)

_REGISTERED: dict[type[nn.Module], MixerPrepare] = {}


def register_mixer(cls: type[nn.Module], prepare: MixerPrepare) -> None:
    """Declare that vlmcp runs modules of class ``cls`` exactly under CP.

    The audit then accepts ``cls`` as a layer's token mixer (whatever the layer's
    ``layer_types`` entry says) and ``parallelize`` calls ``prepare(module)`` on each
    instance, after every check passed. Replaces an earlier registration of ``cls``.
    """
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"register_mixer expects an nn.Module subclass, got {cls!r}")
    if not callable(prepare):
        raise TypeError(f"prepare must be callable, got {type(prepare).__name__}")
    _REGISTERED[cls] = prepare


@dataclass(frozen=True, eq=False)
class TokenMixer:
    """One accepted token mixer of the language model."""

    path: str
    """Its path from the top-level model, e.g. ``"model.language_model.layers.0.self_attn"``."""
    module: nn.Module
    """The module."""
    prepare: MixerPrepare
    """What ``parallelize`` calls on it: vlmcp attention's mark, or the registered implementation."""


@dataclass(frozen=True)
class _Refusal:
    path: str
    cls: str
    kind: str
    why: str


def _code_names(code: CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _code_names(const)


def dispatches_via_interface(cls: type[nn.Module]) -> bool:
    """Whether ``cls.forward`` (decorators unwrapped) loads ``ALL_ATTENTION_FUNCTIONS``."""
    code = getattr(inspect.unwrap(cls.forward), "__code__", None)
    return code is not None and "ALL_ATTENTION_FUNCTIONS" in set(_code_names(code))


def _is_attention(module: nn.Module) -> bool:
    """Softmax attention by its projections: separate q/k/v, or MLA (a query projection and latent K/V)."""
    if all(hasattr(module, a) for a in _QKV):
        return True
    return all(hasattr(module, a) for a in _MLA_KV) and (
        getattr(module, "q_proj", None) is not None or getattr(module, "q_b_proj", None) is not None)


def _kind_of(module: nn.Module) -> MixerKind | None:
    name = type(module).__name__
    for kind in KINDS:
        if isinstance(module, kind.modules) or any(c in name for c in kind.class_names):
            return kind
    return None


def _per_token(module: nn.Module) -> bool:
    return isinstance(module, _PER_TOKEN_TYPES) or bool(_PER_TOKEN_NAME.search(type(module).__name__))


def _walk(module: nn.Module, path: str, accepted: list[TokenMixer], refused: list[_Refusal]) -> None:
    cls = type(module)
    if cls in _REGISTERED:
        accepted.append(TokenMixer(path, module, _REGISTERED[cls]))
        return
    kind = _kind_of(module)
    if kind is not None:
        refused.append(_Refusal(path, cls.__name__, kind.name, kind.why))
        return
    if _is_attention(module):
        sinks = [n for n, _ in module.named_parameters(recurse=False) if "sink" in n]
        if not dispatches_via_interface(cls):
            refused.append(_Refusal(path, cls.__name__, "custom_attention", _CUSTOM_WHY))
        elif sinks:
            why = f"{_SINKS_WHY} ({', '.join(sinks)})"
            refused.append(_Refusal(path, cls.__name__, "attention_sinks", why))
        else:
            accepted.append(TokenMixer(path, module, hf_attention.mark))
        return
    if next(module.parameters(recurse=False), None) is not None and not _per_token(module):
        refused.append(_Refusal(path, cls.__name__, "unknown", _UNKNOWN_WHY))
        return
    for name, child in module.named_children():
        _walk(child, f"{path}.{name}", accepted, refused)


def _layer_list(language_model: nn.Module, n_layers: int | None) -> tuple[str, nn.ModuleList] | None:
    """The decoder layers: ``layers`` (every HF decoder), else the first ModuleList of that length."""
    named = [("layers", getattr(language_model, "layers", None)), *language_model.named_modules()]
    for name, m in named:
        if isinstance(m, nn.ModuleList) and len(m) == n_layers:
            return name, m
    return None


def _layer_type_kind(layer_type: str) -> tuple[str, str]:
    for kind in KINDS:
        if layer_type in kind.layer_types:
            return kind.name, f"layer type {layer_type!r}: {kind.why}"
    return "unknown", f"layer type {layer_type!r}, which vlmcp does not know"


def _inside(path: str, layer: str) -> bool:
    return path == layer or path.startswith(layer + ".")


def audit_token_mixers(model: nn.Module, language_model_path: str) -> list[TokenMixer]:
    """The accepted token mixers of ``model``'s language model; raises if anything else mixes tokens.

    Args:
        model: the top-level model (``model.config.text_config`` is the language model's config).
        language_model_path: the language model's submodule path (the adapter's ``language_model``).

    Returns:
        One :class:`TokenMixer` per decoder layer (attention modules and registered classes).

    Raises:
        ValueError: the message names every refused module (path, class, kind, why), compactly.
    """
    config = model.config.text_config
    language_model = model.get_submodule(language_model_path)
    accepted: list[TokenMixer] = []
    refused: list[_Refusal] = []
    _walk(language_model, language_model_path, accepted, refused)

    n_layers = getattr(config, "num_hidden_layers", None)
    found = _layer_list(language_model, n_layers)
    layer_types = list(getattr(config, "layer_types", None) or [])
    if found is None:
        refused.append(_Refusal(language_model_path, type(language_model).__name__, "layout",
                                f"no nn.ModuleList of num_hidden_layers={n_layers} decoder layers, so vlmcp "
                                "cannot check that every layer has exactly one token mixer it runs"))
    else:
        name, layers = found
        for i, layer in enumerate(layers):
            lpath = f"{language_model_path}.{name}.{i}"
            if any(_inside(r.path, lpath) for r in refused):
                continue  # named already
            mine = [m for m in accepted if _inside(m.path, lpath)]
            ltype = layer_types[i] if i < len(layer_types) else _FULL
            cls = type(layer).__name__
            if len(mine) > 1:
                why = _SEVERAL_WHY.format(len(mine), ", ".join(m.path for m in mine))
                refused.append(_Refusal(lpath, cls, "several_mixers", why))
            elif not mine and ltype not in _MLP_ONLY:
                refused.append(_Refusal(lpath, cls, "no_attention", _NONE_WHY))
            elif mine and ltype != _FULL and mine[0].prepare is hf_attention.mark and not (
                    ltype == _SLIDING and getattr(mine[0].module, "sliding_window", None) is not None):
                kind, why = _layer_type_kind(ltype)
                refused.append(_Refusal(lpath, cls, kind, why))
    windowed = any(getattr(m.module, "sliding_window", None) is not None for m in accepted)
    if (not windowed and not any(r.kind == "sliding_window" for r in refused)
            and getattr(config, "sliding_window", None) is not None
            and getattr(config, "use_sliding_window", True)):
        refused.append(_Refusal(language_model_path, type(language_model).__name__, "sliding_window",
                                f"text_config.sliding_window={config.sliding_window} but no attention module "
                                "has a sliding_window attribute: the window would come from HF's mask alone, "
                                "which vlmcp does not use"))
    if refused:
        raise ValueError(_message(model, language_model_path, refused, n_layers))
    return accepted


def _message(model: nn.Module, lm_path: str, refused: list[_Refusal], n_layers: int | None) -> str:
    groups: dict[tuple[str, str], list[_Refusal]] = {}
    for r in refused:
        groups.setdefault((r.kind, r.cls), []).append(r)
    lines = []
    for (kind, cls), rs in groups.items():
        paths = ", ".join(r.path for r in rs[:_SHOWN])
        more = f" and {len(rs) - _SHOWN} more" if len(rs) > _SHOWN else ""
        lines.append(f"  {cls} [{kind}] at {paths}{more}: {rs[0].why}")
    model_type = getattr(model.config, "model_type", None)
    return (f"{type(model).__name__} (model_type={model_type!r}): {len(refused)} module(s) of the language "
            f"model {lm_path} ({n_layers} layers) mix tokens in a way vlmcp does not run under context "
            "parallelism (each rank would see only its shard: wrong outputs and gradients, no error):\n"
            + "\n".join(lines))
