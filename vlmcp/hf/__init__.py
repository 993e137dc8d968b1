"""Hugging Face transformers VLMs under vlmcp context parallelism (``pip install vlmcp[hf]``).

Two calls put a Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V, Qwen3.5, LFM2-VL, Gemma 3, LLaVA,
LLaVA-NeXT/OneVision, InternVL, SmolVLM/Idefics3, Mistral3, Kimi-K2.5 or Nemotron-H-Omni model on a
CP group::

    vlmcp.hf.parallelize(model, cp_group, attention="ring", vision_mode="replicate")
    batch = vlmcp.hf.shard_inputs(model, inputs, cp_group, labels=labels, cu_seqlens=None,
                                  image_strategy="replicate")  # or "shard", "auto"
    loss, mean = vlmcp.hf.causal_lm_loss(model, batch, cp_group)  # never the (N, vocab) logits
    loss.backward()
    vlmcp.reduce_gradients(model, cp_group)

* :func:`parallelize` (:mod:`vlmcp.hf.parallel`): vlmcp's attention for the language
  model only (:mod:`vlmcp.hf.attention`), the vision mode (:mod:`vlmcp.hf.vision_placement`).
* :func:`shard_inputs` (:mod:`vlmcp.hf.inputs`): labels and positions on the global row,
  then this rank's slots; images and videos (:mod:`vlmcp.hf.visual_tokens`: which tokens are
  which image, video and frame group) replicated or sharded with the text.
* :func:`causal_lm_loss` (:mod:`vlmcp.hf.lm_loss`): the model's forward with the LM head computed
  by :func:`vlmcp.cp_linear_cross_entropy`, a chunk of tokens at a time, FSDP2-safe; MoE
  auxiliary losses as the model adds them (:mod:`vlmcp.hf.moe_aux`).
* :func:`offload_activations` (:mod:`vlmcp.hf.offload`): the forward's saved tensors (checkpointed
  blocks' inputs) in pinned host memory until backward.
* :mod:`vlmcp.hf.moe`: expert parallelism for MoE language models (``parallelize(..., ep_group=)``),
  its groups, FSDP2 units, full-expert checkpoints and per-expert token counts.
* :mod:`vlmcp.hf.adapters`: what each architecture needs (:class:`InputKind`: what each
  input key is); :func:`register_adapter` adds one.
* :mod:`vlmcp.hf.layers.audit`: the token-mixer audit ``parallelize`` runs (anything but softmax
  attention mixing tokens is refused, named); :func:`register_mixer` declares a CP
  implementation of a mixer class.
* The tooling (tiny configs, synthetic rows, float64 parity, ``init-model``) is
  :mod:`vlmcp.debug`, a package above this one: it imports ``vlmcp.hf``, never the reverse.
"""

from vlmcp.hf.adapters import (
    HFAdapter,
    InputKind,
    PlaceholderAdapter,
    adapter_for,
    register_adapter,
    supported_model_types,
)
from vlmcp.hf.attention import CPContext
from vlmcp.hf.inputs import HFBatch, shard_inputs, shift_hf_labels
from vlmcp.hf.layers.audit import register_mixer
from vlmcp.hf.lm_loss import causal_lm_loss
from vlmcp.hf.offload import offload_activations
from vlmcp.hf.parallel import HFParallel, parallel_state, parallelize

__all__ = [
    "CPContext", "HFAdapter", "HFBatch", "HFParallel", "InputKind", "PlaceholderAdapter",
    "adapter_for", "causal_lm_loss", "offload_activations", "parallel_state", "parallelize",
    "register_adapter", "register_mixer", "shard_inputs", "shift_hf_labels", "supported_model_types",
]

