"""Token mixers of Hugging Face language models under CP: the audit and the CP implementations.

* :mod:`.audit` — :func:`audit_token_mixers`, run by :func:`vlmcp.hf.parallelize` before it changes
  anything: every module mixing tokens must be softmax attention through transformers' attention
  interface or a registered mixer, or it is refused by name (Note [vlmcp HF token mixers]);
  :func:`register_mixer` declares a CP implementation of a mixer class.
* :mod:`.gdn` — Qwen3.5's Gated DeltaNet (Note [vlmcp HF Gated DeltaNet]).
* :mod:`.short_conv` — LFM2's gated short convolution.
* :mod:`.mamba2` — Nemotron-H's Mamba-2 (Note [vlmcp HF Mamba-2]).

The implementations read the CP layout from the call's :class:`~vlmcp.hf.attention.CPContext` and
run :mod:`vlmcp.mixers`' collectives.
"""

from vlmcp.hf.mixers.audit import KINDS, MixerKind, TokenMixer, audit_token_mixers, register_mixer

__all__ = ["KINDS", "MixerKind", "TokenMixer", "audit_token_mixers", "register_mixer"]
