"""``vlmcp.hf.causal_lm_loss``: a HF VLM's next-token loss on a CP rank, without the full logits.

Note [vlmcp HF causal LM loss: the chunked loss runs as the LM head]
--------------------------------------------------------------------
Every top-level ``...ForConditionalGeneration.forward`` vlmcp serves ends the same way
(transformers 5.24)::

    hidden = self.model(...)[0]                      # (1, N, H), after the final norm
    logits = self.lm_head(hidden)                    # (1, N, V): what the chunked loss avoids
    return Output(logits=logits, ...)                # (+ MoE aux_loss from router logits)

:func:`causal_lm_loss` calls ``model(**batch.model_inputs)`` unchanged, with the LM head's
``forward`` replaced, for that one call, by :func:`vlmcp.cp_linear_cross_entropy` of its input,
its weight and bias, and the batch's labels: the head returns this rank's loss share instead
of logits. So:

* every part of the model runs as HF wrote it (vision merge, deepstack, M-RoPE, hybrid
  layers, any config field read by the body), and the head is exactly ``nn.Linear``;
  anything that would change the head's output after it (a softcap, a logit scale, a
  cast) is caught: the forward must return the head's output object itself as ``logits``,
  else the call raises, naming the model class. A tanh softcap the adapter names
  (:attr:`~vlmcp.hf.HFAdapter.logit_softcap`, Gemma 4's ``final_logit_softcapping``) is computed
  by the chunked loss itself (``softcap=``), with the config field set to None for the one call
  so the forward leaves the head's output alone. Gemma 3's ``final_logit_softcapping`` is
  applied by ``Gemma3ForCausalLM`` only, not by the VLM's forward, so it does not change
  a Gemma 3 VLM's logits (tested);
* tied embeddings need nothing: the head's weight *is* the embedding's parameter;
* FSDP2 (NeMo Automodel #3414: a chunked loss reading ``lm_head.weight`` outside the
  forward trains the head on a shard, or on an unsharded copy whose gradient never
  reaches the sharded parameter): the loss runs inside the head module's call, inside
  the root's forward. ``head.weight`` is then the unsharded parameter FSDP all-gathered
  (the head's own unit or the root's), the loss tensor is the module's output on which
  FSDP registers its pre-backward unshard, and the head's gradient lands in the unsharded
  parameter's ``.grad``, which FSDP reduce-scatters after backward, exactly as for logits.
  Tested at DP=2 x CP=2 against one process, the head in the root's unit and in its own;
* MoE auxiliary losses: whatever the model's forward would add to the loss for the row
  (:meth:`~vlmcp.hf.HFAdapter.auxiliary_loss`; an output with an ``aux_loss`` the adapter
  does not handle is refused).

A forward hook on the head other than torch.distributed's (FSDP), or a ``forward`` already
replaced on it (accelerate's device hooks), is refused: vlmcp would bypass it.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.hf.adapters import submodule
from vlmcp.hf.inputs import HFBatch
from vlmcp.hf.moe_aux import token_weights
from vlmcp.hf.parallel import parallel_state
from vlmcp.hf.peft import unwrap_peft
from vlmcp.loss import CPLoss, cp_cross_entropy, cp_linear_cross_entropy

__all__ = ["causal_lm_loss"]


def _foreign_hooks(head: nn.Module) -> list[str]:
    hooks = [*head._forward_pre_hooks.values(), *head._forward_hooks.values()]
    return [getattr(h, "__qualname__", repr(h)) for h in hooks
            if not getattr(h, "__module__", "").startswith("torch.distributed.")]


def _check_head(model: nn.Module, path: str) -> nn.Module:
    head = submodule(model, path)
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{type(model).__name__}.{path} is a {type(head).__name__}, not an nn.Linear: "
                         "causal_lm_loss computes the head as hidden @ weight.T + bias; use chunk_size=None "
                         "(the full logits) for this model (a LoRA-wrapped head, say)")
    if "forward" in vars(head):
        raise ValueError(f"{type(model).__name__}.{path}.forward is replaced on the module (accelerate's "
                         "device hooks do this): causal_lm_loss would bypass it; use chunk_size=None")
    foreign = _foreign_hooks(head)
    if foreign:
        raise ValueError(f"{type(model).__name__}.{path} has forward hooks {foreign}: causal_lm_loss runs "
                         "the loss in the head's place and they would see a loss, not logits; remove them or "
                         "use chunk_size=None")
    return head


@contextlib.contextmanager
def _softcap_in_loss(model: nn.Module, field: str | None):
    """Yields the cap of the text config's ``field`` (None: no field or no cap), the field set to
    None inside, so that the forward returns the head's output (the loss) unchanged."""
    config = model.config.get_text_config() if field else None
    cap = getattr(config, field, None) if field else None
    if cap is None:
        yield None
        return
    setattr(config, field, None)
    try:
        yield float(cap)
    finally:
        setattr(config, field, cap)


@contextlib.contextmanager
def _head_returns_loss(head: nn.Module, labels: torch.Tensor, group, chunk_size: int,
                       softcap: float | None = None):
    """For the calls inside it, ``head(hidden)`` returns :func:`cp_linear_cross_entropy`'s loss; the
    :class:`CPLoss` of each call is appended to the yielded list."""
    results: list[CPLoss] = []

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        if hidden.dim() != 3 or hidden.shape[0] != 1 or hidden.shape[1] != labels.numel():
            raise ValueError(f"the LM head got hidden states of shape {tuple(hidden.shape)}, expected "
                             f"(1, {labels.numel()}, hidden): one row of this rank's slots")
        res = cp_linear_cross_entropy(hidden[0], head.weight, labels, group, bias=head.bias,
                                      chunk_size=chunk_size, softcap=softcap)
        results.append(res)
        return res.loss

    head.forward = forward
    try:
        yield results
    finally:
        del head.forward


def causal_lm_loss(model: nn.Module, batch: HFBatch, cp_group: dist.ProcessGroup | None, *,
                   chunk_size: int | None = 4096) -> CPLoss:
    """This rank's share of the row's next-token loss, the LM head computed a chunk at a time.

    ``loss.backward()`` then gives every parameter (the head's included) its share, as
    ``cp_cross_entropy(model(**batch.model_inputs).logits[0], batch.labels, cp_group)`` does,
    without ever holding the ``(N, vocab)`` logits: Note [vlmcp HF causal LM loss: the chunked
    loss runs as the LM head]. Works on the model as :func:`vlmcp.hf.parallelize` left it, and
    after ``fully_shard`` (FSDP2).

    Args:
        model: a model passed to :func:`vlmcp.hf.parallelize` with ``cp_group`` (its top-level
            module, the one FSDP's root wraps).
        batch: :func:`vlmcp.hf.shard_inputs`' output for this rank.
        cp_group: the CP group (None: one process).
        chunk_size: target tokens per chunk of logits (Note [vlmcp chunked linear
            cross-entropy]); None: the full-logits path (``model(...).logits`` and
            :func:`vlmcp.cp_cross_entropy`), for comparison.

    Returns:
        :class:`~vlmcp.CPLoss`: ``loss`` to backpropagate (plus the rank's share of a MoE
        auxiliary loss where the model's forward adds one) and ``mean``, the group's mean token
        loss (without the auxiliary loss), for logging.

    Raises:
        ValueError: the group is not the model's, labels that do not match the batch, a head
            that is not a plain ``nn.Linear`` or carries hooks, a forward that changes the head's
            output before returning it (a logit softcap or scale).
        NotImplementedError: an auxiliary loss the adapter does not handle.
    """
    state = parallel_state(model)
    if cp_group is not state.group:
        raise ValueError("cp_group is not the group this model was parallelized for")
    adapter = state.adapter
    labels = batch.labels
    if labels.shape != (batch.shard.num_tokens,):
        raise ValueError(f"batch.labels has shape {tuple(labels.shape)}, expected "
                         f"({batch.shard.num_tokens},)")
    if chunk_size is None:
        out = model(**batch.model_inputs)
        res = cp_cross_entropy(out.logits[0], labels, cp_group)
    else:
        head = _check_head(unwrap_peft(model), adapter.lm_head)
        with (_softcap_in_loss(unwrap_peft(model), adapter.logit_softcap) as softcap,
              _head_returns_loss(head, labels, cp_group, chunk_size, softcap) as results):
            out = model(**batch.model_inputs)
        if len(results) != 1 or out.logits is not results[0].loss:
            raise ValueError(
                f"{type(model).__name__}.forward called {adapter.lm_head} {len(results)} time(s) and "
                "returned something else than its output as logits (a softcap, scale or cast of the "
                "logits?): "
                "causal_lm_loss cannot reproduce it; use chunk_size=None (the full logits)")
        res = results[0]
    aux = adapter.auxiliary_loss(unwrap_peft(model), out, token_weights(batch.shard, cp_group), cp_group)
    if aux is None:
        return res
    return CPLoss(res.loss + aux.to(res.loss.dtype), res.mean)
