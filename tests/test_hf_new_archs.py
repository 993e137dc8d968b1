"""Issue 27's architectures under vlmcp: exact against the unmodified transformers model, or refused.

Tiny random models built in code (``tests/hf_archs.py``: NEW_ARCHS): GLM-4.5V (``glm4v_moe``: an MoE
language model), GLM-4.6V (``glm46v``). One spawned group per world size runs the whole grid
(``tests/hf_new_cases.py``); every case compares loss and every parameter's gradient in float64
with the unmodified model on a packed row with a text-only sample.
"""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("transformers")

import vlmcp.hf  # noqa: E402
from tests import hf_new_cases  # noqa: E402
from tests.hf_archs import NEW_ARCHS  # noqa: E402
from vlmcp.hf.debug.parity import HFParityCase  # noqa: E402
from vlmcp.hf.debug.tiny import tiny_arch, tiny_model  # noqa: E402
from vlmcp.testing import run_on_ranks  # noqa: E402

MODES = ("replicate", "allreduce_hook", "broadcast", "scatter", "hidden_shard")


def _case(arch, attention="ring", mode="replicate", strategy="replicate", placement="split"):
    return HFParityCase(model=f"hf:{arch}", attention=attention, vision_mode=mode,
                        samples=tiny_arch(arch).samples, image_strategy=strategy, sample_placement=placement)


def _modes(arch):
    return vlmcp.hf.adapter_for(tiny_model(arch)).vision_modes


def _failures(results: list[dict]) -> list[str]:
    return [f"{r['model']} {r['attention']} {r['vision_mode']} {r['image_strategy']} "
            f"{r['sample_placement']}: "
            f"loss {r['loss_rel_error']:.1e}, grad {r['max_rel_grad_error']:.1e} ({r['worst_param']})"
            for r in results if not r["passed"]]


P2_CASES = (
    [_case(a, "ring", m) for a in NEW_ARCHS for m in _modes(a)]
    + [_case(a, "ulysses", "hidden_shard" if "hidden_shard" in _modes(a) else "scatter") for a in NEW_ARCHS]
    + [_case(a, "ulysses", "broadcast", "shard") for a in NEW_ARCHS]
)
P3_CASES = [_case(a, b, m) for a, (b, m) in zip(NEW_ARCHS, itertools.cycle((("ulysses", "scatter"),
                                                                          ("ring", "broadcast"))))]
AUX_ARCHS = [a for a in NEW_ARCHS if a in hf_new_cases.MOE_AUX]


@pytest.fixture(scope="module")
def p2():
    return run_on_ranks(hf_new_cases.suite, 2, P2_CASES, AUX_ARCHS, timeout=300)[0]


@pytest.mark.timeout(330)
def test_parity_p2_every_arch_mode_and_backend(p2):
    results = p2["parity"]
    assert len(results) == len(P2_CASES)
    assert not _failures(results), "\n".join(_failures(results))
    for r in results:
        assert r["vision_params_with_grad"] > 0, r
    assert {r["model"] for r in results} == {f"hf:{a}" for a in NEW_ARCHS}


@pytest.mark.timeout(270)
def test_parity_p3():
    results = run_on_ranks(hf_new_cases.parity_grid, 3, P3_CASES, timeout=240)[0]
    assert len(results) == len(P3_CASES)
    assert not _failures(results), "\n".join(_failures(results))


@pytest.mark.timeout(330)
def test_moe_router_aux_loss_matches_the_model(p2):
    assert [r["arch"] for r in p2["aux"]] == AUX_ARCHS
    for r in p2["aux"]:
        assert r["aux"] > 0.1 and r["loss_err"] < 1e-12 and r["max_grad_err"] < 1e-10, r


def test_adapters_are_registered():
    """Mistral 4's checkpoints are Mistral3 models (a mistral4 text config): Mistral3's adapter."""
    for arch in NEW_ARCHS:
        model = tiny_model(arch)
        adapter = vlmcp.hf.adapter_for(model)
        want = "mistral3" if arch == "mistral4" else arch
        assert adapter.name == want == model.config.model_type and want in vlmcp.hf.supported_model_types()
        for path in adapter.vision_modules:
            model.get_submodule(path)
