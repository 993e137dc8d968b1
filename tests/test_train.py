"""``vlmcp train``, ``plan`` and ``compare`` end to end (issue 5).

The CLI runs in this process (``vlmcp.cli.main``); the ranks it spawns are real
gloo processes.
"""

import json
import subprocess
import sys
import time

import pytest
import torch

from tests.train_cases import prepare_killing
from vlmcp.cli import main
from vlmcp.data import ShapesDataset, pack_rows
from vlmcp.loss import cp_cross_entropy
from vlmcp.models import VLM
from vlmcp.testing import run_on_ranks
from vlmcp.train.checkpoint import list_checkpoints, load_checkpoint
from vlmcp.train.loop import train_rank
from vlmcp.train.specs.reference import launch as reference_launch
from vlmcp.train.specs.reference.config import ReferenceTrainConfig
from vlmcp.train.specs.reference.spec import ReferenceSpec, dataset_config, model_config
from vlmcp.train.specs.reference.step import local_inputs

SMALL = ["--seq-len", "256", "--steps", "8", "--hidden", "32", "--layers", "1"]


def losses(path):
    return [json.loads(line)["loss"] for line in open(path)]


def test_train_learns_and_trains_the_vision_tower(tmp_path):
    # A real command line in a fresh process: the progress bar is printed by rank 0, a child
    # of this command's own fork server, so only a fresh process shows where it goes.
    metrics = tmp_path / "new" / "runs" / "m.jsonl"  # missing parents are created
    proc = subprocess.run([sys.executable, "-m", "vlmcp", "train", "--cp", "2", *SMALL,
                           "--metrics-jsonl", str(metrics)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in open(metrics)]
    assert [r["step"] for r in records] == list(range(1, 9))
    assert records[-1]["loss"] < records[0]["loss"] - 0.3
    assert all(r["grad_norm_vision"] > 0 and r["grad_norm_projector"] > 0 for r in records)
    assert all(r["tokens"] == 256 for r in records)
    png = metrics.with_suffix(".png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert "step 8/8" in proc.stdout and "loss curve written" in proc.stdout


def test_resume_after_a_killed_rank_is_exact_and_fails_fast(tmp_path, capsys, monkeypatch):
    flags = ["--cp", "2", *SMALL, "--vision-mode", "hidden_shard"]
    full = tmp_path / "full.jsonl"
    assert main(["train", *flags, "--metrics-jsonl", str(full)]) == 0

    ckpt, metrics = tmp_path / "new" / "ckpt", tmp_path / "m.jsonl"  # missing parents are created
    run = ["train", *flags, "--checkpoint-every", "3", "--checkpoint-dir", str(ckpt), "--metrics-jsonl",
           str(metrics), "--timeout", "30"]
    start = time.monotonic()
    with monkeypatch.context() as patch:  # rank 1 is SIGKILLed at step 5 (0-based)
        patch.setattr(reference_launch, "prepare", prepare_killing(1, 5))
        assert main(run) == 1
    assert time.monotonic() - start < 60  # the survivor did not wait for the whole run
    err = capsys.readouterr().err  # one line for the killed rank, one for the peer that lost it
    assert "rank 1 was killed by SIGKILL" in err and len(err.strip().splitlines()) == 2, err
    saved = list_checkpoints(ckpt)
    assert [load_checkpoint(p).step for p in saved] == [3]  # the last good checkpoint is intact
    assert main([*run, "--resume"]) == 0
    assert losses(metrics) == losses(full)  # bit-exact on CPU with the same CP size


def test_checkpoint_resumes_with_another_cp_size(tmp_path):
    base = [*SMALL, "--vision-mode", "hidden_shard", "--checkpoint-every", "4"]
    full, ckpt = tmp_path / "full.jsonl", tmp_path / "ckpt"
    run = ["train", "--cp", "2", *base, "--checkpoint-dir", str(ckpt), "--metrics-jsonl", str(full)]
    assert main(run) == 0
    # resume the step-4 checkpoint written by 2 ranks (projector slices of 1/2) on 4 ranks
    moved = tmp_path / "from4"
    moved.mkdir()
    (ckpt / "step_00000004.pt").rename(moved / "step_00000004.pt")
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("".join(full.read_text().splitlines(keepends=True)[:4]))
    assert main(["train", "--cp", "4", *base, "--checkpoint-dir", str(moved), "--metrics-jsonl",
                 str(metrics), "--resume"]) == 0
    a, b = losses(metrics), losses(full)
    assert len(a) == 8 and a[:4] == b[:4]
    # another CP size sums in another order: equal up to float32 rounding
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4


@pytest.mark.parametrize("argv,match", [
    (["--cp", "3", "--attention", "ulysses"], "--heads (4) divisible by --cp (3)"),
    (["--cp", "2", "--seq-len", "12"], "--seq-len 12 is too short for --cp 2"),
    (["--seq-len", "40"], "shorter than the longest built-in sample"),
    (["--cp", "0"], "--cp must be an integer >= 1, got 0"),
    (["--vision-mode", "hidden_shard", "--cp", "3"], "hidden (64) divisible by --cp (3)"),
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint-dir"),
    (["--flops-per-byte", "10"], "--flops-per-byte only applies to --image-strategy auto or --sample"),
])
def test_bad_flags_are_one_line_errors_before_any_rank_starts(argv, match, capsys):
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1 and "spawning" not in err


def test_resume_is_checked_before_any_rank_starts(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    run = ["train", "--cp", "2", *SMALL[:2], "--hidden", "32", "--layers", "1", "--checkpoint-dir", str(ckpt)]
    assert main([*run, "--steps", "2", "--resume"]) == 0  # nothing there yet: says so, starts fresh
    assert "no checkpoint in" in capsys.readouterr().out
    # another run's checkpoint: a one-line error naming what differs, no rank started
    assert main([*run, "--steps", "4", "--resume", "--hidden", "48"]) == 2
    err = capsys.readouterr().err
    assert "--hidden 32 -> 48" in err and err.count("\n") == 1
    assert main([*run, "--steps", "1", "--resume"]) == 2
    assert "its step 2 is past --steps 1" in capsys.readouterr().err
    assert main([*run, "--steps", "2", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "nothing to do" in out and "spawning" not in out


def test_world_size_mismatch_under_torchrun_is_an_error(monkeypatch, capsys):
    for key, value in {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    assert main(["train", "--cp", "2", "--dp", "2"]) == 2
    assert "--cp 2 x --dp 2 = 4, but torchrun started 3 ranks" in capsys.readouterr().err


def test_dp_times_cp_trains_every_replica_identically():
    cfg = ReferenceTrainConfig(cp=2, dp=2, seq_len=256, steps=3, hidden=32, layers=1)
    summaries = run_on_ranks(train_rank, 4, ReferenceSpec(cfg), timeout=240)
    # the DP mean keeps the 4 ranks (2 replicas x 2 CP ranks) bit-identical
    assert len({s["param_checksum"] for s in summaries}) == 1
    # step 1's logged loss is the mean over the two rows the replicas took, each computed
    # by one process (so each replica really took its own row)
    torch.manual_seed(cfg.seed)
    model = VLM(model_config(cfg))
    rows = pack_rows(ShapesDataset(dataset_config(cfg)), cfg.seq_len, 0, 2)
    assert not torch.equal(rows[0].input_ids, rows[1].input_ids)
    ref = []
    for row in rows:
        shard = row.plan(1).for_rank(0)
        ids, labels, pos = local_inputs(row, shard)
        with torch.no_grad():
            logits = model(ids, pos, row.images, shard, None)
        ref.append(float(cp_cross_entropy(logits, labels, None).mean))
    assert abs(summaries[0]["losses"][0] - sum(ref) / 2) < 1e-5


def test_plan_writes_png_and_table(tmp_path, capsys):
    out = tmp_path / "new" / "plan.png"  # missing parents are created
    argv = ["plan", "--cp", "2", "--image-tokens", "4,0", "--text-tokens", "8,6", "--out", str(out)]
    assert main(argv) == 0
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    text = capsys.readouterr().out
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit()]
    # columns: slots, image, text, pad, text pairs, image pairs, total pairs, then bytes
    table = {int(r[0]): [int(c.replace(",", "")) for c in r[1:8]] for r in rows}
    # sample 0: 4 image + 8 text (chunks of 2); sample 1: 6 text padded to 8 (rank 0 gets the pads)
    assert table[0][:4] == [12, 4, 6, 2]
    assert table[1][:4] == [12, 4, 8, 0]
    # image pairs 1+2+3+4 on each rank (replicated); text pairs split exactly
    assert table[0][5] == table[1][5] == 10
    single = sum(range(1, 13)) + sum(range(1, 7))
    assert table[0][4] + table[1][4] + 10 == single
    # ring bytes, 8 K/V heads of 128 in bf16: rank 0 sends its 6 text tokens' K/V forward
    # (6 * 2 * 8 * 128 * 2 B = 24 KiB); backward, K/V again plus rank 1's 8 tokens' dK/dV in
    # fp32 (8 * 2 * 8 * 128 * 4 B = 64 KiB)
    rank0 = next(line for line in text.splitlines() if line.strip().startswith("0 "))
    assert rank0.split()[-4:] == ["24.0", "KiB", "88.0", "KiB"]


def test_compare_measures_the_naive_layout(tmp_path, capsys):
    out = tmp_path / "new" / "compare.md"  # missing parents are created
    assert main(["compare", "--cp", "2", "--seq-len", "256", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    rows = {line.split("|")[1].strip(): line.split("|") for line in lines[2:]}
    naive = rows["naive (zigzag merged row, no KV exchange)"]
    seed = rows["vlmcp replicate + ring (the seed)"]
    assert naive[3].strip() == "no" and seed[3].strip() == "yes"
    assert float(naive[8]) > 1e-2  # measured: the naive layout's gradients are wrong
    assert float(seed[8]) < 1e-10 and float(rows["vlmcp shard + ring"][8]) < 1e-10


def test_train_with_other_image_strategies(tmp_path, capsys):
    base = ["train", "--cp", "2", "--seq-len", "256", "--steps", "2", "--hidden", "32", "--layers", "1",
            "--attention", "ulysses"]
    runs = {
        "replicate": [],
        "shard": ["--image-strategy", "shard"],
        # this tiny float32 model replicates images under ~4,000 tokens at the default
        "auto": ["--image-strategy", "auto"],
        # ... and shards them when communication is (made) nearly free
        "auto-cheap-bytes": ["--image-strategy", "auto", "--flops-per-byte", "0.01"],
    }
    got = {}
    for name, flags in runs.items():
        metrics = tmp_path / f"{name}.jsonl"
        assert main([*base, *flags, "--metrics-jsonl", str(metrics)]) == 0
        got[name] = (losses(metrics), capsys.readouterr().out)
    assert "chose replicate for 2 and shard for 0 of DP replica 0's 2 rows" in got["auto"][1]
    assert "chose replicate for 0 and shard for 2 of DP replica 0's 2 rows" in got["auto-cheap-bytes"][1]
    assert got["auto"][0] == got["replicate"][0]
    # the layouts differ, the training does not (up to float32 summation order)
    for name in ("shard", "auto-cheap-bytes"):
        assert max(abs(a - b) for a, b in zip(got[name][0], got["replicate"][0], strict=True)) < 1e-5


def test_joins_a_torchrun_launch(tmp_path):
    # the multi-node path: torchrun starts the ranks, vlmcp joins its process group (gloo here)
    metrics = tmp_path / "m.jsonl"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run([*torchrun, "-m", "vlmcp", "train", "--cp", "2", *SMALL[:2], "--steps", "3",
                           "--hidden", "32", "--layers", "1", "--metrics-jsonl", str(metrics)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "vlmcp train: steps 1-3" in proc.stdout and proc.stdout.count("vlmcp train: steps") == 1
    spawned = tmp_path / "spawned.jsonl"
    assert main(["train", "--cp", "2", *SMALL[:2], "--steps", "3", "--hidden", "32", "--layers", "1",
                 "--metrics-jsonl", str(spawned)]) == 0
    assert losses(metrics) == losses(spawned)  # the same run, whoever starts the ranks


def _records(path):
    return [json.loads(line) for line in open(path)]


def test_the_reference_vlm_takes_the_loops_flags(tmp_path, capsys):
    """The one loop's flags on the reference VLM: --grad-accum 2 trains as --dp 2 does, --eval-rows
    evaluates held-out built-in rows, --save-total-limit prunes, an accumulating run resumes bit-exactly,
    --max-grad-norm clips and --lr-scheduler / --min-lr-ratio / --warmup-steps set the rate."""
    from vlmcp.train.schedule import lr_at

    base = ["train", "--cp", "1", *SMALL[:2], "--steps", "4", "--hidden", "32", "--layers", "1"]
    dp2, accum = tmp_path / "dp2.jsonl", tmp_path / "accum.jsonl"
    assert main([*base, "--dp", "2", "--metrics-jsonl", str(dp2)]) == 0
    ckpt = tmp_path / "ckpt"
    accum_run = [*base, "--grad-accum", "2", "--eval-rows", "2", "--eval-every", "2", "--checkpoint-dir",
                 str(ckpt), "--checkpoint-every", "1", "--save-total-limit", "2",
                 "--metrics-jsonl", str(accum)]
    assert main(accum_run) == 0
    assert "eval loss" in capsys.readouterr().out
    steps = [r for r in _records(accum) if "loss" in r]
    # the same global batch (two rows), its gradient summed by accumulation instead of the DP mean
    assert max(abs(a - b) for a, b in zip(losses(dp2), [r["loss"] for r in steps], strict=True)) < 1e-5
    assert all(r["tokens"] == 2 * 256 for r in steps)
    evals = [r for r in _records(accum) if "eval_loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(r["eval_rows"] == 2 and r["eval_tokens"] > 0 for r in evals)
    assert [p.name for p in list_checkpoints(ckpt)] == ["step_00000003.pt", "step_00000004.pt"]
    # resumed after step 3: steps 4 and the last evaluation again, bit-exact on CPU
    whole = accum.read_text()
    (ckpt / "step_00000004.pt").unlink()
    accum.write_text("".join(line + "\n" for line in whole.splitlines()[:4]))  # 3 steps and an eval
    assert main([*accum_run, "--resume"]) == 0
    assert [r["loss"] for r in _records(accum) if "loss" in r] == [r["loss"] for r in steps]
    assert [r["eval_loss"] for r in _records(accum) if "eval_loss" in r] == [r["eval_loss"] for r in evals]
    # clipping and the schedule flags
    clipped = tmp_path / "clipped.jsonl"
    flags = ["--grad-accum", "2", "--lr-scheduler", "linear", "--min-lr-ratio", "0", "--warmup-steps", "0",
             "--weight-decay", "0"]
    assert main([*base, *flags, "--max-grad-norm", "0.05", "--metrics-jsonl", str(clipped)]) == 0
    got = _records(clipped)
    cfg = ReferenceTrainConfig(steps=4, lr_scheduler="linear", min_lr_ratio=0.0, warmup_steps=0)
    assert [r["lr"] for r in got] == [lr_at(cfg, s) for s in range(4)]
    assert [r["lr"] for r in got] == pytest.approx([3e-3, 2.25e-3, 1.5e-3, 0.75e-3])
    assert all(r["grad_norm"] > 0.05 for r in got)  # logged before clipping: every step clipped
    unclipped = tmp_path / "unclipped.jsonl"
    assert main([*base, *flags, "--metrics-jsonl", str(unclipped)]) == 0
    assert losses(unclipped)[0] == got[0]["loss"] and losses(unclipped)[1] != got[1]["loss"]


@pytest.mark.parametrize("argv, match", [
    (["--eval-every", "2"], "--eval-every 2 needs held-out data: --eval-rows N"),
    (["--lora"], "--lora needs --model (the reference VLM trains every weight)"),
    (["--fsdp"], "--fsdp needs --model (the reference VLM has no such flag)"),
    (["--model", "m", "--data", "d.jsonl", "--output-dir", "o", "--eval-rows", "2"],
     "--eval-rows applies to the built-in reference VLM, not --model"),
])
def test_a_flag_one_model_cannot_take_is_refused_by_name(argv, match, capsys):
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"vlmcp train: error: {match}\n"


def test_a_nan_stops_the_reference_vlm_before_the_optimizer_step(tmp_path):
    from tests.train_cases import reference_rank

    cfg = ReferenceTrainConfig(cp=2, seq_len=256, steps=4, hidden=32, layers=1, checkpoint_dir=str(tmp_path),
                               checkpoint_every=1)
    summary = run_on_ranks(reference_rank, 2, cfg, 3, timeout=240)[0]
    assert summary["stopped"] == "nonfinite" and summary["step"] == 2 and len(summary["losses"]) == 2
    assert summary["message"].startswith("step 3: the loss (nan)")
    assert summary["message"].endswith(f"the last good checkpoint is {tmp_path}/step_00000002.pt")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001.pt", "step_00000002.pt"]
