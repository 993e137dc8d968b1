"""Progress bar output and the resumable metrics JSONL writer."""

import io
import json
import math

import pytest
import torch

from vlmcp.train import METRIC_FIELDS, MetricsWriter, ProgressBar, format_duration, read_metrics

pytestmark = pytest.mark.timeout(30)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def record(step, loss=1.0):
    return {"step": step, "loss": loss, "grad_norm_vision": 0.5, "grad_norm_projector": 0.25,
            "grad_norm_llm": 2.0, "tokens": 512, "seconds": 0.1}


def test_format_duration():
    assert format_duration(0) == "0:00:00"
    assert format_duration(3725.4) == "1:02:05"
    assert format_duration(float("nan")) == "?"


def test_plain_lines_when_not_a_terminal():
    out, clock = io.StringIO(), FakeClock()
    bar = ProgressBar(100, stream=out, log_every=10, clock=clock)
    for step in range(1, 101):
        clock.now += 1.0  # one second and 200 tokens per step
        bar.update(step, loss=4.0 / step, tokens=200)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 10 and "\r" not in out.getvalue()
    assert lines[0] == "step 10/100  loss 0.4000  200 tok/s  elapsed 0:00:10  ETA 0:01:30"
    assert lines[-1].startswith("step 100/100  loss 0.0400") and lines[-1].endswith("ETA 0:00:00")


def test_resumed_run_counts_only_its_own_steps():
    out, clock = io.StringIO(), FakeClock()
    bar = ProgressBar(50, initial=40, stream=out, log_every=5, clock=clock)
    for step in range(41, 46):
        clock.now += 2.0
        bar.update(step, loss=1.0, tokens=100)
    assert out.getvalue().splitlines() == [
        "step 45/50  loss 1.0000  50 tok/s  elapsed 0:00:10  ETA 0:00:10"]


def test_terminal_redraws_one_line():
    out, clock = Terminal(), FakeClock()
    with ProgressBar(4, stream=out, width=8, clock=clock) as bar:
        for step in range(1, 5):
            clock.now += 1.0
            bar.update(step, loss=None if step == 1 else 1.5, tokens=10)
    text = out.getvalue()
    assert text.count("\r") == 4 and text.endswith("\n") and text.count("\n") == 1
    assert "[##......] step 1/4  loss -" in text
    assert "[########] step 4/4  loss 1.5000  10 tok/s" in text


def test_disabled_bar_writes_nothing():
    out = Terminal()
    bar = ProgressBar(3, stream=out, enabled=False)
    bar.update(1, loss=1.0, tokens=5)
    bar.close()
    assert out.getvalue() == ""
    with pytest.raises(ValueError, match="total"):
        ProgressBar(0)


def test_metrics_jsonl_resume_does_not_duplicate_steps(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    with MetricsWriter(path) as w:
        for step in range(1, 6):
            w.write(record(step, loss=10.0 - step))
    with open(path, "a") as f:
        f.write('{"step": 6, "loss": 3.')  # killed mid-line
    # The checkpoint was saved after step 3; steps 4-6 are recomputed by the resumed run.
    with MetricsWriter(path, resume_step=3) as w:
        assert w.last_step == 3
        for step in range(4, 8):
            w.write(record(step, loss=0.5))
    records = read_metrics(path)
    assert [r["step"] for r in records] == list(range(1, 8))
    assert [r["loss"] for r in records] == [9.0, 8.0, 7.0, 0.5, 0.5, 0.5, 0.5]
    assert all(set(METRIC_FIELDS) <= set(r) for r in records)
    for line in path.read_text().splitlines():
        json.loads(line)  # every line is strict JSON
    with MetricsWriter(path) as w:  # a fresh run replaces the file
        w.write(record(1))
    assert [r["step"] for r in read_metrics(path)] == [1]


def test_metrics_writer_rejects_duplicates_and_missing_keys(tmp_path):
    path = tmp_path / "m.jsonl"
    with MetricsWriter(path) as w:
        w.write(record(1))
        with pytest.raises(ValueError, match="step 1 is not after the last written step 1"):
            w.write(record(1))
        bad = record(2)
        del bad["grad_norm_vision"]
        with pytest.raises(ValueError, match="grad_norm_vision"):
            w.write(bad)
        w.write({**record(2), "loss": float("nan"), "grad_norm_llm": torch.tensor(3.0), "lr": 1e-3})
    last = read_metrics(path)[-1]
    assert last["loss"] is None and last["grad_norm_llm"] == 3.0 and math.isclose(last["lr"], 1e-3)


def test_read_metrics_rejects_a_broken_middle_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"m.jsonl:2"):
        read_metrics(path)
    path.write_text('{"step": 1}\n{"step": 2}')  # complete, just no final newline
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
