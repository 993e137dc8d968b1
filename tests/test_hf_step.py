"""``vlmcp bench hf-step``: its counters on a tiny Qwen2-VL at P=2 (one spawned group; never a timer)."""

from __future__ import annotations

import argparse

import pytest

pytest.importorskip("transformers")

from vlmcp.bench.hf import bench_model, step  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402

pytestmark = pytest.mark.timeout(240)

SIZES = dict(hidden=32, layers=1, vit_width=16, vit_depth=1, vocab=1000)
TOKENS, IMAGES, SIDE, CHUNK = 384, 2, 8, 64


@pytest.fixture(scope="module")
def ranks():
    samples = step.row_samples(TOKENS, IMAGES, SIDE)
    return run_on_ranks(step._rank, 2, samples, SIZES, ["replicate", "shard"], ["chunked", "full"], CHUNK,
                        "replicate", 1, timeout=200)


def test_rows_cover_every_strategy_and_loss(ranks):
    rows = ranks[0]["rows"]
    assert [(r["loss"], r["strategy"], r["chosen"]) for r in rows] == [
        ("chunked", "replicate", "replicate"), ("chunked", "shard", "shard"),
        ("full", "replicate", "replicate"), ("full", "shard", "shard")]
    assert ranks[0]["tokens"] == TOKENS and ranks[0]["visual"] == IMAGES * SIDE * SIDE // 4


def test_the_step_trains_the_one_process_model(ranks):
    for row in ranks[0]["rows"]:
        assert row["grad_err"] < 1e-4, row["grad_err"]  # float32, after reduce_gradients


def test_peak_is_the_sum_of_its_terms(ranks):
    model = bench_model(**SIZES)
    numel = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    for row in ranks[0]["rows"]:
        for r in [row["single"], *row["ranks"]]:
            assert r["params"] == r["grads"] == 4 * numel and r["adamw"] == 8 * numel
            assert r["peak"] == r["saved"] + r["transient"] + 16 * numel
            assert 0 < r["head_saved"] < r["saved"]


def test_head_and_loss_counters(ranks):
    V = SIZES["vocab"]
    by = {(r["loss"], r["strategy"]): r for r in ranks[0]["rows"]}
    for strategy in ("replicate", "shard"):
        chunked, full = by[("chunked", strategy)], by[("full", strategy)]
        for c, f in zip(chunked["ranks"], full["ranks"], strict=True):
            assert c["slots"] == f["slots"] and c["targets"] == f["targets"] > 0
            # full logits: the float32 log-probabilities of every slot, N x V x 4 bytes, at least
            assert f["head_saved"] >= c["slots"] * V * 4
            # chunked: each target's row index, target (int64) and log-sum-exp (float32), and scalars
            assert 20 * c["targets"] <= c["head_saved"] <= 20 * c["targets"] + 64
            assert c["transient"] >= min(CHUNK, c["targets"]) * V * 4 > 0
            assert f["saved"] - f["head_saved"] == c["saved"] - c["head_saved"]  # the same body
    # sharding the image tokens makes the busiest rank's body save less than replicating them
    busiest = {k: max(r["saved"] - r["head_saved"] for r in row["ranks"]) for k, row in by.items()}
    assert busiest[("chunked", "shard")] < busiest[("chunked", "replicate")]
    single = by[("chunked", "replicate")]["single"]
    assert busiest[("chunked", "replicate")] < single["saved"] - single["head_saved"]


def test_the_table(ranks, monkeypatch, capsys):
    monkeypatch.setattr(step, "bench_ranks", lambda *a, **k: ranks)
    parser = argparse.ArgumentParser()
    step.add_arguments(parser)
    args = parser.parse_args(["--tokens", str(TOKENS), "--image-side", str(SIDE), "--strategies", "replicate",
                              "shard", "--repeats", "1", "--vocab", str(SIZES["vocab"])])
    assert step.run(args) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(lines) == 5 and lines[1].startswith("| chunked (1024) | replicate (replicate) |")
    assert lines[3].startswith("| full logits | replicate (replicate) |")


def test_flags_from_a_config_file(ranks, monkeypatch, capsys, tmp_path):
    from vlmcp.cli import main

    seen = {}

    def spawn(fn, P, samples, sizes, strategies, losses, chunk, mode, repeats, **kw):
        seen.update(P=P, sizes=sizes, strategies=strategies, chunk=chunk)
        return ranks

    monkeypatch.setattr(step, "bench_ranks", spawn)
    cfg = tmp_path / "step.yaml"
    cfg.write_text(f"tokens: {TOKENS}\nimage_side: {SIDE}\nstrategies: [replicate, shard]\nrepeats: 1\n"
                   f"vocab: {SIZES['vocab']}\nchunk-size: 64\n")
    assert main(["bench", "hf-step", "--config", str(cfg), "--cp", "2"]) == 0
    assert seen == dict(P=2, sizes=dict(hidden=256, layers=2, vit_width=64, vit_depth=1, vocab=1000),
                        strategies=["replicate", "shard"], chunk=64)
    assert "| chunked (64) | replicate (replicate) |" in capsys.readouterr().out


def test_bad_rows_are_refused():
    with pytest.raises(ValueError, match="--tokens 100 must split"):
        step.row_samples(100, 2, 32)
    with pytest.raises(ValueError, match="--image-side even"):
        step.row_samples(1024, 2, 7)
