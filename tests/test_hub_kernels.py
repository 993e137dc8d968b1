"""vlmcp's instance forwards survive hub-kernel kernelization.

Note [vlmcp instance forwards and hub kernels] (vlmcp/hf/hub_kernels.py).

From transformers 5.25 (which requires the ``kernels`` package), ``from_pretrained`` kernelizes and every
``train()``/``eval()`` that changes the mode kernelizes again, which put the class's ``forward`` back on
each hub-kernel layer: Qwen3.5's Gated DeltaNet lost its CP forward after ``parallelize`` (Trainer's
``model.train()``), and ``float64_norms``' norms went back to float32 (tests/test_trainer.py off by ~1e-8).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytest.importorskip("transformers")

from vlmcp.debug.float64 import float64_norms  # noqa: E402
from vlmcp.debug.init_model import init_model  # noqa: E402
from vlmcp.deps import at_least  # noqa: E402

KERNELS = importlib.util.find_spec("kernels") is not None


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _load(tmp_path, arch):
    from transformers import AutoModelForImageTextToText

    path = str(init_model(arch, tmp_path / arch))
    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float64, attn_implementation="sdpa")


def _own_forward(module) -> str:
    forward = module.__dict__.get("forward")
    return getattr(getattr(forward, "__func__", forward), "__name__", "")


def _mode_changes_kernelize(model) -> None:
    """train() then eval(), and (with ``kernels``) an explicit kernelize per mode, as any release may run."""
    model.train()
    if KERNELS and at_least("transformers", "5.25"):
        from kernels import Mode

        assert model.use_kernels and model.kernels_mode == Mode.TRAINING  # 5.25 did kernelize again
    model.eval()
    if KERNELS:
        from kernels import Mode, kernelize

        for mode in (Mode.TRAINING, Mode.INFERENCE):
            kernelize(model, mode=mode, device="cpu")


def test_float64_norms_stay_through_train_and_eval(tmp_path):
    model = _load(tmp_path, "qwen2_vl")
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    assert float64_norms(model) == len(norms) > 0
    _mode_changes_kernelize(model)
    assert [_own_forward(m) for m in norms] == ["_rms_norm"] * len(norms)
    x = torch.randn(3, norms[0].weight.numel(), dtype=torch.float64,
                    generator=torch.Generator().manual_seed(0))
    x.requires_grad_(True)
    (norms[0](x) * torch.linspace(0.1, 1, x.shape[-1], dtype=torch.float64)).sum().backward()
    assert not torch.equal(x.grad, x.grad.float().double())  # float32's island rounded it


@pytest.mark.skipif(not KERNELS, reason="kernels is not installed (transformers 5.25 requires it)")
def test_unmarked_instances_of_a_kept_class_are_still_kernelized(tmp_path):
    from kernels import Mode, kernelize

    model = _load(tmp_path, "qwen2_vl")
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    float64_norms(norms[0])
    norms[1].forward = lambda hidden_states: hidden_states  # not vlmcp's: kernelize replaces it
    kernelize(model, mode=Mode.TRAINING, device="cpu")
    assert _own_forward(norms[0]) == "_rms_norm" and "forward" not in norms[1].__dict__


def test_parallelized_gated_deltanet_keeps_its_cp_forward_through_train_and_eval(tmp_path):
    import vlmcp.hf

    model = _load(tmp_path, "qwen3_5")
    vlmcp.hf.parallelize(model, None)
    mixers = [m for m in model.modules() if type(m).__name__ == "Qwen3_5GatedDeltaNet"]
    assert mixers and [_own_forward(m) for m in mixers] == ["cp_forward"] * len(mixers)
    _mode_changes_kernelize(model)
    assert [_own_forward(m) for m in mixers] == ["cp_forward"] * len(mixers)
