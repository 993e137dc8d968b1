"""Instance ``forward``\\ s of vlmcp that the ``kernels`` package's kernelization must leave in place.

Note [vlmcp instance forwards and hub kernels]
----------------------------------------------
vlmcp replaces ``forward`` on some module instances: the CP token mixers (:mod:`vlmcp.hf.layers`:
Qwen3.5's Gated DeltaNet, Nemotron-H's Mamba-2, LFM2's short conv, Llama 4's chunked attention) and,
for float64 parity, the RMSNorms (:func:`vlmcp.debug.float64.float64_norms`). transformers
marks many classes with ``use_kernel_forward_from_hub`` (every RMSNorm, ``Qwen3_5GatedDeltaNet``,
the activations, ...), and the ``kernels`` package's ``kernelize`` rewrites each instance of such a
class: a hub kernel's ``forward``, or, where none applies (no kernel for the device: the CPU, no
network), its class's own, the instance's ``forward`` popped (``kernels``' ``_replace_forward``).

Up to transformers 5.24 that happened only for ``from_pretrained(..., use_kernels=True)``. From
5.25, ``from_pretrained`` kernelizes whenever ``kernels`` is installed (``use_kernels`` defaults to
True; transformers requires ``kernels`` now) and ``PreTrainedModel.train()``/``eval()`` kernelize
again on every change of mode (``kernels_mode``). So the first ``model.train()`` after
:func:`vlmcp.hf.parallelize` (``Trainer``'s training step, vlmcp's own evaluation) took vlmcp's
forwards back: Qwen3.5's Gated DeltaNet ran HF's one-process recurrence on each rank's slice (its
mark still saying vlmcp's was installed), and the float64 norms went back to float32 (the parity of
``CPTrainer`` with a plain ``Trainer``, tests/test_trainer.py, off by ~1e-8).

``kernelize`` skips an instance whose class's ``kernel_condition`` returns False (``kernels``'
per-instance opt-out). :func:`keep_instance_forward` marks the instance and wraps its class's
condition, once per class, to be False for marked instances: every other instance keeps its hub
kernels, in both modes. Where nothing kernelizes (transformers 5.24 by default, ``kernels`` absent,
``USE_HUB_KERNELS=0``) the wrapped condition is never read.
"""

from __future__ import annotations

from torch import nn

__all__ = ["keep_instance_forward", "keeps_instance_forward"]

_MARK = "_vlmcp_keeps_forward"
_WRAPPED = "_vlmcp_wrapped_condition"


def keeps_instance_forward(module: nn.Module) -> bool:
    """Whether ``module``'s own ``forward`` is exempt from kernelization (:func:`keep_instance_forward`)."""
    return bool(module.__dict__.get(_MARK, False))


def keep_instance_forward(module: nn.Module) -> None:
    """Exempt ``module`` (whose ``forward`` vlmcp replaced on the instance) from hub-kernel kernelization,
    that of ``from_pretrained`` and of every later ``train()``/``eval()`` (Note [vlmcp instance forwards
    and hub kernels]); other instances of its class are kernelized as before."""
    module.__dict__[_MARK] = True
    cls = type(module)
    if not hasattr(cls, "kernel_layer_name"):
        return  # not a hub-kernel layer: kernelize never touches its forward
    condition = getattr(cls, "kernel_condition", None)
    if getattr(condition, _WRAPPED, False):
        return  # this class (or a base) is wrapped already

    def kernel_condition(instance: nn.Module) -> bool:
        return not keeps_instance_forward(instance) and (condition is None or bool(condition(instance)))

    setattr(kernel_condition, _WRAPPED, True)
    cls.kernel_condition = staticmethod(kernel_condition)
