"""The reference VLM's side of ``vlmcp train`` before and after its ranks run (on the launcher).

Its config is checked whole at construction (the built-in data needs nothing read), so the
launcher only names the run and reports it.
"""

from __future__ import annotations

import os
import sys

from vlmcp.train.specs.reference.config import ReferenceTrainConfig
from vlmcp.train.specs.reference.spec import ReferenceSpec

__all__ = ["CONFIG", "announce", "config_values", "finished", "outputs", "prepare", "record_dir", "report"]

CONFIG = ReferenceTrainConfig


def config_values(values: dict) -> dict:
    """The config's fields from the flags given (each flag is its field, as given)."""
    return values


def outputs(cfg: ReferenceTrainConfig) -> list:
    """Places the run writes besides its checkpoints and metrics: none."""
    return []


def prepare(cfg: ReferenceTrainConfig, say) -> ReferenceSpec:
    """The spec the ranks run."""
    return ReferenceSpec(cfg)


def finished(cfg: ReferenceTrainConfig) -> bool:
    """A checkpoint at ``--steps`` is the whole output."""
    return True


def record_dir(cfg: ReferenceTrainConfig):
    """No output directory holds the resolved configuration (its checkpoints hold the config)."""
    return None


def announce(spec: ReferenceSpec, say, spawning: bool) -> None:
    if spawning:
        cfg = spec.cfg
        say(f"vlmcp train: spawning {cfg.world_size} gloo ranks (cp={cfg.cp}, dp={cfg.dp}, "
            f"{max(1, (os.cpu_count() or 1) // cfg.world_size)} thread(s) each), {cfg.steps} steps of "
            f"{cfg.seq_len} tokens, vision_mode={cfg.vision_mode}, attention={cfg.attention}")


def report(spec: ReferenceSpec, s: dict) -> int:
    """Print the run's summary ``s``; returns the exit code."""
    cfg, losses = spec.cfg, s["losses"]
    if s["message"]:
        print(f"vlmcp train: {s['message']}", file=sys.stderr if s["stopped"] == "nonfinite" else sys.stdout)
    if losses:
        print(f"vlmcp train: steps {s['start_step'] + 1}-{s['step']}, "
              f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if cfg.image_strategy == "auto":
        picks = s["image_strategies"]
        print(f"vlmcp train: image_strategy=auto chose replicate for {picks.count('replicate')} "
              f"and shard for {picks.count('shard')} of DP replica 0's {len(picks)} rows")
    if s["evals"]:
        last = s["evals"][-1]
        print(f"vlmcp train: eval loss {last['eval_loss']:.4f} after step {last['step']} over "
              f"{last['eval_tokens']:,} target tokens ({last['eval_rows']} held-out rows)")
    if s["loss_curve"]:
        print(f"vlmcp train: loss curve written to {s['loss_curve']}")
    return {"nonfinite": 1, "sigint": 130}.get(s["stopped"], 0)
