"""``vlmcp bench``: every benchmark runs through the CLI on a tiny size and prints sane figures."""

import json
import re

import pytest

from vlmcp.bench import BENCHMARKS
from vlmcp.cli import bench as bench_cmd
from vlmcp.cli import main

pytestmark = pytest.mark.timeout(120)

NUM = r"([0-9.]+)"


def bench(capsys, *argv):
    assert main(["bench", *argv]) == 0
    out, err = capsys.readouterr()
    assert err.startswith(f"vlmcp bench {argv[0]}: ")  # the progress line, on stderr
    return out


def test_plan_bench_reports_positive_times(capsys):
    out = bench(capsys, "plan", "--tokens", "4096", "--samples", "4", "--cp", "2",
                "--image-tokens", "16", "--repeats", "1")
    m = re.search(rf"L=4,096 tokens, 4 samples, P=2, 1 thread: plan_cp {NUM} ms; plan_cp \+ for_rank "
                  rf"on all 2 ranks {NUM} ms; one rank's for_rank {NUM} ms \(best of 1\)", out)
    assert m, out
    plan_ms, all_ms, one_ms = map(float, m.groups())
    assert 0 < plan_ms <= all_ms and one_ms >= 0


def test_plan_bench_rejects_a_row_too_short(capsys):
    assert main(["bench", "plan", "--tokens", "100", "--samples", "4", "--image-tokens", "576"]) == 2
    assert "cannot hold 4 samples" in capsys.readouterr().err


def test_attention_bench_both_backends(capsys):
    out = bench(capsys, "attention", "--image-tokens", "16", "--text-tokens", "112", "--heads", "2",
                "--head-dim", "8", "--cp", "2", "--repeats", "1")
    shares = [float(s) for s in re.search(r"pair share per rank: (.*?);", out).group(1).split(", ")]
    assert "(0 of 1 samples whole)" in out and "padding 0.00% of the slots" in out
    # Each rank repeats the image queries: more than half of the pairs, far less than all.
    assert len(shares) == 2 and all(0.5 <= s < 0.75 for s in shares)
    for backend in ("ring", "ulysses"):
        times = re.findall(rf"rank \d: {NUM} ms = {NUM} x single", _line(out, backend, "single process"))
        assert len(times) == 2 and all(float(ratio) > 0 for _, ratio in times)
        eff = float(re.search(rf"efficiency \(median of 1\): {NUM}", _line(out, backend, "efficiency"))[1])
        assert 0 < eff < 2
        saved = [float(x) for x in re.findall(rf"MiB = {NUM} x", _line(out, backend, "saved for backward"))]
        assert len(saved) == 2 and all(0 < x < 1 for x in saved)


def test_attention_bench_places_short_samples_whole(capsys):
    out = bench(capsys, "attention", "--samples", "16", "--image-tokens", "2", "--text-tokens", "6",
                "--heads", "2", "--head-dim", "8", "--cp", "2", "--repeats", "1", "--backend", "ring",
                "--sample-placement", "auto")
    assert "16 x (2 image + 6 text) tokens" in out and "(16 of 16 samples whole)" in out
    assert "pair share per rank: 0.500, 0.500;" in out  # LPT halves equal samples exactly
    assert len(re.findall(rf"rank \d: {NUM} ms = {NUM} x single", _line(out, "ring", "single process"))) == 2


def test_attention_bench_runs_usp(capsys):
    out = bench(capsys, "attention", "--image-tokens", "8", "--text-tokens", "56", "--heads", "2",
                "--head-dim", "8", "--cp", "2", "--repeats", "1", "--backend", "usp", "--ulysses-size", "2")
    assert len(re.findall(rf"rank \d: {NUM} ms = {NUM} x single", _line(out, "usp", "single process"))) == 2


def _line(out, backend, what):
    lines = [line for line in out.splitlines() if line.startswith(f"[{backend}] {what}")]
    assert len(lines) == 1, out
    return lines[0]


def test_memory_bench_cp_saves_less_than_one_process(capsys):
    out = bench(capsys, "memory", "--cp", "2", "--image-tokens", "8", "--text-tokens", "64")
    assert out.startswith("row: 8 image + 64 text tokens in 8 samples")
    rows = [line.split("|")[1:-1] for line in out.splitlines() if re.match(r"\| 2 \|", line)]
    assert [r[1].strip() for r in rows] == ["replicate", "scatter"]
    for _, _, largest, single, ratio, ideal in rows:
        assert float(largest.split()[0]) <= float(single.split()[0])
        assert 0 < float(ratio) < 1
        assert float(ideal) == pytest.approx((8 + 64 / 2) / (8 + 64), abs=1e-3)


def test_vision_bench_json(capsys):
    out = bench(capsys, "vision", "--cp", "2", "--repeats", "1", "--images", "4", "--depth", "1", "--json")
    report = json.loads(out)
    assert report["images"] == 4 and report["config"]["depth"] == 1 and report["repeats"] == 1
    (row,) = report["results"]
    assert row["cp"] == 2 and sum(row["images_per_rank"]) == 4 and len(row["scatter_ms_per_rank"]) == 2
    assert row["replicate_ms"] > 0 and row["scatter_ms"] > 0 and row["speedup"] > 0
    assert 1 <= row["token_bound"] <= row["cost_bound"] <= 2


def test_vision_bench_rejects_bad_image_count(capsys):
    assert main(["bench", "vision", "--images", "0"]) == 2
    assert "--images must be in 1..8" in capsys.readouterr().err


def test_all_runs_every_benchmark_on_its_defaults(capsys, monkeypatch):
    seen = []
    for name, module in bench_cmd._MODULES.items():
        monkeypatch.setattr(module, "run", lambda args, name=name: seen.append((name, args)) or 0)
    assert main(["bench", "all"]) == 0
    assert [name for name, _ in seen] == list(BENCHMARKS)
    assert seen[0][1].tokens == 1 << 20 and seen[2][1].cp == [2, 4] and seen[3][1].repeats == 7
    err = capsys.readouterr().err
    assert [line.split(":")[0] for line in err.splitlines() if "done in" not in line] == [
        f"vlmcp bench {name} ({i}/{len(BENCHMARKS)})" for i, name in enumerate(BENCHMARKS, 1)]


def test_bench_needs_a_benchmark():
    with pytest.raises(SystemExit) as exc:
        main(["bench"])
    assert exc.value.code == 2


def test_a_failing_rank_is_reported_not_raised(capsys, monkeypatch):
    from vlmcp.launch import RankFailure

    def fail(args):
        raise RankFailure("_rank: failed on rank 1 of 2")

    monkeypatch.setattr(bench_cmd._MODULES["memory"], "run", fail)
    assert main(["bench", "memory"]) == 1
    assert "vlmcp bench memory: failed: _rank: failed on rank 1 of 2" in capsys.readouterr().err
