"""``make gpu-bench``'s script runs on the CPU (``--tiny``), so it is ready when a GPU is lent: the
parity rows compare a second kernel with the CPU path, and the step rows carry every figure."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "scripts" / "gpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
def test_gpu_bench_runs_its_whole_table_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert _script().main(["--tiny", "--lengths", "256", "--repeats", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    math = {r["dtype"]: r for r in rows["parity"] if r["check"] == "attention math"}
    # the math kernel against flash_cpu in float64
    assert math["float32"]["worst"] < 1e-5 and math["bfloat16"]["worst"] < 3e-2
    (step,) = rows["steps"]
    assert step["tokens"] == 256 and step["seconds"] > 0 and step["tokens_per_s"] > 0
    assert step["predicted_bytes"] > 0 and step["mfu"] is None  # no known peak on the CPU
    printed = capsys.readouterr().out
    assert "1. kernel parity" in printed and "256 tokens:" in printed


def test_model_flops_of_the_3b_shapes():
    """6N per token for the dense part, 12 x hidden x causal pairs per layer for attention."""
    bench = _script()
    from transformers import Qwen2_5_VLConfig

    shapes = bench.QWEN25_VL_3B
    config = Qwen2_5_VLConfig(text_config=shapes["text"], vision_config=shapes["vision"])
    t = config.text_config
    per_layer = 2048 * (16 + 4) * 128 + 2048 ** 2 + 3 * 2048 * 11008
    tokens = 8192
    llm = (6 * per_layer * 36 * tokens + 12 * 36 * 2048 * tokens * (tokens + 1) / 2
           + 6 * 2048 * t.vocab_size * tokens)
    patches = 64 * 64  # its attention counted as full
    vit = 6 * (4 * 1280 ** 2 + 3 * 1280 * 3420) * 32 * patches + 12 * 32 * 1280 * patches ** 2
    assert bench.model_flops(config, tokens, 64) == pytest.approx(llm + vit, rel=1e-12)
    assert vit < 0.15 * llm
    assert bench.peak_flops(__import__("torch").device("cpu")) is None
