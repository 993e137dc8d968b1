"""Rank functions for cp_token_logprobs, per_sample_sum and a DPO loss under CP (importable by name).

The reference is the unmodified model on one process, each sample of the packed row alone
(HF's own positions and merge); the CP side is ``parallelize`` + ``shard_inputs``, the log-probs
from the logits and, chunked, from the last hidden states and the LM head's weight.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.nn import functional as F

import vlmcp
import vlmcp.hf
from vlmcp.debug.float64 import float64_exact, float64_norms
from vlmcp.debug.parity.hf import _sample_inputs, compare_gradients
from vlmcp.debug.synthetic import synthetic_row
from vlmcp.debug.tiny import tiny_model
from vlmcp.hf.inputs import shift_hf_labels

# Two preference pairs packed in one row: (chosen, rejected) with an image prompt, then two
# text-only answers; samples 0/1 and 2/3 are the pairs.
PAIRS = ((5, (1, 4, 4), 9), (5, (1, 4, 4), 7), (12,), (10,))
REFERENCE_SUMS = torch.tensor([-30.0, -31.0, -20.0, -19.5], dtype=torch.float64)
BETA = 0.1


def dpo_loss(sums: torch.Tensor, reference: torch.Tensor, beta: float = BETA) -> torch.Tensor:
    """``-mean logsigmoid(beta * ((s_c - ref_c) - (s_r - ref_r)))`` over the pairs (chosen: even indices)."""
    margin = (sums - reference.to(sums))
    return -F.logsigmoid(beta * (margin[0::2] - margin[1::2])).mean()


def _one_process_sums(model, inputs, labels, cu) -> torch.Tensor:
    """Each sample's summed target log-probs, the sample run alone through the unmodified model."""
    sums = []
    for s, sample in enumerate(_sample_inputs(model, inputs, cu)):
        a, b = int(cu[s]), int(cu[s + 1])
        tgt = shift_hf_labels(labels[0, a:b], torch.tensor([0, b - a]))
        logp = torch.log_softmax(model(**sample).logits[0], dim=-1)
        picked = logp.gather(1, tgt.clamp(min=0)[:, None]).squeeze(1)
        sums.append(torch.where(tgt != -100, picked, torch.zeros_like(picked)).sum())
    return torch.stack(sums)


def dpo_grid(group: dist.ProcessGroup, cases: list[tuple[str, str, str]]) -> list[dict]:
    """``(arch, attention, source)`` with source ``"logits"`` or ``"hidden"`` (chunked head): the CP
    DPO loss and every gradient against one process."""
    out, refs = [], {}
    for arch, attention, source in cases:
        if arch not in refs:
            ref = tiny_model(arch, torch.float64)
            float64_norms(ref)
            row = synthetic_row(ref, PAIRS, seed=3)
            with float64_exact(torch.float64):
                sums = _one_process_sums(ref, *row)
                loss = dpo_loss(sums, REFERENCE_SUMS)
                loss.backward()
            refs[arch] = (ref, row, sums.detach(), loss.detach())
        ref, (inputs, labels, cu), ref_sums, ref_loss = refs[arch]
        model = copy.deepcopy(ref)
        for p in model.parameters():
            p.grad = None
        vlmcp.hf.parallelize(model, group, attention=attention)
        with float64_exact(torch.float64):
            batch = vlmcp.hf.shard_inputs(model, inputs, group, labels=labels, cu_seqlens=cu)
            res = model(**batch.model_inputs, output_hidden_states=source == "hidden")
            if source == "hidden":
                logp = vlmcp.cp_token_logprobs(res.hidden_states[-1][0], batch.labels, group,
                                               weight=model.lm_head.weight, chunk_size=3)
            else:
                logp = vlmcp.cp_token_logprobs(res.logits[0], batch.labels, group)
            sums = vlmcp.per_sample_sum(logp, batch.shard, group)
            loss = dpo_loss(sums, REFERENCE_SUMS)
            loss.backward()
        vlmcp.reduce_gradients(model, group)
        err, worst = compare_gradients(model, ref, group)
        out.append({"case": (arch, attention, source), "max_rel_grad_error": err, "worst_param": worst,
                    "sums_error": float((sums.detach() - ref_sums).abs().max() / ref_sums.abs().max()),
                    "loss_rel_error": abs(float(loss.detach()) - float(ref_loss)) / abs(float(ref_loss)),
                    "loss": float(loss.detach())})
    return out
