"""``vlmcp train --model``'s loop options without spawning a rank (issue 24): defaults, the run
length, the schedules, weight decay groups, clipping, eval records, and the traps that must be
one line before any rank starts."""

import contextlib
import io
import json
import math
import subprocess
import sys

import pytest
import torch

from vlmcp.cli import main
from vlmcp.train.schedule import lr_at, scheduled_lr

pytestmark = pytest.mark.timeout(120)


def _help(*argv) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(out.getvalue().split())  # argparse wraps lines


def test_vlmcp_help_imports_no_torch():
    code = ("import sys, time; t = time.perf_counter(); from vlmcp.cli import main\n"
            "try: main(['--help'])\nexcept SystemExit: pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'transformers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "train the reference VLM" in out.stdout and out.stdout.strip().endswith("[]"), out.stdout[-300:]


def test_an_unknown_flag_prints_train_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--model", "m", "--bogus", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: vlmcp train ")
    assert "vlmcp train: error: unrecognized arguments: --bogus 1" in err


def test_help_shows_each_trainers_defaults():
    text = _help("train")
    assert "--lr LR AdamW peak learning rate (default: 0.003; with --model: 1e-05, or 0.0001 with " \
           "--lora)" in text
    assert "(default: 1024; with --model: 4096)" in text and "(default: 60; with --model: --epochs 1)" in text
    for flag, default in (("--epochs EPOCHS", "(default: 1)"), ("--grad-accum N", "(default: 1)"),
                          ("--weight-decay WEIGHT_DECAY", "(default: 0.0)"),
                          ("--max-grad-norm MAX_GRAD_NORM", "(default: 1.0)"),
                          ("--warmup-steps N", "(default: 0"), ("--warmup-ratio R", "(default: 0)"),
                          ("--lr-scheduler {cosine,linear,constant}", "(default: cosine)"),
                          ("--save-total-limit N", "(default: 3)"), ("--eval-data FILE", "(default: none)"),
                          ("--eval-every K", "(default: 0)"),
                          ("--report-to {none,tensorboard}", "(default: none)"),
                          ("--log-every N", "(default: 0)")):
        group = text.split("fine-tuning loop (with --model):", 1)[1]  # the help, past the usage
        assert flag in group, flag
        assert default in group.split(flag, 1)[1][:260], (flag, default)


def _args(*argv):
    import argparse

    from vlmcp.cli import train as train_cmd

    parser = argparse.ArgumentParser()
    train_cmd.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["train", *argv])


def test_defaults_of_the_reference_vlm_and_of_a_model_directory(tmp_path):
    from vlmcp.cli.train import config_from_args
    from vlmcp.cli.train import config_from_args as reference_config

    ref = reference_config(_args())
    assert (ref.lr, ref.steps, ref.seq_len) == (0.003, 60, 1024)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    argv = ["--model", str(tmp_path / "m"), "--data", "d.jsonl", "--output-dir", str(tmp_path / "out")]
    cfg = config_from_args(_args(*argv))
    assert (cfg.lr, cfg.seq_len, cfg.steps, cfg.epochs, cfg.grad_accum) == (1e-5, 4096, None, None, 1)
    assert (cfg.weight_decay, cfg.max_grad_norm, cfg.save_total_limit) == (0.0, 1.0, 3)
    assert cfg.lr_scheduler == "cosine"
    lora = _args(*argv)
    lora.lora = True  # what --lora (its own branch) sets
    assert config_from_args(lora).lr == 1e-4
    assert cfg.with_steps(10).steps == 10  # one epoch of 10 rows, 1 row per step
    accum = config_from_args(_args(*argv, "--grad-accum", "3", "--dp", "2", "--epochs", "2.5"))
    assert accum.with_steps(10).steps == math.ceil(2.5 * 10 / 6)
    assert config_from_args(_args(*argv, "--steps", "7")).with_steps(10).steps == 7
    warm = config_from_args(_args(*argv, "--warmup-ratio", "0.1")).with_steps(25)
    assert warm.warmup == 3  # ceil(0.1 * 25)


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "2"], "--epochs needs --model"),
    (["--image-root", "images"], "--image-root needs --model"),
    (["--eval-data", "x.jsonl"], "--eval-data needs --model"),
    (["--report-to", "tensorboard"], "--report-to needs --model"),
])
def test_loop_flags_need_a_model(capsys, argv, message):
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"vlmcp train: error: {message} (the reference VLM has no such flag)"


@pytest.mark.parametrize("kw, message", [
    (dict(steps=5, epochs=1.0), "--steps 5 and --epochs 1.0: give one"),
    (dict(warmup_steps=2, warmup_ratio=0.1), "--warmup-steps 2 and --warmup-ratio 0.1: give one"),
    (dict(grad_accum=0), "--grad-accum must be an integer >= 1, got 0"),
    (dict(weight_decay=-1.0), "--weight-decay must be >= 0"),
    (dict(lr_scheduler="step"), "--lr-scheduler must be one of"),
    (dict(report_to="wandb"), "--report-to must be one of"),
    (dict(save_total_limit=-1), "--save-total-limit must be an integer >= 0"),
])
def test_config_refuses_bad_loop_values(kw, message):
    from vlmcp.train.specs.hf.config import HFTrainConfig

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        HFTrainConfig(model="m", data="d.jsonl", output_dir="o", **kw)


def test_schedules_follow_transformers_after_the_warm_up():
    pytest.importorskip("transformers")
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    steps, warmup, lr = 20, 4, 2e-5
    for kind, make in (("cosine", get_cosine_schedule_with_warmup),
                       ("linear", get_linear_schedule_with_warmup)):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
        sched = make(opt, warmup, steps)
        for step in range(steps):
            want = opt.param_groups[0]["lr"]
            got = scheduled_lr(kind, lr, step, steps, warmup)
            if step >= warmup:
                assert got == pytest.approx(want, rel=1e-12, abs=1e-20), (kind, step)
            else:  # the warm-up reaches the peak at its last step; transformers' starts at 0
                assert got == pytest.approx(lr * (step + 1) / warmup)
            opt.step()
            sched.step()
    assert [scheduled_lr("constant", 1.0, s, 10, 2) for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    from vlmcp.train.specs.hf.config import HFTrainConfig
    from vlmcp.train.specs.reference.config import ReferenceTrainConfig

    ref = ReferenceTrainConfig(lr=1.0, steps=60)  # the reference trainer: unchanged
    assert lr_at(ref, 0) == 0.2 and lr_at(ref, 5) == pytest.approx(1.0) and lr_at(ref, 59) > 0.1
    hf = HFTrainConfig(model="m", data="d.jsonl", output_dir="o", lr=1.0, steps=4, lr_scheduler="linear")
    assert [lr_at(hf, s) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]


def test_weight_decay_skips_biases_and_norms_and_clipping_scales_to_the_norm():
    from vlmcp.train.optim import clip_gradients, make_optimizer, no_decay

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4),
                                torch.nn.Linear(4, 2, bias=False))
    model.register_parameter("scale", torch.nn.Parameter(torch.ones(2)))
    assert no_decay(model) == {"0.bias", "1.weight", "1.bias", "scale"}
    opt = make_optimizer(model, 1e-3, 0.1)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert [len(g["params"]) for g in opt.param_groups] == [2, 4]
    for p in model.parameters():
        p.grad = torch.full_like(p, 2.0)
    norm = math.sqrt(sum(4.0 * p.numel() for p in model.parameters()))
    assert clip_gradients(model, norm, 0) == 1.0 and clip_gradients(model, norm, 2 * norm) == 1.0
    factor = clip_gradients(model, norm, 1.0)
    assert factor == pytest.approx(1.0 / (norm + 1e-6))
    clipped = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()))
    assert clipped == pytest.approx(1.0, rel=1e-5)


def test_eval_records_go_into_the_metrics_and_the_loss_curve(tmp_path):
    from vlmcp.report import plot_loss_curve
    from vlmcp.report.metrics import MetricsWriter, read_metrics

    path = tmp_path / "m.jsonl"
    base = {"grad_norm_vision": 1.0, "grad_norm_projector": 1.0, "grad_norm_llm": 1.0, "tokens": 10,
            "seconds": 1}
    with MetricsWriter(path) as w:
        w.write({"step": 1, "loss": 2.0, **base})
        w.write_eval({"step": 1, "eval_loss": 2.5, "eval_tokens": 7})
        with pytest.raises(ValueError, match="lacks"):
            w.write_eval({"step": 1, "eval_loss": 2.5})
        w.write({"step": 2, "loss": 1.5, **base})
        with pytest.raises(ValueError, match="before the last written step 2"):
            w.write_eval({"step": 1, "eval_loss": 2.5, "eval_tokens": 7})
    assert [("eval_loss" in r, r["step"]) for r in read_metrics(path)] == [(False, 1), (True, 1), (False, 2)]
    import matplotlib.pyplot as plt

    lines = []
    orig = plt.Axes.plot
    try:
        plt.Axes.plot = lambda self, *a, **k: lines.append(k.get("label")) or orig(self, *a, **k)
        plot_loss_curve(path, tmp_path / "m.png")
    finally:
        plt.Axes.plot = orig
    assert "eval loss" in lines and (tmp_path / "m.png").stat().st_size > 0


def test_resume_with_another_schedule_is_refused_naming_it(tmp_path):
    from vlmcp.train.checkpoint.run import check_resumable
    from vlmcp.train.specs.hf.config import HFTrainConfig

    cfg = HFTrainConfig(model="m", data="d.jsonl", output_dir="o", steps=6)
    saved = cfg.to_dict()
    check_resumable(saved, cfg, 2, tmp_path)
    for kw, named in ((dict(steps=8), "--steps 6 -> 8"), (dict(steps=6, grad_accum=2), "--grad-accum 1 -> 2"),
                      (dict(steps=6, lr_scheduler="linear"), "--lr-scheduler 'cosine' -> 'linear'"),
                      (dict(steps=6, warmup_steps=3), "--warmup-steps None -> 3"),
                      (dict(steps=6, lr=1e-4), "--lr 1e-05 -> 0.0001"),
                      (dict(steps=6, weight_decay=0.1), "--weight-decay 0.0 -> 0.1")):
        with pytest.raises(ValueError, match="belongs to another run") as err:
            other = HFTrainConfig(model="m", data="d.jsonl", output_dir="o", **kw)
            check_resumable(saved, other, 2, tmp_path)
        assert named in str(err.value)
    old = {k: v for k, v in saved.items() if k not in ("grad_accum", "lr_scheduler")}  # an older checkpoint
    check_resumable(old, cfg, 2, tmp_path)


def test_eval_every_without_eval_data_is_refused():
    from vlmcp.train.specs.hf.config import HFTrainConfig

    with pytest.raises(ValueError, match="--eval-every 5 needs held-out data"):
        HFTrainConfig(model="m", data="d.jsonl", output_dir="o", steps=3, eval_every=5)
    HFTrainConfig(model="m", data="d.jsonl", output_dir="o", steps=3, eval_every=5, eval_data=("e.jsonl",))


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    pytest.importorskip("transformers")
    from vlmcp.data.hf.export import export_shapes
    from vlmcp.debug.init_model import init_model

    root = tmp_path_factory.mktemp("opts")
    return init_model("llava", root / "llava"), export_shapes(root / "shapes", 4)


def _one_error(capsys, argv) -> str:
    assert main(argv) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and "spawning" not in out.out, (out.out, out.err)
    return lines[0]


def test_model_traps_are_one_line_before_any_rank(llava, tmp_path, capsys):
    model, data = llava
    base = ["train", "--model", str(model), "--data", str(data)]
    err = _one_error(capsys, [*base, "--output-dir", str(tmp_path / "o"), "--cp", "4", "--attention",
                              "ulysses"])
    assert "--attention ulysses splits the model's 6 attention heads over --cp 4" in err
    err = _one_error(capsys, [*base, "--output-dir", str(tmp_path / "o"), "--cp", "5", "--vision-mode",
                              "hidden_shard"])
    assert "--vision-mode hidden_shard splits the projector's 48 output columns" in err and "--cp 5" in err
    assert "--output-dir" in _one_error(capsys, [*base, "--output-dir", str(model)])
    assert "lies inside --model" in _one_error(capsys, [*base, "--output-dir", str(model / "out")])
    pali = tmp_path / "paligemma"
    pali.mkdir()
    (pali / "config.json").write_text(json.dumps({"model_type": "paligemma",
                                                  "architectures": ["PaliGemmaForConditionalGeneration"]}))
    for argv in (["train", "--model", str(pali), "--data", str(data), "--output-dir", str(tmp_path / "p")],
                 ["verify", "--model", str(pali)]):
        err = _one_error(capsys, argv)
        assert "unsupported architecture PaliGemmaForConditionalGeneration (model_type='paligemma')" in err
        assert "vlmcp supports model_type" in err and "qwen2_vl" in err and "llava" in err


def test_feedback_writes_every_figure_to_the_metrics_and_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from vlmcp.report.metrics import read_metrics
    from vlmcp.train.feedback import Feedback
    from vlmcp.train.specs.hf.config import HFTrainConfig

    cfg = HFTrainConfig(model="m", data="d.jsonl", output_dir=str(tmp_path), steps=2, report_to="tensorboard",
                        metrics_jsonl=str(tmp_path / "m.jsonl"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fb = Feedback(cfg, 0, enabled=True)
        fb.bar.stream = out
        record = {"step": 1, "loss": 2.0, "lr": 1e-5, "grad_norm": 0.5, "grad_norm_vision": 0.1,
                  "grad_norm_projector": 0.2, "grad_norm_llm": 0.4, "tokens": 100, "target_tokens": 40,
                  "tokens_per_second": 50.0, "memory_bytes": 2**30, "seconds": 2.0}
        fb.step(record)
        fb.evaluation(1, {"eval_loss": 2.5, "eval_tokens": 30, "eval_rows": 2})
        fb.close()
    assert "loss 2.0000  lr 1.00e-05  grad 0.5  mem 1.00 GiB" in out.getvalue()
    assert "vlmcp train: step 1: eval loss 2.5000 over 30 target tokens (2 rows)" in out.getvalue()
    assert read_metrics(tmp_path / "m.jsonl") == [record, {"step": 1, "eval_loss": 2.5, "eval_tokens": 30,
                                                           "eval_rows": 2}]
    events = EventAccumulator(str(cfg.tensorboard_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {f"train/{k}" for k in record if k != "step"} | {"eval/loss"} <= tags
    assert events.Scalars("train/lr")[0].value == pytest.approx(1e-5)


def test_a_second_ctrl_c_stops_at_once(capsys):
    """The launcher: the first Ctrl-C is a SIGTERM to the ranks and one line; the second exits 130.
    A rank: the first SIGINT asks for a stop after the step; the second exits 130 at once."""
    import signal

    from vlmcp.ranks import _Interrupt

    handler = _Interrupt("vlmcp train")
    handler(signal.SIGINT, None)  # no rank to forward to here
    assert capsys.readouterr().err.strip() == ("vlmcp train: interrupted: finishing the step and saving a "
                                               "checkpoint (Ctrl-C again to stop at once)")
    with pytest.raises(SystemExit) as exc:
        handler(signal.SIGINT, None)
    assert exc.value.code == 130
    code = ("import signal; from vlmcp.train.stop import StopSignals\n"
            "s = StopSignals(); s(signal.SIGTERM, None); print(s.flag, s.interrupted, flush=True)\n"
            "s(signal.SIGINT, None); print(s.flag, s.interrupted, flush=True)\n"
            "s(signal.SIGINT, None); print('not reached')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 130 and out.stdout.split() == ["True", "False", "True", "True"], out
