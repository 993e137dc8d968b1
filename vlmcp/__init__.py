"""vlmcp: context parallelism for vision-language models.

Image embeddings stay complete on every rank of a CP group; only text is sharded,
zigzag per sample, so causal attention work stays balanced and the text loss
reaches the projector and the ViT exactly.

The data flow, one entry point per step:

1. :func:`plan_cp` -> :class:`CPPlan`; ``plan.for_rank(r)`` -> :class:`RankShard`
   (which global tokens rank r holds; ``shard.shard(x)`` selects them). Targets and
   positions come from the global row first: :func:`shift_labels`,
   :func:`position_ids`, :func:`mrope_position_ids`. :func:`attended_pairs` counts
   each rank's attention work; ``image_strategy="auto"`` lets a :class:`CostModel`
   choose between replicating and sharding image tokens per row
   (:func:`choose_image_strategy`).
2. :func:`place_vision` spreads a :class:`VisionEncoder` (ViT + projector) over the CP
   group in one of five modes; ``encoder(images)`` returns the complete image
   embeddings on every rank.
3. :func:`merge_embeddings` puts them into a rank's local row (:class:`VLM` is the
   reference model that does all of this).
4. :func:`cp_attention`: exact attention over the whole row, ring, Ulysses or both (USP);
   :func:`reference_attention` is the dense single-process ground truth.
5. :func:`cp_cross_entropy`: the rank's loss share, normalized over the CP group;
   :func:`cp_linear_cross_entropy` computes the LM head and that loss a chunk of tokens at
   a time, never the ``N x V`` logits;
   :func:`cp_token_logprobs` and :func:`per_sample_sum`: per-token log-probs and per-sample
   sums over the whole row, for RL and preference losses.
6. :func:`reduce_gradients`: per-rank shares -> exact gradients (sum over CP, mean
   over DP, each parameter by its rule).

:func:`unshard` is the collective inverse of ``shard`` (evaluation).
"""

import importlib

_LAZY = {name: module for module, names in (
    ("vlmcp.attention", ("cp_attention", "reference_attention", "varlen_attention")),
    ("vlmcp.grads", ("GradRule", "ddp_ignored_params", "finish_ddp_gradients", "reduce_gradients")),
    ("vlmcp.layout", ("IGNORE_INDEX", "CostModel", "CPPlan", "RankShard", "TokenKind", "WorkReport",
                      "attended_pairs", "choose_image_strategy", "mrope_position_ids", "plan_cp",
                      "position_ids", "shift_labels", "unshard")),
    ("vlmcp.loss", ("CPLoss", "cp_cross_entropy", "cp_linear_cross_entropy", "cp_token_logprobs",
                    "per_sample_sum")),
    ("vlmcp.models", ("VLM", "VLMConfig", "merge_embeddings")),
    ("vlmcp.vision", ("VisionConfig", "VisionEncoder", "check_images_match", "place_vision")),
) for name in names}
"""Public name -> the module that defines it. Imported on first use (PEP 562), so that ``import
vlmcp`` and ``vlmcp --help`` do not pay for torch."""

__version__ = "0.2.0"

__all__ = [
    "IGNORE_INDEX", "VLM", "CPLoss", "CPPlan", "CostModel", "GradRule", "RankShard", "TokenKind",
    "VLMConfig", "VisionConfig", "VisionEncoder", "WorkReport", "attended_pairs",
    "check_images_match", "choose_image_strategy", "cp_attention", "cp_cross_entropy",
    "cp_linear_cross_entropy", "cp_token_logprobs", "ddp_ignored_params", "finish_ddp_gradients",
    "merge_embeddings", "mrope_position_ids", "per_sample_sum", "place_vision", "plan_cp", "position_ids",
    "reduce_gradients", "reference_attention",
    "shift_labels", "unshard", "varlen_attention",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # once
        return value
    try:  # a subpackage used as an attribute (``vlmcp.hf`` after ``import vlmcp``)
        return importlib.import_module(f"vlmcp.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"vlmcp.{name}":
            raise
    raise AttributeError(f"module 'vlmcp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
