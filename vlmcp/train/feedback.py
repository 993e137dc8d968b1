"""What ``vlmcp train`` shows and records per step, on rank 0: the progress line, the metrics JSONL
(:mod:`vlmcp.report.metrics`) and, where the config names a TensorBoard directory
(``--report-to tensorboard``: ``OUT/tensorboard``), TensorBoard scalars. Every step's record
carries the loss, the learning rate, the global gradient norm (before clipping) and each
part's, the tokens and target tokens, tokens per second and the busiest rank's peak memory;
an evaluation adds ``eval_loss``.
"""

from __future__ import annotations

from vlmcp.report.metrics import MetricsWriter
from vlmcp.train.progress import ProgressBar

__all__ = ["Feedback"]


class Feedback:
    """Rank 0's progress line, metrics file and TensorBoard writer; on other ranks every call is a no-op.

    Args:
        cfg: the run (a :class:`~vlmcp.train.config.TrainConfig`, steps resolved).
        start: steps done before this process (a resumed run keeps its records up to there).
        enabled: rank 0.
    """

    def __init__(self, cfg, start: int, enabled: bool) -> None:
        self.enabled = enabled
        self.metrics = self.board = None
        if enabled and cfg.metrics_jsonl:
            self.metrics = MetricsWriter(cfg.metrics_jsonl, resume_step=start if cfg.resume else None)
        if enabled and cfg.tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            purge = start + 1 if cfg.resume else None  # a resumed run replaces the steps after its checkpoint
            self.board = SummaryWriter(str(cfg.tensorboard_dir), purge_step=purge)
        self.bar = ProgressBar(cfg.steps, initial=start, enabled=enabled, log_every=cfg.log_every or None)

    def step(self, record: dict) -> None:
        """One optimizer step's record (:data:`vlmcp.report.metrics.METRIC_FIELDS` and more)."""
        if not self.enabled:
            return
        memory = record["memory_bytes"] / 2**30
        self.bar.update(record["step"], loss=record["loss"], tokens=record["tokens"],
                        extra=f"lr {record['lr']:.2e}  grad {record['grad_norm']:.3g}  mem {memory:.2f} GiB")
        if self.metrics is not None:
            self.metrics.write(record)
        if self.board is not None:
            for key, value in record.items():
                if key != "step" and value is not None:
                    self.board.add_scalar(f"train/{key}", value, record["step"])

    def evaluation(self, step: int, result: dict) -> None:
        """An evaluation's result after ``step`` steps (:func:`vlmcp.train.evaluate.evaluate`)."""
        if not self.enabled:
            return
        self.bar.note(f"vlmcp train: step {step}: eval loss {result['eval_loss']:.4f} over "
                      f"{result['eval_tokens']:,} target tokens ({result['eval_rows']} rows)")
        if self.metrics is not None:
            self.metrics.write_eval({"step": step, **result})
        if self.board is not None:
            self.board.add_scalar("eval/loss", result["eval_loss"], step)

    def close(self) -> None:
        if not self.enabled:
            return
        self.bar.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.board is not None:
            self.board.close()
