"""``vlmcp train --model DIR --data FILE.jsonl``'s loop, run on every rank of a DP x CP world.

Each step, every CP group takes one packed row (DP replicas take consecutive rows of
the same sequence; Note [vlmcp data: HF rows, epochs and who decodes the images]),
shards it with :func:`vlmcp.hf.shard_inputs`, and runs the model's forward and
backward with the loss of :func:`vlmcp.hf.causal_lm_loss`: the LM head and the
cross-entropy a chunk of tokens at a time (``--loss full``: the model's logits and
:func:`vlmcp.cp_cross_entropy`), the forward's saved tensors on the host with
``--offload-activations``. Gradients are made exact by
:func:`vlmcp.reduce_gradients` (sum over CP, mean over DP; 16-bit gradients reduced in
fp32), or with ``--fsdp`` by FSDP2 over all D*P ranks with the loss scaled by P and
:func:`vlmcp.grads.finish_ddp_gradients` (Note [vlmcp gradient rules]).

One all-reduce per step over the world carries the loss, the gradient norm's
finiteness, the real token count and the SIGTERM flag, so every rank takes the same
decision: a non-finite loss or gradient norm stops the run before the optimizer step
and before any save (the last good checkpoint stays the newest); a SIGTERM on any rank
finishes the step, saves a checkpoint, and ends the run cleanly.

A conversation whose image fails to decode at training is left out of its row, the same
on every rank of the CP group (:func:`vlmcp.train.hf.agree.agree_on_skips`, before
sharding); the first rank of the group warns once per conversation, naming ``file:line``
and the image, and the summary counts them.
"""

from __future__ import annotations

import contextlib
import hashlib
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.data.hf.processor import load_processor
from vlmcp.data.hf.rows import DataIndex, RowLoader
from vlmcp.grads import GradRule, ddp_ignored_params, finish_ddp_gradients, grad_rule, reduce_gradients
from vlmcp.report.metrics import MetricsWriter
from vlmcp.train.faults import stall_guard
from vlmcp.train.groups import dp_cp_groups
from vlmcp.train.hf.agree import DecodeSkips, agree_on_skips
from vlmcp.train.hf.checkpoint import load_hf_checkpoint, save_hf_checkpoint
from vlmcp.train.hf.config import HFTrainConfig
from vlmcp.train.hf.final_model import save_trained_model
from vlmcp.train.hf.finetune import (
    describe_trainable,
    prepare_model,
    trainable_parameters,
    without_input_grad_hooks,
)
from vlmcp.train.options import TORCH_DTYPES
from vlmcp.train.progress import ProgressBar
from vlmcp.train.schedule import lr_at

__all__ = ["load_parallel_model", "part_of", "train_hf_rank"]
def part_of(name: str) -> str:
    """``vision``, ``projector`` or ``llm``: which part of a HF VLM a parameter belongs to."""
    if "merger" in name or "multi_modal_projector" in name:
        return "projector"
    if "visual" in name or "vision_tower" in name:
        return "vision"
    return "llm"


def _fully_shard(model: nn.Module, world: int, device: torch.device) -> None:
    """FSDP2 over all ranks: each transformer block (``_no_split_modules``), then the root.

    ``hidden_shard``'s projector slice differs per CP rank, so it stays out of FSDP
    (``ddp_ignored_params``); :func:`vlmcp.grads.finish_ddp_gradients` averages it over DP.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world,))
    policy = MixedPrecisionPolicy(reduce_dtype=torch.float32)  # bf16 parameters, fp32 reduction
    names = set(ddp_ignored_params(model))
    ignored = {p for n, p in model.named_parameters() if n in names}
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params=ignored or None)


def load_parallel_model(cfg: HFTrainConfig, cp_group, world: int, device: torch.device) -> nn.Module:
    """The model of ``cfg.model`` in ``cfg.dtype`` on ``device``, parallelized (and FSDP-sharded)."""
    from transformers import AutoModelForImageTextToText
    from transformers.utils import logging as hf_logging

    import vlmcp.hf

    hf_logging.disable_progress_bar()  # one progress bar per run (rank 0's), not one per rank and file
    model = AutoModelForImageTextToText.from_pretrained(cfg.model, dtype=TORCH_DTYPES[cfg.dtype])
    model = prepare_model(cfg, model).to(device)  # --freeze, --lora
    model.train()
    if cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        without_input_grad_hooks(model)
    vlmcp.hf.parallelize(model, cp_group, attention=cfg.attention, vision_mode=cfg.vision_mode)
    if cfg.fsdp:
        _fully_shard(model, world, device)
    return model


def _squared_norms(model: nn.Module) -> torch.Tensor:
    """``[vision, projector, llm]`` squared norms of this rank's gradients, in three columns by
    how a gradient is laid out after the reduction: the same on every rank, a ``hidden_shard``
    slice (the same on every DP rank), or an FSDP shard (one per rank)."""
    from torch.distributed.tensor import DTensor

    sq = torch.zeros(3, 3, dtype=torch.float64)
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if isinstance(p.grad, DTensor):
            g, col = p.grad.to_local(), 2
        else:
            g, col = p.grad, int(grad_rule(p) is GradRule.PARTITIONED)
        sq[("vision", "projector", "llm").index(part_of(name)), col] += g.detach().double().pow(2).sum().cpu()
    return sq


def _check_same_plan(index: DataIndex, group: dist.ProcessGroup, device: torch.device) -> None:
    """Every rank must have planned the same rows (under torchrun each rank reads --data itself)."""
    digest = hashlib.sha256(repr((index.lengths, index.rows, index.seq_len)).encode()).digest()
    mine = torch.tensor([float(int.from_bytes(digest[:6], "big"))], dtype=torch.float64, device=device)
    lo, hi = mine.clone(), mine.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
    if lo != hi:
        raise ValueError("ranks planned different rows from --data: is it the same file (and are the "
                         "images the same) on every node?")


class _Run:
    """What the step loop carries: the model, its groups and the run's running totals."""

    def __init__(self, cfg: HFTrainConfig, group: dist.ProcessGroup, index: DataIndex) -> None:
        self.cfg, self.group, self.index = cfg, group, index
        self.world = dist.get_world_size(group)
        if self.world != cfg.world_size:
            raise ValueError(f"--cp {cfg.cp} x --dp {cfg.dp} = {cfg.world_size}, but the group has "
                             f"{self.world} ranks")
        self.device = torch.device("cuda", torch.cuda.current_device()) \
            if dist.get_backend(group) == "nccl" else torch.device("cpu")
        self.cp_group, self.dp_group = dp_cp_groups(group, cfg.cp)
        self.rank, self.dp_rank = dist.get_rank(group), dist.get_rank(self.dp_group)
        _check_same_plan(index, group, self.device)
        self.processor = load_processor(cfg.model)
        self.model = load_parallel_model(cfg, self.cp_group, self.world, self.device)
        trainable = describe_trainable(cfg, self.model)
        if trainable and self.rank == 0:
            print(trainable, flush=True)
        self.optimizer = torch.optim.AdamW(trainable_parameters(self.model), lr=cfg.lr, weight_decay=0.0)
        self.start, self.position = (load_hf_checkpoint(cfg, self.model, self.optimizer, group, self.device)
                                     if cfg.resume else (0, 0))
        self.losses: list[float] = []
        self.tokens = 0
        self.checkpoint: str | None = None
        self.decode_skips = DecodeSkips(index, warn=dist.get_rank(self.cp_group) == 0)

    def step(self, row, step: int, term: dict) -> tuple[torch.Tensor, dict]:
        """Forward, backward and exact gradients of one row; one all-reduce of the step's stats.

        Returns:
            ``(norms of vision/projector/llm, stats)`` with the DP-mean ``loss``, ``bad``
            (some rank's loss was not finite), ``tokens`` and ``sigterm`` (some rank got one
            by now: ``term["flag"]`` is read just before the all-reduce).
        """
        import vlmcp.hf

        cfg, model = self.cfg, self.model
        inputs = {k: v.to(self.device) for k, v in row.inputs.items()}
        for g in self.optimizer.param_groups:
            g["lr"] = lr_at(cfg, step)
        self.optimizer.zero_grad(set_to_none=True)
        batch = vlmcp.hf.shard_inputs(model, inputs, self.cp_group, labels=row.labels.to(self.device),
                                      cu_seqlens=row.cu_seqlens, sample_placement=cfg.sample_placement,
                                      image_strategy=cfg.image_strategy)
        chunk = cfg.loss_chunk_size if cfg.loss == "chunked" else None
        with vlmcp.hf.offload_activations() if cfg.offload_activations else contextlib.nullcontext():
            res = vlmcp.hf.causal_lm_loss(model, batch, self.cp_group, chunk_size=chunk)
        loss = res.loss
        if cfg.nan_at_step == step + 1 and self.rank == min(1, self.world - 1):
            loss = loss * float("nan")  # the test hook: one rank's loss goes bad
        if cfg.fsdp:
            (loss * cfg.cp).backward()
            finish_ddp_gradients(model, self.cp_group, self.dp_group)
        else:
            loss.backward()
            reduce_gradients(model, self.cp_group, self.dp_group)
        sq = _squared_norms(model)  # summed over the world below: count each value once
        sq[:, 0] /= cfg.cp * cfg.dp
        sq[:, 1] /= cfg.dp
        local_bad = float(not bool(torch.isfinite(loss.detach())))
        stats = torch.cat([sq.flatten(), torch.tensor(
            [float(res.mean), local_bad, row.tokens / cfg.cp, float(term["flag"])], dtype=torch.float64)])
        stats = stats.to(self.device)
        dist.all_reduce(stats, group=self.group)
        stats = stats.cpu()
        norms = stats[:9].view(3, 3).sum(1).sqrt()
        return norms, {"loss": float(stats[9]) / self.world, "bad": bool(stats[10] > 0),
                       "tokens": int(round(float(stats[11]))), "sigterm": bool(stats[12] > 0)}

    def save(self, done: int) -> None:
        self.checkpoint = str(save_hf_checkpoint(self.cfg, self.model, self.optimizer, done, self.position,
                                                 self.group, self.cp_group))


def train_hf_rank(group: dist.ProcessGroup, cfg: HFTrainConfig, index: DataIndex,
                  on_finish: Callable | None = None) -> dict:
    """Run the whole training on this rank; returns a summary.

    Args:
        group: the world (DP x CP) group; the CP and DP groups are split from it.
        cfg: the run.
        index: the planned dataset (:func:`vlmcp.data.hf.rows.build_index`), the same on every rank.
        on_finish: tests: ``on_finish(model, processor, index, cp_group)`` after the last step;
            its result is the summary's ``"probe"``.

    Returns:
        ``start_step``, ``step`` (steps done), ``losses``, ``tokens``, ``seconds``,
        ``stopped`` (None, ``"sigterm"`` or ``"nonfinite"``), ``message``, ``checkpoint``,
        ``model_dir``, ``loss_curve`` (rank 0), ``probe``, ``peak_memory`` (``bytes`` and
        ``kind`` of the busiest rank's peak), ``decode_skipped`` (a
        ``Skipped`` per conversation left out because an image failed to decode, all ranks').
    """
    term = {"flag": False}  # from the start: a SIGTERM while loading still ends with a checkpoint
    previous = signal.signal(signal.SIGTERM, lambda *_: term.__setitem__("flag", True))
    try:
        return _train(_Run(cfg, group, index), term, on_finish)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _train(run: _Run, term: dict, on_finish: Callable | None) -> dict:
    cfg = run.cfg
    metrics = None
    if run.rank == 0 and cfg.metrics_jsonl:
        metrics = MetricsWriter(cfg.metrics_jsonl, resume_step=run.start if cfg.resume else None)
    bar = ProgressBar(cfg.steps, initial=run.start, enabled=run.rank == 0)
    loader = RowLoader(run.processor, run.index, seed=cfg.seed, dp=cfg.dp, dp_rank=run.dp_rank,
                       start=run.position, steps=cfg.steps - run.start)
    saving = bool(cfg.checkpoint_dir or cfg.checkpoint_every)
    stopped = message = None
    done = run.start
    t_start = time.perf_counter()
    try:
        for step in range(run.start, cfg.steps):
            t0 = time.perf_counter()
            with stall_guard(f"step {step + 1}"):  # a timeout: one line naming the step
                row = loader.next()
                row = agree_on_skips(row, run.index.rows[row.index], loader.rebuild, run.cp_group, run.device)
                run.decode_skips.note(row)
                norms, st = run.step(row, step, term)
            if st["bad"] or not bool(torch.isfinite(norms).all()):
                stopped = "nonfinite"
                message = (f"step {step + 1}: the loss ({float('nan') if st['bad'] else st['loss']:.4g}) or "
                           f"the gradient norm ({float(norms.pow(2).sum().sqrt()):.4g}) is not finite; "
                           "stopped before the optimizer step, nothing saved; the last good checkpoint is "
                           f"{run.checkpoint or _newest(cfg)}")
                break
            run.optimizer.step()
            done = step + 1
            run.position += cfg.dp
            run.losses.append(st["loss"])
            run.tokens += st["tokens"]
            bar.update(done, loss=st["loss"], tokens=st["tokens"])
            if metrics is not None:
                metrics.write({"step": done, "loss": st["loss"], "grad_norm_vision": float(norms[0]),
                               "grad_norm_projector": float(norms[1]), "grad_norm_llm": float(norms[2]),
                               "tokens": st["tokens"], "seconds": time.perf_counter() - t0})
            if st["sigterm"] or (saving and (done == cfg.steps or
                                             (cfg.checkpoint_every and done % cfg.checkpoint_every == 0))):
                with stall_guard(f"checkpoint of step {done}"):
                    run.save(done)
            if st["sigterm"] and done < cfg.steps:  # in the last step: finish, the model is saved below
                stopped = "sigterm"
                message = (f"SIGTERM: stopped after step {done} of {cfg.steps}, checkpoint {run.checkpoint}; "
                           "continue with --resume")
                break
    finally:
        loader.close()
        bar.close()
        if metrics is not None:
            metrics.close()
    seconds = time.perf_counter() - t_start
    decode_skipped = run.decode_skips.gather(run.group)
    peak = _peak_memory(run.device, run.group)
    probe = on_finish(run.model, run.processor, run.index, run.cp_group) if on_finish is not None else None
    model_dir = None
    if stopped is None:
        with stall_guard("saving the model"):
            model_dir = str(save_trained_model(cfg, run.model, run.processor, run.group, run.cp_group))
    curve = None
    if metrics is not None and (run.losses or run.start):
        from vlmcp.report import plot_loss_curve  # matplotlib only at the end, on rank 0

        curve = str(plot_loss_curve(cfg.metrics_jsonl, Path(cfg.metrics_jsonl).with_suffix(".png")))
    return {"start_step": run.start, "step": done, "steps": cfg.steps, "losses": run.losses,
            "tokens": run.tokens, "seconds": seconds, "stopped": stopped, "message": message,
            "checkpoint": run.checkpoint, "model_dir": model_dir, "loss_curve": curve, "probe": probe,
            "decode_skipped": decode_skipped, "peak_memory": peak}


def _peak_memory(device: torch.device, group: dist.ProcessGroup) -> dict:
    """The busiest rank's peak memory: CUDA memory allocated, or on the CPU the process's peak
    resident set (model, optimizer and data included, so an upper bound on activations)."""
    if device.type == "cuda":
        kind, used = "GPU allocated", torch.cuda.max_memory_allocated(device)
    else:
        import resource

        kind, used = "resident", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    peak = torch.tensor([float(used)], dtype=torch.float64, device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    return {"bytes": int(peak.item()), "kind": kind}


def _newest(cfg: HFTrainConfig) -> str:
    from vlmcp.train.hf.checkpoint import latest_step

    found = latest_step(cfg.checkpoints, cfg.fsdp)
    if found is None:
        return "none"
    return str(cfg.checkpoints / (f"step_{found[0]:08d}" + ("" if cfg.fsdp else ".pt")))
