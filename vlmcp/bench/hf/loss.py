"""What the LM head and its loss keep for backward at a real vocabulary: full logits against chunked.

Run: ``vlmcp bench hf-loss [--vocab 151936 --tokens 4096 --hidden 256 --chunk-size 4096]``.

A scaled-down Qwen2-VL (:func:`vlmcp.bench.hf.bench_model` with ``--vocab`` entries) trains one
step in one process on one row (an image of 64 tokens, the rest text), once with the full
logits (``model(...).logits`` and :func:`vlmcp.cp_cross_entropy`, ``vlmcp train --loss full``)
and once with :func:`vlmcp.hf.causal_lm_loss` (the default). Exact counters, no timer:

* saved: the bytes autograd keeps for backward over the whole step
  (:class:`~vlmcp.debug.meters.saved_tensors.SavedTensorMeter`, parameters left out), and the
  head+loss's part of it: the same counter on the head and loss alone, fed the step's
  ``(N, hidden)`` last hidden states;
* transient: the most bytes the head and loss alone hold at once beyond those saved, forward
  and backward (:class:`~vlmcp.debug.meters.allocations.AllocationMeter`; the chunked path's is
  :func:`vlmcp.loss.chunk_transient_bytes` for its chunk).
"""

from __future__ import annotations

import argparse

import torch
from torch.nn import functional as F

import vlmcp
from vlmcp.bench.hf import bench_model, needs_transformers
from vlmcp.debug.meters.allocations import AllocationMeter
from vlmcp.debug.meters.saved_tensors import SavedTensorMeter
from vlmcp.loss import chunk_transient_bytes

NAME = "hf-loss"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary (default 151936, Qwen's)")
    parser.add_argument("--tokens", type=int, default=4096, help="row length (default 4096)")
    parser.add_argument("--hidden", type=int, default=256, help="LLM width (default 256)")
    parser.add_argument("--layers", type=int, default=2, help="LLM layers (default 2)")
    parser.add_argument("--chunk-size", type=int, default=4096, help="target tokens per chunk (default 4096)")


def head_alone(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int | None):
    """``(saved, transient)`` bytes of the head and loss alone on ``hidden``."""
    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_()
    with AllocationMeter() as alloc:
        with SavedTensorMeter([h, w]) as saved:
            res = (vlmcp.cp_cross_entropy(F.linear(h, w), labels, None) if chunk is None
                   else vlmcp.cp_linear_cross_entropy(h, w, labels, None, chunk_size=chunk))
        res.loss.backward()
    grads = h.grad.nbytes + w.grad.nbytes  # outputs of backward, not transients
    return saved.bytes, max(alloc.peak_live_bytes - saved.bytes - grads, 0)


def _step(model, batch, chunk: int | None) -> tuple[int, torch.Tensor | None]:
    """Saved bytes of one whole step; for the full-logits step also the head's input (the last
    hidden states; ``causal_lm_loss`` refuses a hooked head on the chunked path)."""
    import vlmcp.hf

    seen = {}

    def keep(module, args):  # returns None: the head's input is unchanged
        seen["h"] = args[0][0].detach()

    handle = None if chunk is not None else model.lm_head.register_forward_pre_hook(keep)
    try:
        with SavedTensorMeter(model.parameters()) as meter:
            res = vlmcp.hf.causal_lm_loss(model, batch, None, chunk_size=chunk)
        res.loss.backward()
    finally:
        if handle is not None:
            handle.remove()
    model.zero_grad(set_to_none=True)
    return meter.bytes, seen.get("h")


def run(args: argparse.Namespace) -> int:
    if needs_transformers(NAME):
        return 0
    import vlmcp.hf
    from vlmcp.debug.synthetic import synthetic_row

    if args.tokens < 200:
        raise ValueError(f"--tokens must be >= 200 (an image of 64 tokens and text), got {args.tokens}")
    model = bench_model(hidden=args.hidden, layers=args.layers, vit_width=64, vit_depth=1, vocab=args.vocab)
    vlmcp.hf.parallelize(model, None)
    text = args.tokens - 64 - 2  # the vision start/end markers
    inputs, labels, cu = synthetic_row(model, ((16, (1, 16, 16), text - 16),))
    batch = vlmcp.hf.shard_inputs(model, inputs, None, labels=labels, cu_seqlens=cu)
    n = batch.shard.num_tokens
    full_step, hidden = _step(model, batch, None)
    chunked_step, _ = _step(model, batch, args.chunk_size)
    weight = model.lm_head.weight
    print(f"Qwen2-VL LLM hidden {args.hidden} x {args.layers} layers, vocabulary {args.vocab:,}; one row of "
          f"{n:,} tokens ({int((batch.labels != -100).sum()):,} targets), one process, float32")
    print("| loss | saved by the step | of which head+loss | head+loss share | head+loss transient |")
    print("|---|---|---|---|---|")
    for name, step, chunk in (("full logits", full_step, None), (f"chunked ({args.chunk_size})", chunked_step,
                                                                  args.chunk_size)):
        saved, transient = head_alone(hidden, weight, batch.labels, chunk)
        print(f"| {name} | {step / 2**20:,.1f} MiB | {saved / 2**20:,.2f} MiB | {saved / step:.1%} | "
              f"{transient / 2**20:,.1f} MiB |", flush=True)
    c = min(args.chunk_size, int((batch.labels != -100).sum()))
    transient = chunk_transient_bytes(c, args.vocab, torch.float32)
    print(f"chunk_transient_bytes({c}, {args.vocab}, float32) = {transient / 2**20:,.1f} MiB")
    return 0
