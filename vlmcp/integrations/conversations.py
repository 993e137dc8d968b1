"""``vlmcp train``'s data files as a Trainer dataset, and the collator that packs a batch into one row.

:class:`ConversationDataset` reads the same files as ``vlmcp train --data`` (every format of
:mod:`vlmcp.data.hf.formats`, checked line by line; conversations longer than ``max_tokens``
or with an unreadable image or video skipped and counted, as there) and holds one
conversation per item, or with ``rows=True`` one of ``vlmcp train``'s planned rows (its
conversations packed first-fit into ``max_tokens``) per item.

:class:`ConversationCollator` turns a batch of items into the model's inputs through the
model's processor and chat template (labels on the trained messages only, Note [vlmcp data:
trained tokens from the chat template]):

* ``pack=True`` (CP): the batch's conversations, in order, packed into one row ``(1, L)``
  with ``cu_seqlens``, what :func:`vlmcp.hf.shard_inputs` takes; samples never attend to
  each other and their positions restart;
* ``pack=False``: the usual padded batch ``(B, L_max)`` with an ``attention_mask``, one row per
  conversation, for a plain ``Trainer`` on the same files (the reference of the tests).

TRL's ``SFTTrainer`` wants a ``datasets.Dataset``: :meth:`ConversationDataset.as_hf_dataset`
gives one whose rows are indices, which the collator built with ``dataset=`` resolves.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from vlmcp.data.hf.encode import EncodedSample, encode_conversation
from vlmcp.data.hf.planned import DataIndex
from vlmcp.data.hf.reader import read_conversations
from vlmcp.data.hf.rows import build_index, cat_padded, pack_samples
from vlmcp.data.hf.schema import Conversation
from vlmcp.data.hf.video import VideoSampling
from vlmcp.layout.labels import IGNORE_INDEX

__all__ = ["ConversationCollator", "ConversationDataset"]


class ConversationDataset(torch.utils.data.Dataset):
    """The kept conversations of a planned dataset, one per item (or one planned row per item).

    Args:
        index: :func:`vlmcp.data.hf.rows.build_index`'s plan.
        rows: items are ``vlmcp train``'s packed rows (tuples of conversations), not single
            conversations; use ``per_device_train_batch_size=1`` to train exactly its rows.
    """

    def __init__(self, index: DataIndex, *, rows: bool = False) -> None:
        self.index, self.rows = index, rows

    @classmethod
    def from_files(cls, paths: str | os.PathLike | Sequence[str | os.PathLike], processor, max_tokens: int, *,
                   rows: bool = False, image_root: str | os.PathLike | None = None, strict: bool = False,
                   video: VideoSampling | None = None) -> ConversationDataset:
        """Read and plan ``paths`` as ``vlmcp train --data paths --seq-len max_tokens`` does.

        Raises:
            ValueError: what ``vlmcp train`` refuses (naming ``file:line``); with ``strict``, a
                conversation that would be skipped.
        """
        data = read_conversations(paths, image_root=image_root)
        return cls(build_index(processor, data, max_tokens, strict=strict, source=str(paths), video=video),
                   rows=rows)

    def __len__(self) -> int:
        return len(self.index.rows) if self.rows else len(self.index.conversations)

    def __getitem__(self, i: int) -> Conversation | tuple[Conversation, ...]:
        if self.rows:
            return tuple(self.index.conversations[c] for c in self.index.rows[i])
        return self.index.conversations[i]

    def as_hf_dataset(self):
        """A ``datasets.Dataset`` of one ``index`` column (TRL's trainers take no other kind); pass
        ``ConversationCollator(..., dataset=self)`` and ``remove_unused_columns=False``."""
        import datasets

        return datasets.Dataset.from_dict({"index": list(range(len(self)))})


class ConversationCollator:
    """A batch of conversations -> one packed row with ``cu_seqlens`` (or a padded batch).

    Args:
        processor: the model's processor (with its chat template).
        pack: one packed row ``(1, L)`` with ``cu_seqlens`` (CP); False: a padded ``(B, L_max)`` batch.
        dataset: resolves items that are indices (``{"index": i}`` or ``i``) of it.
        video: how videos are sampled (default: the dataset's, else :class:`VideoSampling`'s).

    Items are a :class:`~vlmcp.data.hf.schema.Conversation`, a tuple of them (a planned row),
    or an index into ``dataset``. A conversation whose image or video cannot be decoded raises
    :class:`~vlmcp.data.hf.encode.MediaError` naming ``file:line`` (the ranks of a CP group
    decode the same conversations, so they fail together).
    """

    def __init__(self, processor, *, pack: bool = True, dataset: ConversationDataset | None = None,
                 video: VideoSampling | None = None) -> None:
        self.processor, self.pack, self.dataset = processor, pack, dataset
        self.video = video or (dataset.index.video if dataset is not None else VideoSampling())

    def _conversations(self, item: Any) -> list[Conversation]:
        if isinstance(item, dict) and set(item) == {"index"}:
            item = item["index"]
        if isinstance(item, int) and not isinstance(item, bool):
            if self.dataset is None:
                raise TypeError("an item is an index: build the collator with dataset=the "
                                "ConversationDataset")
            item = self.dataset[item]
        if isinstance(item, Conversation):
            return [item]
        if isinstance(item, tuple) and all(isinstance(c, Conversation) for c in item):
            return list(item)
        keys = f" with keys {sorted(item)}" if isinstance(item, dict) else ""
        raise TypeError(f"ConversationCollator takes Conversations, tuples of them or dataset indices, got "
                        f"{type(item).__name__}{keys}")

    def __call__(self, features: list[Any]) -> dict[str, torch.Tensor]:
        samples = [encode_conversation(self.processor, c, self.video)
                   for item in features for c in self._conversations(item)]
        if not samples:
            raise ValueError("ConversationCollator: an empty batch")
        if self.pack:
            inputs, labels, cu = pack_samples(self.processor, samples)
            return {**inputs, "labels": labels, "cu_seqlens": cu}
        return _padded(self.processor, samples)


def _padded(processor, samples: list[EncodedSample]) -> dict[str, torch.Tensor]:
    """``(B, L_max)`` right-padded: pad tokens, attention mask 0 and no target at the padding."""
    longest = max(len(s) for s in samples)
    pad_id = processor.tokenizer.pad_token_id
    pad_id = 0 if pad_id is None else pad_id

    def rows(values: list[torch.Tensor], fill: int) -> torch.Tensor:
        return torch.stack([torch.cat([v, v.new_full((longest - v.numel(),), fill)]) for v in values])

    out = {"input_ids": rows([s.input_ids for s in samples], pad_id),
           "attention_mask": rows([torch.ones_like(s.input_ids) for s in samples], 0),
           "labels": rows([s.labels for s in samples], IGNORE_INDEX)}
    for key in ("mm_token_type_ids", "token_type_ids"):
        if getattr(samples[0], key) is not None:
            out[key] = rows([getattr(s, key) for s in samples], 0)
    for key in dict.fromkeys(k for s in samples for k in s.pixels):
        out[key] = cat_padded([s.pixels[key] for s in samples if key in s.pixels])
    return out
