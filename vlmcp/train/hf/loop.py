"""``vlmcp train --model DIR --data FILE.jsonl``'s loop, run on every rank of a DP x CP world.

Each step, every CP group takes ``--grad-accum`` packed rows (the global batch of D
replicas is the next ``D * grad_accum`` rows of the sequence; Note [vlmcp data: HF rows,
epochs and who decodes the images]), shards each with :func:`vlmcp.hf.shard_inputs`, and
runs the model's forward and
backward with the loss of :func:`vlmcp.hf.causal_lm_loss`: the LM head and the
cross-entropy a chunk of tokens at a time (``--loss full``: the model's logits and
:func:`vlmcp.cp_cross_entropy`), the forward's saved tensors on the host with
``--offload-activations``. Gradients are made exact by
:func:`vlmcp.reduce_gradients` (sum over CP, mean over DP; 16-bit gradients reduced in
fp32), or with ``--fsdp`` by FSDP2 over all D*P ranks with the loss scaled by P and
:func:`vlmcp.grads.finish_ddp_gradients` (Note [vlmcp gradient rules]).

One all-reduce per step over the world carries the loss, the squared gradient norms, the
token counts and the SIGTERM/SIGINT flags, so every rank takes the same decision: a
non-finite loss or gradient norm stops the run before the optimizer step and before any
save (the last good checkpoint stays the newest); otherwise the gradient is clipped to
``--max-grad-norm`` by that exact global norm (:mod:`vlmcp.train.hf.optim`) and AdamW
steps. A SIGTERM or a first Ctrl-C (SIGINT) on any rank finishes the step, saves a
checkpoint, and ends the run cleanly; a second Ctrl-C exits at once.

Note [vlmcp HF global batch: one normaliser]
--------------------------------------------
The loss of an optimizer step is the mean over the target tokens of its whole global
batch (D replicas x A accumulated rows), as Megatron's per-token loss and transformers'
``num_items_in_batch`` make it, so ``--dp 2`` and ``--grad-accum 2`` train identically::

    loss = sum_{d, a} sum_{t in row(d, a)} l_t / N,    N = sum_{d, a} n(d, a)

Each row's target count ``n(d, a)`` is read from its labels before any forward; one
all-reduce over the DP group gives N. Row ``(d, a)``'s loss from
:func:`vlmcp.hf.causal_lm_loss` is its CP group's mean, so it is backpropagated with the
weight ``n(d, a) * D / N``: the gradients accumulate over the A rows, and the DP mean
that :func:`vlmcp.reduce_gradients` (or FSDP) takes afterwards turns the D into the sum.
The reduction runs once per step, after the last row (it is linear, so reducing the
accumulated gradient is reducing each row's).

A conversation whose image fails to decode at training is left out of its row, the same
on every rank of the CP group (:func:`vlmcp.train.hf.agree.agree_on_skips`, before
sharding); the first rank of the group warns once per conversation, naming ``file:line``
and the image, and the summary counts them.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.data.hf.processor import load_processor
from vlmcp.data.hf.rows import DataIndex, HFRow, RowLoader
from vlmcp.grads import ddp_ignored_params, finish_ddp_gradients, reduce_gradients
from vlmcp.train.faults import stall_guard
from vlmcp.train.groups import dp_cp_groups
from vlmcp.train.hf.agree import DecodeSkips, agree_on_skips
from vlmcp.train.hf.checkpoint import load_hf_checkpoint, save_hf_checkpoint
from vlmcp.train.hf.config import HFTrainConfig
from vlmcp.train.hf.evaluate import evaluate, target_count
from vlmcp.train.hf.feedback import Feedback
from vlmcp.train.hf.final_model import save_trained_model
from vlmcp.train.hf.finetune import describe_trainable, prepare_model, without_input_grad_hooks
from vlmcp.train.hf.optim import clip_gradients, make_optimizer, part_of, squared_norms
from vlmcp.train.options import TORCH_DTYPES
from vlmcp.train.schedule import hf_lr_at
from vlmcp.train.stop import StopSignals, stop_signals

__all__ = ["load_parallel_model", "part_of", "train_hf_rank"]


def _fully_shard(model: nn.Module, world: int, device: torch.device) -> None:
    """FSDP2 over all ranks: each transformer block (``_no_split_modules``), then the root.

    ``hidden_shard``'s projector slice differs per CP rank, so it stays out of FSDP
    (``ddp_ignored_params``); :func:`vlmcp.grads.finish_ddp_gradients` averages it over DP.
    16-bit parameters reduce their gradients in fp32; fp32 and fp64 ones in their own dtype.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world,))
    sixteen = next(model.parameters()).dtype in (torch.bfloat16, torch.float16)
    policy = MixedPrecisionPolicy(reduce_dtype=torch.float32 if sixteen else None)
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


def _memory(device: torch.device) -> float:
    """This rank's peak memory so far: CUDA memory allocated, or on the CPU the process's peak resident
    set (model, optimizer and data included, so an upper bound on activations)."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    import resource

    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # KiB on Linux


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
        self.optimizer = make_optimizer(self.model, cfg.lr, cfg.weight_decay)
        self.start, self.position = (load_hf_checkpoint(cfg, self.model, self.optimizer, group, self.device)
                                     if cfg.resume else (0, 0))
        self.losses: list[float] = []
        self.tokens = self.targets = 0
        self.checkpoint: str | None = None
        self.decode_skips = DecodeSkips(index, warn=dist.get_rank(self.cp_group) == 0)

    def _weights(self, rows: list[HFRow]) -> tuple[list[int], float]:
        """Each row's target count and the global batch's N (Note [vlmcp HF global batch: one normaliser])."""
        counts = [target_count(row) for row in rows]
        total = torch.tensor([float(sum(counts))], dtype=torch.float64, device=self.device)
        dist.all_reduce(total, group=self.dp_group)
        return counts, float(total.item())

    def step(self, rows: list[HFRow], step: int, stop: StopSignals) -> tuple[torch.Tensor, dict]:
        """Forward and backward of this replica's rows of the global batch, exact gradients; one
        all-reduce of the step's figures.

        Returns:
            ``(norms of vision/projector/llm, stats)`` with the global batch's token-mean ``loss``,
            ``bad`` (some rank's loss was not finite), ``tokens``, ``target_tokens``, ``stop`` (some
            rank got a SIGTERM or SIGINT by now: read just before the all-reduce) and ``sigint``.
        """
        import vlmcp.hf

        cfg, model = self.cfg, self.model
        for g in self.optimizer.param_groups:
            g["lr"] = hf_lr_at(cfg, step)
        self.optimizer.zero_grad(set_to_none=True)
        counts, total = self._weights(rows)
        chunk = cfg.loss_chunk_size if cfg.loss == "chunked" else None
        loss_sum, bad = 0.0, False
        for row, n in zip(rows, counts, strict=True):
            inputs = {k: v.to(self.device) for k, v in row.inputs.items()}
            batch = vlmcp.hf.shard_inputs(model, inputs, self.cp_group, labels=row.labels.to(self.device),
                                          cu_seqlens=row.cu_seqlens, sample_placement=cfg.sample_placement,
                                          image_strategy=cfg.image_strategy)
            with vlmcp.hf.offload_activations() if cfg.offload_activations else contextlib.nullcontext():
                res = vlmcp.hf.causal_lm_loss(model, batch, self.cp_group, chunk_size=chunk)
            loss = res.loss * (n * cfg.dp / max(total, 1.0))
            if cfg.nan_at_step == step + 1 and self.rank == min(1, self.world - 1):
                loss = loss * float("nan")  # the test hook: one rank's loss goes bad
            bad = bad or not bool(torch.isfinite(loss.detach()))
            (loss * cfg.cp if cfg.fsdp else loss).backward()
            loss_sum += float(res.mean) * n
        if cfg.fsdp:
            finish_ddp_gradients(model, self.cp_group, self.dp_group)
        else:
            reduce_gradients(model, self.cp_group, self.dp_group)
        sq = squared_norms(model)  # summed over the world below: count each value once
        sq[:, 0] /= cfg.cp * cfg.dp
        sq[:, 1] /= cfg.dp
        every_cp_rank = 1.0 / cfg.cp  # the CP ranks of a replica hold the same rows
        stats = torch.cat([sq.flatten(), torch.tensor(
            [loss_sum * every_cp_rank, float(bad), sum(r.tokens for r in rows) * every_cp_rank,
             sum(counts) * every_cp_rank, float(stop.flag), float(stop.interrupted)], dtype=torch.float64)])
        stats = stats.to(self.device)
        dist.all_reduce(stats, group=self.group)
        stats = stats.cpu()
        norms = stats[:9].view(3, 3).sum(1).sqrt()
        return norms, {"loss": float(stats[9]) / max(total, 1.0), "bad": bool(stats[10] > 0),
                       "tokens": int(round(float(stats[11]))), "target_tokens": int(round(float(stats[12]))),
                       "stop": bool(stats[13] > 0), "sigint": bool(stats[14] > 0)}

    def peak_memory(self) -> float:
        """The busiest rank's peak memory so far (a MAX all-reduce)."""
        peak = torch.tensor([_memory(self.device)], dtype=torch.float64, device=self.device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=self.group)
        return float(peak.item())

    def save(self, done: int) -> None:
        self.checkpoint = str(save_hf_checkpoint(self.cfg, self.model, self.optimizer, done, self.position,
                                                 self.group, self.cp_group))


def train_hf_rank(group: dist.ProcessGroup, cfg: HFTrainConfig, index: DataIndex,
                  on_finish: Callable | None = None, eval_index: DataIndex | None = None) -> dict:
    """Run the whole training on this rank; returns a summary.

    Args:
        group: the world (DP x CP) group; the CP and DP groups are split from it.
        cfg: the run (``steps`` None: resolved from ``epochs``, :meth:`HFTrainConfig.with_steps`).
        index: the planned dataset (:func:`vlmcp.data.hf.rows.build_index`), the same on every rank.
        on_finish: tests: ``on_finish(model, processor, index, cp_group)`` after the last step;
            its result is the summary's ``"probe"``.
        eval_index: the planned ``--eval-data``, or None.

    Returns:
        ``start_step``, ``step`` (steps done), ``steps``, ``losses``, ``tokens``, ``target_tokens``,
        ``seconds``, ``stopped`` (None, ``"sigterm"``, ``"sigint"``, ``"nonfinite"`` or ``"no_targets"``),
        ``message``, ``checkpoint``, ``model_dir``, ``loss_curve`` (rank 0), ``probe``, ``peak_memory``
        (``bytes`` and ``kind`` of the busiest rank's peak), ``decode_skipped`` (a ``Skipped`` per
        conversation left out because an image failed to decode, all ranks'), ``evals`` (one
        ``{"step", "eval_loss", "eval_tokens", "eval_rows"}`` per evaluation).
    """
    cfg = cfg.with_steps(len(index.rows))
    with stop_signals() as stop:  # from the start: a SIGTERM while loading still ends with a checkpoint
        return _train(_Run(cfg, group, index), stop, on_finish, eval_index)


def _due(cfg: HFTrainConfig, done: int) -> bool:
    """Whether a checkpoint is due after step ``done`` (SIGTERM and SIGINT aside)."""
    saving = bool(cfg.checkpoint_dir or cfg.checkpoint_every)
    return saving and (done == cfg.steps or bool(cfg.checkpoint_every and done % cfg.checkpoint_every == 0))


def _train(run: _Run, stop: StopSignals, on_finish: Callable | None, eval_index: DataIndex | None) -> dict:
    cfg = run.cfg
    feedback = Feedback(cfg, run.start, enabled=run.rank == 0)
    loader = RowLoader(run.processor, run.index, seed=cfg.seed, dp=cfg.dp, dp_rank=run.dp_rank,
                       start=run.position, steps=(cfg.steps - run.start) * cfg.grad_accum)
    stopped = message = None
    evals: list[dict] = []
    done = run.start
    t_start = time.perf_counter()
    try:
        for step in range(run.start, cfg.steps):
            t0 = time.perf_counter()
            with stall_guard(f"step {step + 1}"):  # a timeout: one line naming the step
                rows = []
                for _ in range(cfg.grad_accum):
                    row = loader.next()
                    row = agree_on_skips(row, run.index.rows[row.index], loader.rebuild, run.cp_group,
                                         run.device)
                    run.decode_skips.note(row)
                    rows.append(row)
                norms, st = run.step(rows, step, stop)
            grad_norm = float(norms.pow(2).sum().sqrt())
            if st["bad"] or not bool(torch.isfinite(norms).all()):
                stopped = "nonfinite"
                message = (f"step {step + 1}: the loss ({float('nan') if st['bad'] else st['loss']:.4g}) or "
                           f"the gradient norm ({grad_norm:.4g}) is not finite; "
                           "stopped before the optimizer step, nothing saved; the last good checkpoint is "
                           f"{run.checkpoint or _newest(cfg)}")
                break
            clip_gradients(run.model, grad_norm, cfg.max_grad_norm)
            lr = run.optimizer.param_groups[0]["lr"]
            run.optimizer.step()
            done = step + 1
            run.position += cfg.rows_per_step
            run.losses.append(st["loss"])
            run.tokens += st["tokens"]
            run.targets += st["target_tokens"]
            seconds = time.perf_counter() - t0
            feedback.step({"step": done, "loss": st["loss"], "lr": lr, "grad_norm": grad_norm,
                           "grad_norm_vision": float(norms[0]), "grad_norm_projector": float(norms[1]),
                           "grad_norm_llm": float(norms[2]), "tokens": st["tokens"],
                           "target_tokens": st["target_tokens"], "tokens_per_second": st["tokens"] / seconds,
                           "memory_bytes": run.peak_memory(), "seconds": seconds})
            if eval_index is not None and cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
                with stall_guard(f"evaluation after step {done}"):
                    evals.append({"step": done, **evaluate(run, eval_index)})
                feedback.evaluation(done, evals[-1])
            if st["stop"] or _due(cfg, done):
                with stall_guard(f"checkpoint of step {done}"):
                    run.save(done)
            if st["stop"] and done < cfg.steps:  # in the last step: finish, the model is saved below
                stopped = "sigint" if st["sigint"] else "sigterm"
                message = (f"{stopped.upper()}: stopped after step {done} of {cfg.steps}, checkpoint "
                           f"{run.checkpoint}; continue with --resume")
                break
        if stopped is None and eval_index is not None:  # once at the end, always
            with stall_guard("the final evaluation"):
                evals.append({"step": done, **evaluate(run, eval_index)})
            feedback.evaluation(done, evals[-1])
    finally:
        loader.close()
        feedback.close()
    seconds = time.perf_counter() - t_start
    if stopped is None and done > run.start and run.targets == 0:
        stopped = "no_targets"
        message = (f"steps {run.start + 1}-{done} trained no target token (every conversation of their "
                   "rows was skipped, or none has a trained turn); the model is not saved")
    decode_skipped = run.decode_skips.gather(run.group)
    peak = {"bytes": int(run.peak_memory()),
            "kind": "GPU allocated" if run.device.type == "cuda" else "resident"}
    probe = on_finish(run.model, run.processor, run.index, run.cp_group) if on_finish is not None else None
    model_dir = None
    if stopped is None:
        with stall_guard("saving the model"):
            model_dir = str(save_trained_model(cfg, run.model, run.processor, run.group, run.cp_group))
    curve = None
    if feedback.metrics is not None and (run.losses or run.start):
        from vlmcp.report import plot_loss_curve  # matplotlib only at the end, on rank 0

        curve = str(plot_loss_curve(cfg.metrics_jsonl, Path(cfg.metrics_jsonl).with_suffix(".png")))
    return {"start_step": run.start, "step": done, "steps": cfg.steps, "losses": run.losses,
            "tokens": run.tokens, "target_tokens": run.targets, "seconds": seconds, "stopped": stopped,
            "message": message, "checkpoint": run.checkpoint, "model_dir": model_dir, "loss_curve": curve,
            "probe": probe, "decode_skipped": decode_skipped, "peak_memory": peak, "evals": evals}


def _newest(cfg: HFTrainConfig) -> str:
    from vlmcp.train.hf.checkpoint import latest_step

    found = latest_step(cfg.checkpoints, cfg.fsdp)
    if found is None:
        return "none"
    return str(cfg.checkpoints / (f"step_{found[0]:08d}" + ("" if cfg.fsdp else ".pt")))
