"""One training step under CP on P ranks against one process: loss and every gradient.

Two model kinds, one module each, and the comparison they share:

* :mod:`.vlm` — :func:`~vlmcp.debug.parity.vlm.parity_case`: the reference VLM (``vlmcp verify``),
  against itself built with ``cp_size=1``; float64, float32 and bfloat16.
* :mod:`.hf` — :func:`~vlmcp.debug.parity.hf.hf_parity`: a Hugging Face VLM through
  ``parallelize`` / ``shard_inputs`` against the unmodified model run one sample at a time
  (``vlmcp verify --model``).
* :mod:`.compare` — what both share: :class:`~vlmcp.debug.parity.compare.StepCase`, how the CP step
  runs, and :func:`~vlmcp.debug.parity.compare.gradient_errors`, every parameter's relative gradient
  error against the single process, the worst over ranks.

The package imports neither model kind (the reference VLM's check runs without transformers).
"""
