"""Benchmarks behind ``vlmcp bench`` and the "Measured" figures of docs/benchmarks.md (not tests).

One module per benchmark, each with ``add_arguments(parser)`` and ``run(args) -> int``:

* :mod:`vlmcp.bench.plan`: how long ``plan_cp`` and every rank's ``for_rank`` take
  on a long packed row (``vlmcp bench plan``, ``make bench-plan``);
* :mod:`vlmcp.bench.attention`: CP attention time and saved-for-backward bytes per
  rank against one process on the whole row, ring and Ulysses (``vlmcp bench attention``);
* :mod:`vlmcp.bench.saved_bytes`: saved-for-backward bytes per rank of one VLM training
  step against one process (``vlmcp bench memory``);
* :mod:`vlmcp.bench.vision`: ViT time per rank, ``replicate`` against ``scatter``
  (``vlmcp bench vision``);
* :mod:`vlmcp.bench.hf`: a Hugging Face Qwen2-VL under vlmcp: saved bytes per rank with
  videos and sharded visual tokens (``vlmcp bench hf-memory``), ViT time per rank for one
  long video (``vlmcp bench hf-vision``), what the LM head and loss save at a real vocabulary,
  full logits against chunked (``vlmcp bench hf-loss``), a whole training step at P against one
  process: time and the busiest rank's peak (``vlmcp bench hf-step``), ``vlmcp plan --model``'s memory
  estimate against the exact counter on tiny models (``vlmcp bench hf-estimate``); skipped without
  transformers.

``vlmcp bench all`` runs them all on their defaults (minutes; ``make bench``).
"""

__all__ = ["BENCHMARKS"]

BENCHMARKS = {
    "plan": "vlmcp.bench.plan",
    "attention": "vlmcp.bench.attention",
    "memory": "vlmcp.bench.saved_bytes",
    "vision": "vlmcp.bench.vision",
    "hf-memory": "vlmcp.bench.hf.saved_bytes",
    "hf-vision": "vlmcp.bench.hf.vision",
    "hf-loss": "vlmcp.bench.hf.loss",
    "hf-step": "vlmcp.bench.hf.step",
    "hf-estimate": "vlmcp.bench.hf.estimate",
}
"""The names ``vlmcp bench`` accepts -> the module of each, in the order ``vlmcp bench all`` runs them."""
