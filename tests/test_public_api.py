"""The names DESIGN.md section 5 promises, at the top of the package, with their signatures."""

import inspect
import subprocess
import sys

import vlmcp


def test_design_contract_names():
    assert list(inspect.signature(vlmcp.plan_cp).parameters)[:4] == [
        "is_image", "cp_size", "cu_seqlens", "image_strategy"]
    plan_params = inspect.signature(vlmcp.plan_cp).parameters
    assert plan_params["image_strategy"].default == "replicate"
    # beyond the contract: image identity (issue 9) and whole-sample placement (issue 12)
    assert plan_params["image_ids"].default is None and plan_params["sample_placement"].default == "split"
    params = inspect.signature(vlmcp.cp_attention).parameters
    assert list(params)[:6] == ["q", "k", "v", "shard", "group", "backend"]
    assert params["backend"].default == "ring"
    for name in vlmcp.__all__:
        assert getattr(vlmcp, name) is not None


def test_cli_has_the_design_subcommands():
    out = subprocess.run([sys.executable, "-m", "vlmcp", "--help"], capture_output=True, text=True,
                         timeout=120).stdout
    for command in ("train", "verify", "plan", "bench", "compare"):
        assert command in out
