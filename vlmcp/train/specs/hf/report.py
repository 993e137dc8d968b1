"""What ``vlmcp train --model`` tells about its data and its run: the conversations left out, by
cause, in the plan line and the final summary, and the summary itself (rank 0, after the run)."""

from __future__ import annotations

import sys

from vlmcp.train.specs.hf.config import HFTrainConfig

__all__ = ["has_videos", "print_summary", "skips_line"]


def has_videos(index) -> bool:
    """Whether the data has videos (kept, or skipped at planning for one)."""
    return any(c.videos for c in index.conversations) or \
        any(s.reason.startswith(("cannot read video", "cannot sample video")) for s in index.unreadable)


def _where(skips, most: int = 5) -> str:
    if not skips:
        return ""
    names = ", ".join(s.where for s in skips[:most])
    return f" ({names}{', ...' if len(skips) > most else ''})"


def skips_line(cfg: HFTrainConfig, index, decode_skipped=None) -> str:
    """How many conversations are (or were) left out, by cause, and the turns a format dropped."""
    media = "image or video" if has_videos(index) else "image"
    causes = [(f"longer than --seq-len {cfg.seq_len}", index.too_long),
              (f"with an unreadable {media}", index.unreadable)]
    if decode_skipped is not None:
        causes.append((f"whose {media} failed to decode in training", decode_skipped))
    causes.append(("by a format rule", index.format_skipped))
    named = decode_skipped is not None  # the final summary names them; the plan line counts them
    parts = [f"{len(skips)} {what}{_where(skips) if named else ''}" for what, skips in causes]
    cut = f"; conversations cut at --seq-len: {sum(c is not None for c in index.cuts)}" \
        if cfg.truncate else ""
    return (f"conversations skipped: {', '.join(parts)}; turns dropped by a format rule: "
            f"{index.dropped_turns}{cut}")


def _peak(peak: dict | None) -> str:
    """``, peak memory 1.23 GiB per rank (resident, busiest rank)`` or nothing."""
    if not peak:
        return ""
    return f", peak memory {peak['bytes'] / 2**30:.2f} GiB per rank ({peak['kind']}, busiest rank)"


def print_summary(cfg: HFTrainConfig, index, s: dict) -> int:
    """Print the run's summary ``s`` (:func:`vlmcp.train.loop.train_rank`'s); returns the exit code."""
    if s["message"]:
        failed = s["stopped"] in ("nonfinite", "no_targets")
        print(f"vlmcp train: {s['message']}", file=sys.stderr if failed else sys.stdout)
    losses = s["losses"]
    rate = s["tokens"] / s["seconds"] if s["seconds"] > 0 else 0.0
    targets = f" ({s['target_tokens']:,} trained)" if "target_tokens" in s else ""
    print(f"vlmcp train: steps {s['start_step'] + 1}-{s['step']} of {s['steps']}, {s['tokens']:,} "
          f"tokens{targets}, {rate:,.0f} tokens/s"
          + (f", loss {losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "")
          + _peak(s.get("peak_memory")))
    print(f"vlmcp train: {skips_line(cfg, index, s.get('decode_skipped', []))}")
    if s["model_dir"]:
        print(f"vlmcp train: model and processor saved to {s['model_dir']}")
    if s["checkpoint"]:
        print(f"vlmcp train: checkpoints in {cfg.checkpoints}")
    if s["loss_curve"]:
        print(f"vlmcp train: loss curve written to {s['loss_curve']}")
    if s.get("evals"):
        last = s["evals"][-1]
        print(f"vlmcp train: eval loss {last['eval_loss']:.4f} after step {last['step']} over "
              f"{last['eval_tokens']:,} target tokens ({last['eval_rows']} rows of --eval-data)")
    return {"nonfinite": 1, "no_targets": 1, "sigint": 130}.get(s["stopped"], 0)
