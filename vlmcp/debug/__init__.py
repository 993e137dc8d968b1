"""The tooling that checks, measures and builds test inputs for vlmcp; the runtime never imports it.

It sits above the runtime (``vlmcp.hf``, the core, ``vlmcp.train``): it imports them, and nothing
there imports it; the command line (``vlmcp verify``, ``compare``, ``init-model``, ``bench``), the
benchmarks and the tests do. ``import vlmcp.debug`` imports none of its modules.

* :mod:`.tiny` — :func:`~vlmcp.debug.tiny.tiny_config` / :func:`~vlmcp.debug.tiny.tiny_model`: one
  registry of tiny random HF configs keyed by model type, for tests, ``vlmcp verify --model hf:ARCH``
  and ``vlmcp init-model``.
* :mod:`.synthetic` — :func:`~vlmcp.debug.synthetic.synthetic_row`: a packed processor row of
  chat-like samples with images and videos for any architecture, its media written by one function
  per model type (a registry).
* :mod:`.float64` — :func:`~vlmcp.debug.float64.float64_exact`: the context that lifts the float32
  islands of HF modules (norms, rotary, routers) so a float64 parity check is exact.
* :mod:`.parity` — one training step under CP against one process, the gradients compared by one
  core: the reference VLM (``vlmcp verify``, :mod:`.parity.vlm`) and an HF model against its
  unmodified self (``vlmcp verify --model``, :mod:`.parity.hf`).
* :mod:`.long_tail` — the measurement of transformers' image-text-to-text types without an adapter.
* :mod:`.seed_table` — the seed's table: one step in four layouts, measured (``vlmcp compare``).
* :mod:`.meters` — exact counters: the bytes autograd saves for backward, every op's output.
* :mod:`.init_model` — ``vlmcp init-model``: a tiny random model directory with its processor,
  offline.
"""
