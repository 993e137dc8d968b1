"""A whole Hugging Face training step at P against one process: time, and the busiest rank's peak.

Run: ``vlmcp bench hf-step [--cp 2 --strategies replicate shard auto --loss chunked full --tokens 2048
--vocab 151936 --repeats 2]``.

A scaled-down Qwen2-VL (:func:`vlmcp.bench.hf.bench_model`: LLM ``--hidden`` x ``--layers``, a
``--vocab``-entry vocabulary, ViT ``--vit-width`` x ``--vit-depth``) trains one step on one packed
row of ``--images`` samples, each one ``--image-side`` x ``--image-side``-patch image and text, in
``--tokens`` tokens: ``shard_inputs``, :func:`vlmcp.hf.causal_lm_loss` (``--loss chunked``, the
default of ``vlmcp train``, or ``full``: the logits and ``cp_cross_entropy``), ``backward`` and
:func:`vlmcp.reduce_gradients`. Per ``--loss``, one process runs the same step first (vlmcp at
P=1, the same kernels: the other ranks wait at a barrier), then the P ranks run it once per
``--strategies`` entry (``image_strategy``; ``--vision-mode`` for all).

Time (ratios measured in one run on a shared machine, never asserted): each step runs once
untimed under the counters, then ``--repeats`` times; a step's time is the slowest rank's wall
time, the table gives medians; speed-up = one process / P ranks, efficiency = speed-up / P. Each
rank's CPU time (``time.process_time``) is given too, and the CPU speed-up (one process's CPU time
over the busiest rank's), since ranks that share cores stretch each other's wall time.

Memory (exact counters): of the busiest rank (the most saved bytes),

* saved: what autograd keeps for backward over the whole step
  (:class:`~vlmcp.debug.meters.saved_tensors.SavedTensorMeter`, parameters left out), and the head+loss's
  part of it: the same counter on the head and loss alone, fed this rank's last hidden states;
* transient: the most the head and loss alone hold at once beyond that
  (:class:`~vlmcp.debug.meters.allocations.AllocationMeter`, as ``vlmcp bench hf-loss``);
* states: parameters, gradients and AdamW's two moments (same dtype as the parameters), each
  rank holding all of them (CP replicates the model; ``vlmcp plan --model`` shards them for FSDP);
* peak = saved + transient + states.

The step's gradients after the reduction are compared with the one-process step's (largest
relative error over the parameters), so the figures are for a step that trains the same model.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.distributed as dist

from vlmcp.bench import bench_ranks
from vlmcp.bench.hf import bench_model, needs_transformers
from vlmcp.bench.hf.loss import head_alone
from vlmcp.debug.meters.saved_tensors import SavedTensorMeter
from vlmcp.estimate.peak import VISION_MODES

NAME = "hf-step"
STRATEGIES = ("replicate", "shard", "auto")
LOSSES = ("chunked", "full")


class _Stop(Exception):
    """Raised by the head's pre-hook once it has the last hidden states: no logits are computed."""


def last_hidden(model, batch) -> torch.Tensor:
    """This rank's ``(N, hidden)`` input of the LM head, without a graph and without the logits."""
    from vlmcp.hf.adapters import submodule
    from vlmcp.hf.parallel import parallel_state

    head = submodule(model, parallel_state(model).adapter.lm_head)
    seen = {}

    def keep(module, args):
        seen["h"] = args[0][0].detach()
        raise _Stop

    handle = head.register_forward_pre_hook(keep)
    try:
        with torch.no_grad():
            model(**batch.model_inputs)
    except _Stop:
        pass
    finally:
        handle.remove()
    return seen["h"]


def state_bytes(model) -> dict[str, int]:
    """Parameter, gradient and AdamW-state bytes of ``model`` (each distinct parameter once)."""
    params = {id(p): p for p in model.parameters()}.values()
    trained = [p for p in params if p.requires_grad]
    return {"params": sum(p.nbytes for p in params), "grads": sum(p.nbytes for p in trained),
            "adamw": 2 * sum(p.nbytes for p in trained)}


def _step(model, inputs, labels, cu, group, strategy, chunk, meter: bool):
    """One step; ``(saved bytes or None, batch, chosen strategy)``."""
    import vlmcp.hf

    model.zero_grad(set_to_none=True)
    m = SavedTensorMeter(model.parameters()) if meter else None
    if m is not None:
        m.__enter__()
    try:
        batch = vlmcp.hf.shard_inputs(model, inputs, group, labels=labels, cu_seqlens=cu,
                                      image_strategy=strategy)
        res = vlmcp.hf.causal_lm_loss(model, batch, group, chunk_size=chunk)
        res.loss.backward()
    finally:
        if m is not None:
            m.__exit__(None, None, None)
    vlmcp.reduce_gradients(model, group)
    return (None if m is None else m.bytes), batch, batch.shard.plan.image_strategy


def _timed(fn, repeats: int) -> tuple[list[float], list[float]]:
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _max_rel_error(got: dict, ref: dict) -> float:
    if got.keys() != ref.keys():
        missing = sorted(got.keys() ^ ref.keys())
        raise RuntimeError(f"gradients differ in which parameters have one: {missing}")
    return max(float((got[n] - ref[n]).norm() / ref[n].norm().clamp_min(1e-30)) for n in ref)


def _memory(model, batch, saved: int, chunk) -> dict:
    """This rank's memory terms (see the module docstring)."""
    from vlmcp.hf.adapters import submodule
    from vlmcp.hf.parallel import parallel_state

    head = submodule(model, parallel_state(model).adapter.lm_head)
    head_saved, transient = head_alone(last_hidden(model, batch), head.weight, batch.labels, chunk)
    out = dict(saved=saved, head_saved=head_saved, transient=transient, slots=batch.shard.num_tokens,
               targets=int((batch.labels != -100).sum()), **state_bytes(model))
    out["peak"] = saved + transient + out["params"] + out["grads"] + out["adamw"]
    return out


def _rank(group, samples, sizes, strategies, losses, chunk_size, vision_mode, repeats):
    import vlmcp.hf
    from vlmcp.debug.synthetic import synthetic_row

    P, rank = dist.get_world_size(group), dist.get_rank(group)
    base = bench_model(**sizes)
    inputs, labels, cu = synthetic_row(base, samples)
    out = {"tokens": int(inputs["input_ids"].shape[1]),
           "visual": int((inputs["mm_token_type_ids"] > 0).sum()), "rows": []}
    for loss in losses:
        chunk = chunk_size if loss == "chunked" else None
        single, ref = None, None
        if rank == 0:
            one = vlmcp.hf.parallelize(copy.deepcopy(base), None)
            saved, batch, _ = _step(one, inputs, labels, cu, None, "replicate", chunk, True)
            ref = _grads(one)
            single = _memory(one, batch, saved, chunk)
            single["wall"], single["cpu"] = _timed(
                lambda m=one, c=chunk: _step(m, inputs, labels, cu, None, "replicate", c, False), repeats)
            del one
        dist.barrier(group=group)
        for strategy in strategies:
            model = vlmcp.hf.parallelize(copy.deepcopy(base), group, vision_mode=vision_mode)
            saved, batch, chosen = _step(model, inputs, labels, cu, group, strategy, chunk, True)
            err = _max_rel_error(_grads(model), ref) if rank == 0 else None
            mine = _memory(model, batch, saved, chunk)
            walls, cpus = [], []
            for _ in range(repeats):
                dist.barrier(group=group)
                w, c = _timed(lambda m=model, s=strategy, k=chunk: _step(m, inputs, labels, cu, group, s, k,
                                                                          False), 1)
                walls.append(w[0])
                cpus.append(c[0])
            mine["wall"], mine["cpu"] = walls, cpus
            per_rank = [None] * P
            dist.all_gather_object(per_rank, mine, group=group)
            out["rows"].append(dict(loss=loss, strategy=strategy, chosen=chosen, single=single,
                                    ranks=per_rank, grad_err=err))
            del model
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cp", type=int, default=2, help="CP size P (default 2)")
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES),
                        help="image_strategy values (default replicate shard auto)")
    parser.add_argument("--loss", nargs="+", choices=LOSSES, default=list(LOSSES), dest="losses",
                        help="chunked (vlmcp.hf.causal_lm_loss) and/or full logits (default both)")
    parser.add_argument("--vision-mode", default="replicate", choices=VISION_MODES,
                        help="vision_mode of every run (default replicate)")
    parser.add_argument("--tokens", type=int, default=2048, help="row length (default 2048)")
    parser.add_argument("--images", type=int, default=2, help="samples, one image each (default 2)")
    parser.add_argument("--image-side", type=int, default=32,
                        help="patches per image side, even (default 32: 256 LLM tokens)")
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary (default 151936, Qwen's)")
    parser.add_argument("--hidden", type=int, default=256, help="LLM width (default 256)")
    parser.add_argument("--layers", type=int, default=2, help="LLM layers (default 2)")
    parser.add_argument("--vit-width", type=int, default=64, help="ViT width (default 64)")
    parser.add_argument("--vit-depth", type=int, default=1, help="ViT blocks (default 1)")
    parser.add_argument("--chunk-size", type=int, default=1024, help="chunked loss: targets per chunk "
                                                                     "(default 1024)")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per configuration (default 2)")


def row_samples(tokens: int, images: int, side: int) -> tuple:
    """``images`` samples of ``[prompt, image, text]`` in ``tokens`` tokens (Qwen-VL markers included)."""
    if images < 1 or side < 2 or side % 2:
        raise ValueError(f"--images must be >= 1 and --image-side even and >= 2, got {images}, {side}")
    per, image = tokens // images, side * side // 4
    text = per - image - 2
    if per * images != tokens or text < 8:
        raise ValueError(f"--tokens {tokens} must split into --images {images} equal samples of more than "
                         f"{image + 10} tokens (an image of {image} tokens, its 2 markers and text)")
    before = text // 8
    return tuple((before, (1, side, side), text - before) for _ in range(images))


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def run(args: argparse.Namespace) -> int:
    if needs_transformers(NAME):
        return 0
    if args.cp < 2 or args.repeats < 1 or args.chunk_size < 1:
        raise ValueError(f"--cp must be >= 2, --repeats and --chunk-size >= 1, got {args.cp}, "
                         f"{args.repeats}, {args.chunk_size}")
    samples = row_samples(args.tokens, args.images, args.image_side)
    sizes = dict(hidden=args.hidden, layers=args.layers, vit_width=args.vit_width, vit_depth=args.vit_depth,
                 vocab=args.vocab)
    res = bench_ranks(_rank, args.cp, samples, sizes, args.strategies, args.losses, args.chunk_size,
                      args.vision_mode, args.repeats, name="hf-step", timeout=3600)[0]
    print(f"Qwen2-VL LLM {args.hidden} x {args.layers} layers, vocabulary {args.vocab:,}, ViT "
          f"{args.vit_width} x {args.vit_depth}; one row of {res['tokens']:,} tokens "
          f"({res['visual']:,} image tokens in {args.images} samples); P={args.cp}, vision_mode "
          f"{args.vision_mode}, float32; median of {args.repeats}")
    print("| loss | image_strategy (chosen) | step one process | step P ranks | speed-up | efficiency | "
          "CPU s per rank | CPU speed-up | grad rel. err | busiest rank: saved | head+loss share | "
          "transient | params+grads+AdamW | peak | one process peak |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in res["rows"]:
        single, ranks = row["single"], row["ranks"]
        t1 = statistics.median(single["wall"])
        tp = statistics.median(max(r["wall"][i] for r in ranks) for i in range(args.repeats))
        busy = max(ranks, key=lambda r: r["saved"])
        cpu = ", ".join(f"{statistics.median(r['cpu']):.2f}" for r in ranks)
        cpu_up = statistics.median(single["cpu"]) / max(statistics.median(r["cpu"]) for r in ranks)
        states = busy["params"] + busy["grads"] + busy["adamw"]
        name = "chunked" + f" ({args.chunk_size})" if row["loss"] == "chunked" else "full logits"
        print(f"| {name} | {row['strategy']} ({row['chosen']}) | {t1:.2f} s | {tp:.2f} s | {t1 / tp:.2f}x | "
              f"{t1 / tp / args.cp:.0%} | {cpu} | {cpu_up:.2f}x | {row['grad_err']:.1e} | "
              f"{_mib(busy['saved'])} | "
              f"{busy['head_saved'] / busy['saved']:.1%} | {_mib(busy['transient'])} | {_mib(states)} | "
              f"{_mib(busy['peak'])} | {_mib(single['peak'])} |", flush=True)
    return 0
