"""``vlmcp train``'s one loop, run on every rank of a DP x CP world, for any spec.

:func:`train_rank` takes a :class:`~vlmcp.train.spec.TrainSpec` (the reference VLM's, or a Hugging
Face model directory's) and runs, on every rank::

    groups, stop signals            dp_cp_groups; SIGTERM / SIGINT only set a flag (vlmcp.train.stop)
    spec.build, optimizer, parts    the model parallelized, its optimizer, its parts for the norms
    resume                          the newest good checkpoint, the same on every rank
    for each step:
        batch                       the spec's rows of this replica (spec.batches)
        train_step                  lr, normaliser, backward, reduction, the one all-reduce
        non-finite?                 stop before the optimizer step, nothing saved
        clip, optimizer.step        by the exact global norm (vlmcp.train.optim)
        feedback, eval, checkpoint  rank 0's progress and metrics; --eval-every; --checkpoint-every
        SIGTERM / SIGINT?           every rank saw the flag in the same all-reduce: save and stop
    final eval, spec.finish         the held-out loss at the end; the final save; the summary

Every decision is taken from the step's all-reduced figures, the same on every rank, so every rank
stops after the same step. Nothing random happens after initialization (no dropout; the data is a
function of the data position), so a resumed run on CPU reproduces the uninterrupted one exactly.
A collective that times out ends the rank with one line naming the step (Note [vlmcp stalled
peers and orphaned ranks]).
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from vlmcp.train.checkpoint.run import latest_step, load_run_checkpoint, save_run_checkpoint
from vlmcp.train.evaluate import evaluate
from vlmcp.train.faults import stall_guard
from vlmcp.train.feedback import Feedback
from vlmcp.train.groups import dp_cp_groups
from vlmcp.train.optim import clip_gradients
from vlmcp.train.spec import Batch, Groups, TrainSpec
from vlmcp.train.step import StepResult, train_step
from vlmcp.train.stop import StopSignals, stop_signals

__all__ = ["train_rank"]


def train_rank(group: dist.ProcessGroup, spec: TrainSpec) -> dict:
    """Run the whole training of ``spec`` on this rank; returns a summary.

    Args:
        group: the world (DP x CP) group; the CP and DP groups are split from it.
        spec: the model family and its run (``spec.cfg``, steps resolved).

    Returns:
        ``start_step``, ``step`` (steps done), ``steps``, ``losses``, ``tokens``, ``target_tokens``,
        ``seconds``, ``stopped`` (None, ``"sigterm"``, ``"sigint"``, ``"nonfinite"`` or ``"no_targets"``),
        ``message`` (the line saying why it stopped), ``checkpoint`` (the last one written), ``loss_curve``
        (rank 0), ``peak_memory`` (``bytes`` and ``kind`` of the busiest rank's peak), ``evals`` (one
        ``{"step", "eval_loss", "eval_tokens", "eval_rows"}`` per evaluation), and the spec's own
        entries (:meth:`~vlmcp.train.spec.TrainSpec.finish`).

    Raises:
        vlmcp.train.faults.CollectiveTimeout: a peer did not answer within ``cfg.timeout``.
    """
    cfg = spec.cfg
    if dist.get_world_size(group) != cfg.world_size:
        raise ValueError(f"--cp {cfg.cp} x --dp {cfg.dp} = {cfg.world_size}, but the group has "
                         f"{dist.get_world_size(group)} ranks")
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" \
        else torch.device("cpu")
    groups = Groups(group, *dp_cp_groups(group, cfg.cp, timedelta(seconds=cfg.timeout)), device)
    with stop_signals() as stop:  # from the start: a SIGTERM while loading still ends with a checkpoint
        return _Trainer(spec, groups, stop).run()


def _memory(device: torch.device) -> float:
    """This rank's peak memory so far: CUDA memory allocated, or on the CPU the process's peak resident
    set (model, optimizer and data included, so an upper bound on activations)."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    import resource

    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # KiB on Linux


class _Trainer:
    """What the loop carries: the spec, its model and optimizer, and the run's running totals."""

    def __init__(self, spec: TrainSpec, groups: Groups, stop: StopSignals) -> None:
        self.spec, self.cfg, self.groups, self.stop = spec, spec.cfg, groups, stop
        self.built = spec.build(groups)
        self.model = self.built.model
        self.optimizer = spec.optimizer(self.model)
        self.parts = spec.parts(self.model)
        self.start, self.position = (load_run_checkpoint(self.cfg, self.model, self.optimizer, groups.world,
                                                         groups.device) if self.cfg.resume else (0, 0))
        self.done = self.start
        self.losses: list[float] = []
        self.tokens = self.targets = 0
        self.checkpoint: str | None = None
        self.evals: list[dict] = []
        self.stopped: str | None = None
        self.message: str | None = None
        self.feedback = Feedback(self.cfg, self.start, enabled=dist.get_rank(groups.world) == 0)

    def run(self) -> dict:
        t_start = time.perf_counter()
        batches = self.spec.batches(self.groups, self.start, self.position)
        try:
            steps = iter(batches)
            for step in range(self.start, self.cfg.steps):
                if not self._step(step, steps):
                    break
            if self.stopped is None:
                self._evaluate("the final evaluation")  # once at the end, always
        finally:
            batches.close()
            self.feedback.close()
        return self._summary(time.perf_counter() - t_start)

    def _step(self, step: int, steps) -> bool:
        """Optimizer step ``step`` (0-based) and what follows it; False: the run stops here."""
        t0 = time.perf_counter()
        with stall_guard(f"step {step + 1}"):  # a timeout: one line naming the step
            batch: Batch = next(steps)
            res = train_step(self.spec, self.built, self.optimizer, self.parts, batch, step, self.groups,
                             self.stop)
        if not res.finite:
            self._stop("nonfinite", self._nonfinite(step, res))
            return False
        clip_gradients(self.model, res.grad_norm, self.cfg.max_grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.done, self.position = step + 1, batch.position
        self.losses.append(res.loss)
        self.tokens, self.targets = self.tokens + res.tokens, self.targets + res.targets
        self._record(res, lr, time.perf_counter() - t0)
        if self.cfg.eval_every and self.done % self.cfg.eval_every == 0 and self.done < self.cfg.steps:
            self._evaluate(f"evaluation after step {self.done}")
        if (res.stop and self.cfg.checkpoints is not None) or self._due():
            with stall_guard(f"checkpoint of step {self.done}"):
                self.checkpoint = str(save_run_checkpoint(self.cfg, self.model, self.optimizer, self.done,
                                                          self.position, self.groups.world, self.groups.cp))
        if res.stop and self.done < self.cfg.steps:  # in the last step: finish, the end is saved below
            kind = "sigint" if res.sigint else "sigterm"
            where = f"checkpoint {Path(self.checkpoint).name}; continue with --resume" if self.checkpoint \
                else "no --checkpoint-dir, nothing saved"
            self._stop(kind, f"{kind.upper()}: stopped after step {self.done} of {self.cfg.steps}, {where}")
            return False
        return True

    def _due(self) -> bool:
        """Whether a checkpoint is due after this step (SIGTERM and SIGINT aside)."""
        cfg, done = self.cfg, self.done
        return cfg.saves_checkpoints and (done == cfg.steps or
                                          bool(cfg.checkpoint_every and done % cfg.checkpoint_every == 0))

    def _stop(self, kind: str, message: str) -> None:
        self.stopped, self.message = kind, message

    def _nonfinite(self, step: int, res: StepResult) -> str:
        newest = "none"
        if self.checkpoint is not None:
            newest = self.checkpoint
        elif self.cfg.checkpoints is not None:
            found = latest_step(self.cfg.checkpoints, self.cfg.dcp_checkpoints)
            if found is not None:
                newest = str(self.cfg.checkpoints / (f"step_{found[0]:08d}"
                                                     + ("" if self.cfg.dcp_checkpoints else ".pt")))
        loss = res.loss if res.loss_finite else float("nan")
        return (f"step {step + 1}: the loss ({loss:.4g}) or the gradient norm ({res.grad_norm:.4g}) is not "
                "finite; stopped before the optimizer step, nothing saved; the last good checkpoint is "
                f"{newest}")

    def _record(self, res: StepResult, lr: float, seconds: float) -> None:
        self.feedback.step({
            "step": self.done, "loss": res.loss, "lr": lr, "grad_norm": res.grad_norm,
            **{f"grad_norm_{part}": norm for part, norm in res.part_norms.items()},
            "tokens": res.tokens, "target_tokens": res.targets, "tokens_per_second": res.tokens / seconds,
            "memory_bytes": self._peak_memory(), "seconds": seconds})

    def _evaluate(self, what: str) -> None:
        if not self.spec.eval_rows():
            return
        with stall_guard(what):
            self.evals.append({"step": self.done, **evaluate(self.spec, self.model, self.groups)})
        self.feedback.evaluation(self.done, self.evals[-1])

    def _peak_memory(self) -> float:
        """The busiest rank's peak memory so far (a MAX all-reduce)."""
        peak = torch.tensor([_memory(self.groups.device)], dtype=torch.float64, device=self.groups.device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=self.groups.world)
        return float(peak.item())

    def _summary(self, seconds: float) -> dict:
        if self.stopped is None and self.done > self.start and self.targets == 0:
            self._stop("no_targets", f"steps {self.start + 1}-{self.done} trained no target token (every "
                                     "conversation of their rows was skipped, or none has a trained turn); "
                                     "the model is not saved")
        peak = {"bytes": int(self._peak_memory()),
                "kind": "GPU allocated" if self.groups.device.type == "cuda" else "resident"}
        own = self.spec.finish(self.model, self.groups, self.stopped)
        curve = None
        if self.feedback.metrics is not None and (self.losses or self.start):
            from vlmcp.report import plot_loss_curve  # matplotlib only at the end, on rank 0

            curve = str(plot_loss_curve(self.cfg.metrics_jsonl, self.cfg.loss_curve_png))
        return {"start_step": self.start, "step": self.done, "steps": self.cfg.steps, "losses": self.losses,
                "tokens": self.tokens, "target_tokens": self.targets, "seconds": seconds,
                "stopped": self.stopped, "message": self.message, "checkpoint": self.checkpoint,
                "loss_curve": curve, "peak_memory": peak, "evals": self.evals, **own}
