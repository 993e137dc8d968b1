"""Tooling for Hugging Face models: tiny configs, synthetic rows, float64 parity, offline model dirs.

Nothing here runs at training time, and ``import vlmcp.hf`` imports none of it.

* :mod:`.tiny` — :func:`tiny_config` / :func:`tiny_model`: one registry of tiny random configs,
  keyed by architecture (adapter name), for tests, ``vlmcp verify --model hf:ARCH`` and
  ``vlmcp init-model``.
* :mod:`.synthetic` — :func:`synthetic_row`: a packed row of chat-like samples with images and
  videos for any architecture, through its adapter.
* :mod:`.float64` — :func:`float64_exact`: the context that lifts the float32 islands of HF
  modules (norms, rotary, routers) so a float64 parity check is exact.
* :mod:`.parity` — :func:`hf_parity`: loss and every gradient under CP against the unmodified
  model on one process (``vlmcp verify --model``).
* :mod:`.init_model` — ``vlmcp init-model``: a tiny random model directory with its processor,
  offline.
"""
