"""Hugging Face layers under CP: the token-mixer audit, and the forwards vlmcp installs on HF layers.

The CP algorithms themselves are :mod:`vlmcp.mixers` (model-independent); this package adapts HF's
layer classes to them: it replaces a layer instance's ``forward`` by one that reads the layout from
the call and runs the algorithm, and declares the classes it handles to the audit.

* :mod:`.audit` — :func:`audit_token_mixers`, run by :func:`vlmcp.hf.parallelize` before it changes
  anything: every module mixing tokens must be softmax attention through transformers' attention
  interface or a registered mixer, or it is refused by name (Note [vlmcp HF token mixers]);
  :func:`register_mixer` declares a CP implementation of a mixer class.
* :mod:`.gdn` — Qwen3.5's Gated DeltaNet (Note [vlmcp HF Gated DeltaNet]).
* :mod:`.short_conv` — LFM2's gated short convolution.
* :mod:`.mamba2` — Nemotron-H's Mamba-2 (Note [vlmcp HF Mamba-2]).
* :mod:`.llama4` — Llama 4's attention: NoPE temperature tuning, chunked layers (Note [vlmcp HF
  Llama 4 attention]).
* :mod:`.install` — what they share: the forward installed on the instance, the layout of the call.

The implementations read the CP layout from the call's :class:`~vlmcp.hf.attention.CPContext` and
run :mod:`vlmcp.mixers`' collectives.
"""

from vlmcp.hf.layers.audit import KINDS, MixerKind, TokenMixer, audit_token_mixers, register_mixer

__all__ = ["KINDS", "MixerKind", "TokenMixer", "audit_token_mixers", "register_mixer"]
