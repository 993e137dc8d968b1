"""What vlmcp needs to know about one Hugging Face VLM architecture.

An :class:`HFAdapter` names, for one family of ``config.model_type`` values:

* the language model (whose attention runs under CP) and the image placeholder token;
* the ViT calls: the base model's ``get_image_features`` (and ``get_video_features``)
  and which of their arguments are per-image (per-video) inputs, how many LLM tokens
  each image, video and frame group gives, and how to select a subset of them (per
  sample; ``scatter``'s ViT units) or build a one-image dummy (text-only rows);
* the vision modules (ViT + projector) and the projector's last ``nn.Linear``
  (``hidden_shard`` splits its output columns);
* the position ids of one sample, computed by the model's own code on the global row;
* which visual kind each placeholder token is (:meth:`HFAdapter.token_types`: 1 image,
  2 video, as ``mm_token_type_ids`` says);
* what each key of the processor's output is (:class:`InputKind`): per-token and sharded,
  per-token and consumed on the global row, per-image, per-video. ``shard_inputs``
  refuses any other key, naming it, rather than dropping it.

Videos (Note [vlmcp HF videos: frame groups are visual units]): an adapter that sets
``video_pixel_keys`` takes them; its ViT units are the video's temporal patch groups
(``frame_groups``, ``select_frames``), the granularity its ViT attends over.

:class:`PlaceholderAdapter` is the default for a model that merges image features at
its placeholder tokens (``get_placeholder_mask`` + ``masked_scatter``) and uses 1-D
positions: ``replicate`` works with it and nothing else is needed. The other vision
modes need the names above; see ``qwen2_vl.py`` and ``llava.py``, and for images whose
token count depends on their metadata (tiles, sizes) ``internvl.py``, ``llava_next.py``,
``idefics3.py`` and ``mistral3.py``. Whatever the adapter,
:func:`vlmcp.hf.parallelize` also audits the language model's token mixers (Note [vlmcp
HF token mixers]).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

__all__ = ["HFAdapter", "InputKind", "PlaceholderAdapter", "submodule"]


def fixed_image_tokens(config) -> int:
    """LLM tokens of one image of a LLaVA-style model: ``(image_size / patch_size)**2`` patches, plus
    CLS with the ``"full"`` feature strategy."""
    vc = config.vision_config
    per = (vc.image_size // vc.patch_size) ** 2
    return per + 1 if getattr(config, "vision_feature_select_strategy", "default") == "full" else per


def image_batch(pixels: Mapping[str, torch.Tensor], family: str, rows: str = "num_images") -> torch.Tensor:
    """``pixels["pixel_values"]``, checked to be ``(rows, channels, height, width)``."""
    pv = pixels.get("pixel_values")
    if pv is None or pv.dim() != 4:
        raise ValueError(f"{family} pixel_values must be ({rows}, channels, height, width), got "
                         f"{None if pv is None else tuple(pv.shape)}")
    return pv


def fixed_size_images(pixels: Mapping[str, torch.Tensor], config, family: str) -> torch.Tensor:
    """:func:`image_batch` of images all ``vision_config.image_size`` square (the processor resizes them)."""
    pv = image_batch(pixels, family)
    side = config.vision_config.image_size
    if tuple(pv.shape[2:]) != (side, side):
        raise ValueError(f"{family} pixel_values must be {side}x{side} images, got {tuple(pv.shape[2:])}")
    return pv


def select_rows(pixels: Mapping[str, torch.Tensor], index: Sequence[int]) -> dict:
    """``pixel_values`` rows ``index`` (one row per image or tile), in that order."""
    pv = pixels["pixel_values"]
    return {"pixel_values": pv[torch.as_tensor(index, dtype=torch.long, device=pv.device)]}


def blank_image(config, like: torch.Tensor, height: int, width: int) -> dict:
    """One zero image ``(1, channels, height, width)`` in ``like``'s dtype and device (a dummy ViT pass)."""
    return {"pixel_values": torch.zeros(1, config.vision_config.num_channels, height, width, dtype=like.dtype,
                                        device=like.device)}


def padded_cat(tensors: Sequence[torch.Tensor], dims: Sequence[int]) -> torch.Tensor:
    """Concatenate on dim 0 after zero-padding each of ``dims`` (negative, counted from the end) to the
    largest size among ``tensors``: images of different sizes in one batch, as the processor pads them."""
    most = {d: max(t.shape[d] for t in tensors) for d in dims}
    padded = []
    for t in tensors:
        pad = [0] * (2 * t.dim())
        for d in dims:
            pad[2 * (-d - 1) + 1] = most[d] - t.shape[d]
        padded.append(torch.nn.functional.pad(t, pad))
    return torch.cat(padded)


def submodule(model: nn.Module, path: str) -> nn.Module:
    """``model.get_submodule(path)`` with an error that names the architecture."""
    try:
        return model.get_submodule(path)
    except AttributeError as e:
        raise ValueError(f"{type(model).__name__} has no submodule {path!r}: not the layout this "
                         "architecture's vlmcp adapter expects") from e


class InputKind(enum.Enum):
    """What one key of the processor's output is, and so what ``shard_inputs`` does with it."""

    TOKENS = "tokens"
    """Per-token ``(1, L)``: sharded like ``input_ids`` (padding slots get the pad token for
    ``input_ids``, 0 otherwise) and passed to the model."""
    CONSUMED = "consumed"
    """Per-token ``(1, L)``, read on the global row and not passed on: ``attention_mask``
    (must be all ones: the plan is the mask), ``mm_token_type_ids`` (0 text, 1 image, 2 video:
    the position ids' token types; must agree with :meth:`HFAdapter.token_types`), ``token_type_ids``
    (Gemma 3: 1 exactly at the image tokens, checked; the plan's images are the bidirectional blocks)."""
    IMAGE = "image"
    """Per-image: passed whole to every rank (the ViT call's inputs, :attr:`HFAdapter.pixel_keys`)."""
    VIDEO = "video"
    """Per-video: passed whole to every rank (``get_video_features``' inputs and Qwen2.5-VL's
    ``second_per_grid_ts``) where the adapter takes videos (:attr:`HFAdapter.video_pixel_keys`);
    refused (``NotImplementedError``) where it does not."""


@dataclass(frozen=True, kw_only=True)
class HFAdapter:
    """Base class: the names every adapter fills in, and the placeholder-merge defaults."""

    name: str
    """Display name, e.g. ``"qwen2_vl"``."""
    model_types: tuple[str, ...]
    """``config.model_type`` values this adapter serves."""
    pixel_keys: tuple[str, ...] = ("pixel_values",)
    """Per-image inputs of ``model(**inputs)`` (and of ``get_image_features``), in order
    (:attr:`InputKind.IMAGE`); the first one is present whenever the row has images."""
    token_keys: tuple[str, ...] = ("input_ids",)
    """Per-token inputs sharded and passed to the model (:attr:`InputKind.TOKENS`)."""
    consumed_keys: tuple[str, ...] = ("attention_mask",)
    """Per-token inputs read on the global row and not passed on (:attr:`InputKind.CONSUMED`):
    ``attention_mask``, and ``mm_token_type_ids`` where ``position_ids`` reads it."""
    video_keys: tuple[str, ...] = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
    """Per-video inputs (:attr:`InputKind.VIDEO`): passed whole to the model where the adapter
    takes videos (``video_pixel_keys``), refused otherwise."""
    video_pixel_keys: tuple[str, ...] = ()
    """Per-video inputs of ``get_video_features``, in order (a subset of ``video_keys``; the
    first one is present whenever the row has videos). Empty: videos are refused."""
    mixes_images_and_videos: bool = True
    """False where the model's own forward cannot merge images and videos in one row (GLM-4.1V
    fills both at the image placeholder): ``shard_inputs`` refuses such a row."""
    base_model: str = "model"
    """The base model: it owns ``get_image_features`` (the ViT call) and the merge."""
    language_model: str = "model.language_model"
    """The decoder whose attention runs under CP."""
    lm_head: str = "lm_head"
    """The LM head, an ``nn.Linear`` the top-level forward calls once on the last hidden states and
    returns as ``logits`` (:func:`vlmcp.hf.causal_lm_loss` runs the chunked loss in its place)."""
    logit_softcap: str | None = None
    """A text-config field (``final_logit_softcapping``) whose value the top-level forward applies
    to the head's output (``cap * tanh(logits / cap)``): :func:`vlmcp.hf.causal_lm_loss` computes
    the chunked loss with that cap and sets the field to None for its one call of the forward.
    None: the forward returns the head's output as it is (any change is refused)."""
    vision_modules: tuple[str, ...] = ()
    """ViT + projector submodules (their parameters get the vision mode's gradient rule)."""
    vision_params: tuple[str, ...] = ()
    """Parameters of the base model itself that belong to the vision side, each of the features'
    width in its last dimension (LLaVA-NeXT's ``model.image_newline``, appended after the
    projector): they take the vision mode's gradient rule, and ``hidden_shard`` keeps this
    rank's columns of them, the columns its slice of the projector computes."""
    projector_last: str | None = None
    """The projector's last ``nn.Linear`` (``hidden_shard`` keeps 1/P of its output columns;
    ``broadcast`` and ``scatter`` need it too, for the features' dtype and device)."""
    features_per_image: bool = True
    """``get_image_features``' ``pooler_output`` is a tuple of per-image tensors (HF's usual
    form); False: one tensor of every image token (InternVL's forward calls ``.to`` on it)."""
    video_features_batched: bool = False
    """``get_video_features``' ``pooler_output`` is one ``(videos, tokens, D)`` tensor the forward
    flattens (LLaVA-OneVision), not a tuple per video."""
    deepstack_output: str | None = None
    """Field of ``get_image_features``' output holding extra feature levels besides
    ``pooler_output`` (Qwen3-VL's ``deepstack_features``: one entry per level, split per
    image like ``pooler_output``, added at the image tokens of early LLM layers). Every
    level follows the vision mode of the main features (Note [vlmcp HF vision placement])."""

    image_attention: Literal["causal", "bidirectional"] = "causal"
    """How the language model's image tokens attend: ``"causal"`` like text, or ``"bidirectional"``
    within each image (Gemma 3: every token of an image sees the whole image; an image is one
    visual unit of the plan, ``image_ids``)."""

    def __post_init__(self) -> None:
        if self.image_attention not in ("causal", "bidirectional"):
            raise ValueError(f"adapter {self.name!r}: image_attention must be 'causal' or 'bidirectional', "
                             f"got {self.image_attention!r}")
        if "input_ids" not in self.token_keys:
            raise ValueError(f"adapter {self.name!r}: token_keys must hold 'input_ids', "
                             f"got {self.token_keys}")
        if not self.pixel_keys:
            raise ValueError(f"adapter {self.name!r}: pixel_keys is empty")
        keys = self.token_keys + self.consumed_keys + self.pixel_keys + self.video_keys
        if not set(self.video_pixel_keys) <= set(self.video_keys):
            raise ValueError(f"adapter {self.name!r}: video_pixel_keys {self.video_pixel_keys} must be "
                             f"among video_keys {self.video_keys}")
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"adapter {self.name!r}: input keys {twice} are in more than one of token_keys, "
                             "consumed_keys, pixel_keys and video_keys")

    def input_kind(self, key: str) -> InputKind | None:
        """What ``inputs[key]`` is for this architecture; None: the adapter does not handle it (refused)."""
        for kind, keys in ((InputKind.TOKENS, self.token_keys), (InputKind.CONSUMED, self.consumed_keys),
                           (InputKind.IMAGE, self.pixel_keys), (InputKind.VIDEO, self.video_keys)):
            if key in keys:
                return kind
        return None

    def vision_module_paths(self, model: nn.Module) -> tuple[str, ...]:
        """The vision modules ``model`` has: :attr:`vision_modules`, and where an architecture's configs
        build some only (Nemotron-H-Omni's ``vision_final_layernorm``), the adapter adds those present."""
        return self.vision_modules

    @property
    def vision_modes(self) -> tuple[str, ...]:
        """The vision modes this adapter supports."""
        if not self.vision_modules:
            return ("replicate",)
        if self.projector_last is None:
            return ("replicate", "allreduce_hook")
        return ("replicate", "allreduce_hook", "broadcast", "scatter", "hidden_shard")

    @property
    def takes_videos(self) -> bool:
        """Whether ``shard_inputs`` accepts videos for this architecture."""
        return bool(self.video_pixel_keys) and bool(self.vision_modules)

    def image_token_id(self, config) -> int:
        """The placeholder token the merge fills with image features."""
        tid = getattr(config, "image_token_id", None)
        if tid is None:
            tid = getattr(config, "image_token_index", None)
        if tid is None:
            raise ValueError(f"{type(config).__name__} has no image_token_id: not a placeholder-merge VLM")
        return int(tid)

    def video_token_id(self, config) -> int:
        """The placeholder token the video merge fills (Qwen-VL: ``video_token_id``)."""
        tid = getattr(config, "video_token_id", None)
        if tid is None:
            raise ValueError(f"{type(config).__name__} has no video_token_id")
        return int(tid)

    def token_types(self, config, input_ids: torch.Tensor, mm_token_type_ids: torch.Tensor | None,
                    videos: bool) -> torch.Tensor:
        """``IntTensor[L]``: 0 text, 1 image, 2 video placeholder for each token of the row.

        The default reads the placeholders (image and video tokens differ); an adapter whose
        video frames reuse the image placeholder reads ``mm_token_type_ids`` instead.

        Args:
            config: the model's config.
            input_ids: ``LongTensor[L]`` on the CPU.
            mm_token_type_ids: the processor's ``IntTensor[L]`` (CPU) or None; checked by the caller.
            videos: whether the row has video inputs.
        """
        types = (input_ids == self.image_token_id(config)).int()
        if self.takes_videos:
            types = types.masked_fill(input_ids == self.video_token_id(config), 2)
        return types

    def image_tokens(self, model: nn.Module, pixels: Mapping[str, torch.Tensor]) -> list[int] | None:
        """LLM tokens of each image, from metadata only; None when the adapter cannot tell."""
        return None

    def row_image_tokens(self, model: nn.Module, pixels: Mapping[str, torch.Tensor],
                         is_image: torch.Tensor) -> list[int] | None:
        """LLM tokens of each image read from the row itself, where :meth:`image_tokens` has no rule
        (None: it cannot tell either). Called on the global row, before any collective.

        The default (Note [vlmcp HF long tail: image tokens from the row]): when the first pixel key has
        one row per image and the row's image placeholders form exactly that many maximal runs, run
        ``i`` is image ``i``; otherwise None.

        Args:
            model: the top-level model.
            pixels: the row's per-image inputs.
            is_image: ``BoolTensor[L]``, the row's image placeholders.
        """
        pv = pixels.get(self.pixel_keys[0])
        if pv is None or pv.dim() < 2:
            return None
        flags = is_image.to(torch.int8)
        starts = torch.nonzero(flags[1:] > flags[:-1]).flatten() + 1
        if bool(flags[0]):
            starts = torch.cat([torch.zeros(1, dtype=starts.dtype), starts])
        ends = torch.nonzero(flags[:-1] > flags[1:]).flatten() + 1
        if bool(flags[-1]):
            ends = torch.cat([ends, torch.tensor([flags.numel()], dtype=ends.dtype)])
        if starts.numel() != pv.shape[0] or starts.numel() == 0:
            return None
        return (ends - starts).tolist()

    def select_images(self, pixels: Mapping[str, torch.Tensor], index: list[int]) -> dict:
        """The per-image inputs of images ``index`` (in that order)."""
        raise NotImplementedError(f"the {self.name} adapter cannot split images")

    def video_tokens(self, model: nn.Module, videos: Mapping[str, torch.Tensor]) -> list[int]:
        """LLM tokens of each video, from metadata only."""
        raise NotImplementedError(f"the {self.name} adapter takes no videos")

    def select_videos(self, videos: Mapping[str, torch.Tensor], index: list[int]) -> dict:
        """The per-video inputs (every ``video_keys`` entry present) of videos ``index``, in that order."""
        raise NotImplementedError(f"the {self.name} adapter takes no videos")

    def frame_groups(self, model: nn.Module, videos: Mapping[str, torch.Tensor]) -> list[tuple[int, int]]:
        """Per video, ``(groups, tokens per group)``: its temporal patch groups, the ViT's units."""
        raise NotImplementedError(f"the {self.name} adapter takes no videos")

    def select_frames(self, videos: Mapping[str, torch.Tensor], units: list[tuple[int, int]]) -> dict:
        """``get_video_features``' inputs of the frame groups ``units`` (``(video, group)`` pairs),
        whose features are theirs in that order."""
        raise NotImplementedError(f"the {self.name} adapter takes no videos")

    def dummy_images(self, model: nn.Module) -> dict:
        """Per-image inputs of one small blank image (for the dummy ViT pass of text-only rows)."""
        raise NotImplementedError(f"the {self.name} adapter has no dummy image")

    def concat_images(self, parts: Sequence[Mapping[str, torch.Tensor]]) -> dict:
        """The per-image inputs of several samples packed into one row, in sample order (what
        :meth:`select_images` takes apart again): by default every key concatenated on dim 0."""
        parts = [p for p in parts if p]
        return {k: torch.cat([p[k] for p in parts]) for k in (parts[0] if parts else {})}

    def concat_videos(self, parts: Sequence[Mapping[str, torch.Tensor]]) -> dict:
        """The per-video inputs of several videos packed into one row, in row order (what
        :meth:`select_videos` takes apart again): every key concatenated on dim 0."""
        return HFAdapter.concat_images(self, parts)

    def deepstack_projectors(self, model: nn.Module) -> tuple[str, ...]:
        """The last ``nn.Linear`` of each ``deepstack_output`` level, in level order
        (``hidden_shard`` keeps 1/P of their output columns too); empty without deepstack."""
        return ()

    def projector_paths(self, model: nn.Module) -> list[str]:
        """The projector's module paths, the ``projector`` part of :mod:`vlmcp.hf.freeze` (and of
        LoRA's targets): for :attr:`projector_last` and each deepstack projector, its vision module
        where the adapter lists it as a vision module of its own (LLaVA's ``multi_modal_projector``),
        else the child of the vision module on the path to it (Qwen-VL's ``visual.merger``).

        Raises:
            ValueError: a projector layer in none of the vision modules.
        """
        paths = self.vision_module_paths(model)
        out = []
        for last in (self.projector_last, *self.deepstack_projectors(model)):
            owner = next((p for p in paths if last.startswith(p + ".")), None)
            if owner is None:
                raise ValueError(f"the projector last layer {last!r} lies in none of the vision modules "
                                 f"{paths} (vlmcp adapter {self.name!r})")
            if len(paths) > 1 and owner != paths[0]:
                out.append(owner)
            else:  # one vision module holds ViT and projector: its child on the way to the last layer
                out.append(owner + "." + last[len(owner) + 1:].split(".")[0])
        return list(dict.fromkeys(out))

    def position_ids(self, model: nn.Module, input_ids: torch.Tensor, token_type: torch.Tensor,
                     pixels: Mapping[str, torch.Tensor],
                     videos: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Position ids ``(R, Ls)`` of one sample ``input_ids (Ls,)`` on its own (R = 1, or 3 for M-RoPE).

        Args:
            model: the top-level model.
            input_ids: the sample's tokens.
            token_type: ``IntTensor[Ls]``, 0 text, 1 image, 2 video (``mm_token_type_ids``).
            pixels: the per-image inputs of the sample's images only.
            videos: the per-video inputs of the sample's videos only (None: no video).
        """
        return torch.arange(input_ids.numel(), device=input_ids.device).unsqueeze(0)

    def model_position_ids(self, local: torch.Tensor) -> torch.Tensor:
        """Sharded ids ``(R, N)`` in the shape ``model(position_ids=...)`` takes."""
        return local  # (1, N): batch 1

    def check_row(self, model: nn.Module, keys: Sequence[str], has_images: bool) -> None:
        """Raise if ``shard_inputs`` cannot reproduce the model's forward on a row of these input
        ``keys`` (the default accepts every row the generic checks accept)."""

    def prepare_model(self, model: nn.Module) -> None:
        """Ready the top-level ``model`` in place, once, after the token-mixer audit passed and before
        ``parallelize`` changes anything else (Llama 4: mend transformers' forward). Default: nothing."""

    def auxiliary_loss(self, model: nn.Module, output, weights: torch.Tensor, group) -> torch.Tensor | None:
        """This rank's share of what the model's forward adds to the token loss besides it (a MoE
        router's load-balancing loss), or None (:func:`vlmcp.hf.causal_lm_loss`).

        The default adds nothing and refuses an output that carries an ``aux_loss``: the model's
        own forward would add it to its loss, and vlmcp does not know how to split it over the group.

        Args:
            model: the top-level model.
            output: ``model(**batch.model_inputs)``'s output.
            weights: ``BoolTensor[N]``, the local slots that count once over the CP group.
            group: the CP group, or None.
        """
        if getattr(output, "aux_loss", None) is not None:
            raise NotImplementedError(
                f"{type(model).__name__} (vlmcp adapter {self.name!r}) returns an auxiliary loss (aux_loss: "
                "output_router_logits is set) that its own forward adds to the loss, and the adapter does "
                "not say how to compute it under CP; set output_router_logits=False or register an adapter "
                "whose auxiliary_loss handles it")
        return None


@dataclass(frozen=True, kw_only=True)
class PlaceholderAdapter(HFAdapter):
    """Any VLM that merges at its placeholder tokens with 1-D positions: ``replicate`` only.

    Note [vlmcp HF long tail: image tokens from the row]
    ----------------------------------------------------
    An architecture without an adapter has no metadata rule for an image's token count. Its row
    still says it: HF's processors write each image's placeholders as one run (LLaVA and the models
    built like it), so when ``pixel_values`` has one row per image and the row has exactly as many
    runs (:meth:`HFAdapter.row_image_tokens`), run ``i`` is image ``i``. That is all packing needs:
    which images each sample takes (the per-sample reference, ``select_images``' rows), and a
    mismatch raises before any collective. Where the runs do not match the rows (tiles written as
    several runs), a packed row with images in more than one sample is refused by name. HF's own
    merge then runs on every rank's local row (``replicate``), as with any placeholder model.
    """

    name: str = "placeholder"
    model_types: tuple[str, ...] = ()

    def select_images(self, pixels, index):
        """Rows ``index`` of every per-image input (one row per image, as :meth:`row_image_tokens` found)."""
        take = torch.as_tensor(index, dtype=torch.long)
        return {k: v[take.to(v.device)] for k, v in pixels.items()}
