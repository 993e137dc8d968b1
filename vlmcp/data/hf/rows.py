"""Conversations packed into rows of ``seq_len`` tokens, and the loader that feeds the ranks.

Note [vlmcp data: HF rows, epochs and who decodes the images]
-------------------------------------------------------------
*Planning* (:func:`build_index`, once, before any rank starts): every line is read and
checked, and each conversation's token count is computed from its text, its images'
sizes and its videos' frame counts, frame rates and sizes (file headers only; Note
[vlmcp data: video frames, sizes and tokens]). Conversations longer than ``seq_len`` and
conversations with an image or video whose header cannot be read (or whose size the
processor refuses) are skipped, counted and named (with ``strict``, an error). The rest are
packed first-fit by length, longest first, into rows (for GLM-4.1V, whose forward cannot take
images and videos in one row, conversations with videos and the others apart); an image is
never cut because a conversation is never cut::

    seq_len = 100, lengths 70 60 40 30 20  ->  row 0: [70 | 30]   row 1: [60 | 40]   row 2: [20 | pad 80]

Each row is filled to ``seq_len`` with one padding sample (pad tokens, no target). Last, the
first conversation of each kind (text only, images, videos, ...) is encoded as training will
encode it, pixels and processor included, and compared with its plan
(:func:`vlmcp.data.hf.planned.check_planned`): a plan the processor would not follow is refused
here, naming ``file:line``, not at step 1 on every rank.

*Order*: the run reads an endless sequence of rows; global row ``g`` is row
``perm[g % rows]`` of epoch ``g // rows``, ``perm`` a permutation seeded with ``(seed, epoch)``.
A step of D data-parallel replicas takes the next D rows (replica d the d-th), so the
*data position* (rows consumed) is the one integer a checkpoint stores, and a run
resumed at another DP size continues the same sequence. The row is a pure function of
``(seed, g)``: every rank of a CP group computes the same one.

*Decoding*: each rank builds its own row (PIL and PyAV decode + the processor's image
transform, the same for video frames) in a background thread of :class:`RowLoader`,
``prefetch`` steps ahead of the training step, so the next rows are ready when a step
ends. The ranks of a CP group decode the same images and videos (cheap against the
model's step for images; for long videos it is the price of no broadcast of pixels).

*A bad image or video at training* (header fine, pixels not: a truncated JPEG or MP4):
the row is built without that conversation (more padding), never with a hole.
:func:`build_row` is a pure function of ``(row, exclude)`` and of which images and videos
decode, so ranks that see the same bytes build the same row; the training step still
agrees on the skips over the CP group before sharding
(:func:`vlmcp.train.specs.hf.agree.agree_on_skips`), so that one rank's flaky read cannot leave
the group training on different rows.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, replace

import numpy as np
import torch

from vlmcp.data.hf.encode import EncodedSample, planned_tokens, sample_length
from vlmcp.data.hf.image_bounds import ImageBounds
from vlmcp.data.hf.planned import DataIndex, check_planned, encode_planned
from vlmcp.data.hf.schema import Conversation, ConversationSet, MediaError, Skipped
from vlmcp.data.hf.truncate import plan_cut
from vlmcp.data.hf.video import VideoSampling, video_rules
from vlmcp.layout.labels import IGNORE_INDEX

__all__ = ["HFRow", "RowLoader", "build_index", "build_row", "cat_padded", "pack_first_fit", "pack_samples",
           "row_at"]


def pack_first_fit(lengths: list[int], seq_len: int) -> list[list[int]]:
    """First-fit decreasing: sample indices per row, each row's total ``<= seq_len``.

    Every length must be ``<= seq_len``. Ties keep file order; rows keep their samples
    in file order.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(seq_len - lengths[i])
    return [sorted(r) for r in rows]


def build_index(processor, data: ConversationSet | list[Conversation], seq_len: int, *,
                strict: bool = False, source: str = "--data",
                video: VideoSampling | None = None, images: ImageBounds | None = None,
                truncate: bool = False) -> DataIndex:
    """Token counts, skips and the packing of ``data``'s conversations into rows of ``seq_len``.

    Args:
        processor: the model's processor.
        data: the conversations read.
        seq_len: tokens per row.
        strict: raise on a conversation that would be skipped.
        source: how errors name the data.
        video: how videos are sampled (``--video-*``; default :class:`VideoSampling`'s).
        images: the pixel bounds images are scaled into (``--image-*-pixels``; default none).
        truncate: cut a conversation longer than ``seq_len`` (:mod:`vlmcp.data.hf.truncate`)
            instead of skipping it; one that cannot be cut is skipped as too long, with why.

    Raises:
        ValueError: with ``strict``, for the first conversation longer than ``seq_len`` or
            with an unusable image or video; without, when no conversation is left to train on;
            naming ``file:line`` when the processor writes other tokens than planned for the
            first conversation of a kind (:func:`vlmcp.data.hf.planned.check_planned`).
    """
    video = video or VideoSampling()
    images = images or ImageBounds()
    if not isinstance(data, ConversationSet):
        data = ConversationSet(conversations=list(data))
    kept, lengths, too_long, unreadable, cuts = [], [], [], [], []
    for conv in data.conversations:
        try:
            n = sample_length(processor, conv, video, images)
        except MediaError as err:
            if strict:
                raise ValueError(f"{err} (drop --strict to skip such conversations)") from None
            unreadable.append(Skipped(conv.where, err.reason))
            continue
        cut, why = None, ""
        if n > seq_len and truncate:
            _, ids, trained = planned_tokens(processor, conv, video, images)
            cut = plan_cut(processor, conv, ids, trained, seq_len)
            if isinstance(cut, str):
                why, cut = f"; {cut}", None
            else:
                n = cut.tokens
        if n > seq_len:
            if strict:
                raise ValueError(f"{conv.where}: the conversation is {n} tokens, longer than "
                                 f"--seq-len {seq_len}{why} (drop --strict to skip such conversations)")
            too_long.append(Skipped(conv.where, f"{n} tokens{why}"))
            continue
        kept.append(conv)
        lengths.append(n)
        cuts.append(cut)
    if not kept:
        first = (unreadable or too_long or [None])[0]
        raise ValueError(f"{source}: none of the {len(data.conversations)} conversations can be trained on: "
                         f"{len(too_long)} longer than --seq-len {seq_len}, {len(unreadable)} with an "
                         "unusable image or video"
                         + (f" (the first, {first.where}: {first.reason})" if first else ""))
    index = DataIndex(conversations=kept, lengths=lengths, rows=_pack(processor, kept, lengths, seq_len),
                      seq_len=seq_len, too_long=tuple(too_long), unreadable=tuple(unreadable),
                      format_skipped=tuple(data.skipped),
                      dropped_turns=sum(c.dropped_turns for c in kept), video=video, images=images,
                      cuts=tuple(cuts) if any(c is not None for c in cuts) else ())
    check_planned(processor, index)
    return index


def _pack(processor, conversations: list[Conversation], lengths: list[int], seq_len: int) -> list[list[int]]:
    """:func:`pack_first_fit`; for a model whose forward cannot take images and videos in one row
    (GLM-4.1V), the conversations with videos and the others packed apart, rows of each kind in turn."""
    if not any(c.videos for c in conversations) or video_rules(processor).mixes_images_and_videos:
        return pack_first_fit(lengths, seq_len)
    rows = []
    for kind in (False, True):
        keep = [i for i, c in enumerate(conversations) if bool(c.videos) == kind]
        rows += [[keep[j] for j in row] for row in pack_first_fit([lengths[i] for i in keep], seq_len)]
    return rows


def row_at(index: DataIndex, seed: int, position: int) -> int:
    """Which row of :attr:`DataIndex.rows` global row ``position`` is (a pure function: resumable)."""
    epoch, k = divmod(position, len(index.rows))
    return int(np.random.default_rng([seed, epoch]).permutation(len(index.rows))[k])


@dataclass(frozen=True, eq=False)
class HFRow:
    """One packed row, in the form ``vlmcp.hf.shard_inputs`` takes.

    Attributes:
        inputs: ``input_ids (1, L)``, ``attention_mask (1, L)``, the images' and videos'
            processor outputs concatenated in row order (``pixel_values``, ``image_grid_thw``,
            ``pixel_values_videos``, ``video_grid_thw``, ``second_per_grid_ts``),
            ``mm_token_type_ids (1, L)`` (``token_type_ids (1, L)``, Gemma 3) where the processor
            makes them.
        labels: ``LongTensor[1, L]``, unshifted, ``-100`` off the trained tokens.
        cu_seqlens: ``IntTensor[S+1]``; the padding sample is the last.
        tokens: tokens of real conversations (the padding excluded).
        index: the row's index in :attr:`DataIndex.rows`.
        skipped: the row's conversations (indices into :attr:`DataIndex.conversations`)
            left out: asked to (``exclude``) or an image or video failed to decode.
        failures: why, for those that failed here: ``Skipped(file:line, reason)``.
    """

    inputs: dict[str, torch.Tensor]
    labels: torch.Tensor
    cu_seqlens: torch.Tensor
    tokens: int
    index: int
    skipped: tuple[int, ...] = ()
    failures: tuple[Skipped, ...] = ()


def build_row(processor, index: DataIndex, row: int, exclude: frozenset[int] = frozenset()) -> HFRow:
    """Decode and process row ``row``'s conversations and pack them (padding to ``seq_len``).

    A conversation in ``exclude``, or whose image or video fails to decode, is left out (the
    row gets more padding); the result is a pure function of the arguments and of which
    images and videos decode.
    """
    samples: list[EncodedSample] = []
    skipped, failures = [], []
    for i in index.rows[row]:
        conv = index.conversations[i]
        if i in exclude:
            skipped.append(i)
            continue
        try:
            sample = encode_planned(processor, index, i)
        except MediaError as err:
            skipped.append(i)
            failures.append(Skipped(conv.where, err.reason))
            continue
        samples.append(sample)
    inputs, labels, cu = pack_samples(processor, samples, index.seq_len)
    return HFRow(inputs=inputs, labels=labels, cu_seqlens=cu, tokens=sum(len(s) for s in samples), index=row,
                 skipped=tuple(skipped), failures=tuple(failures))


def pack_samples(processor, samples: list[EncodedSample], seq_len: int | None = None
                 ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Encoded conversations -> one packed row: ``(inputs, labels (1, L), cu_seqlens)``, as :class:`HFRow`.

    Samples follow each other in order; with ``seq_len``, one padding sample (pad tokens, no
    target) fills the row to that length (None: no padding, L is the samples' total).
    """
    used = sum(len(s) for s in samples)
    pad = 0 if seq_len is None else seq_len - used
    if pad < 0:
        raise ValueError(f"{used} tokens do not fit a row of {seq_len}")
    pad_id = processor.tokenizer.pad_token_id
    pad_id = 0 if pad_id is None else pad_id
    ids = [s.input_ids for s in samples] + [torch.full((pad,), pad_id, dtype=torch.long)]
    labels = [s.labels for s in samples] + [torch.full((pad,), IGNORE_INDEX, dtype=torch.long)]
    lens = [len(s) for s in samples] + ([pad] if pad else [])
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens, dtype=torch.long).cumsum(0)
    input_ids = torch.cat(ids)[None]
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    for key in _PER_TOKEN_TYPES:  # per token, like input_ids; the padding sample is text (0)
        if getattr(samples[0], key) is not None if samples else key in _token_type_keys(processor):
            inputs[key] = torch.cat([getattr(s, key) for s in samples] +
                                    [torch.zeros(pad, dtype=torch.long)])[None]
    for key in dict.fromkeys(k for s in samples for k in s.pixels):
        inputs[key] = cat_padded([s.pixels[key] for s in samples if key in s.pixels])
    return inputs, torch.cat(labels)[None], cu


def cat_padded(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)`` along dim 0, each part zero-padded at the end of every other dim to the
    largest: a processor that pads within a call pads across the row's samples the same way
    (LLaVA-OneVision's ``pixel_values (images, max_tiles, 3, H, W)``: the model reads each image's
    first tiles, as many as its ``image_sizes`` give). Per-image and per-sample keys
    (``image_sizes``, ``image_grid_thw``, ``batch_num_images``) and flat patches have equal
    trailing dims and concatenate unchanged."""
    most = [max(p.shape[d] for p in parts) for d in range(1, parts[0].dim())]
    padded = []
    for p in parts:
        pad = [x for d in reversed(range(1, p.dim())) for x in (0, most[d - 1] - p.shape[d])]
        padded.append(torch.nn.functional.pad(p, pad) if any(pad) else p)
    return torch.cat(padded)


_PER_TOKEN_TYPES = ("mm_token_type_ids", "token_type_ids")


def _token_type_keys(processor) -> set[str]:
    """Which of :data:`_PER_TOKEN_TYPES` the processor returns (a row with no conversation left)."""
    return set(_PER_TOKEN_TYPES) & set(processor(text=["x"], return_tensors="pt"))


class RowLoader:
    """The rows of DP replica ``dp_rank`` for ``steps`` steps from data position ``start``.

    Step k takes global row ``start + k * dp + dp_rank``; rows are built ``prefetch`` ahead.

    A daemon thread builds the rows (see Note [vlmcp data: HF rows, epochs and who
    decodes the images]); :meth:`next` returns them in step order. An error while
    building is raised by the :meth:`next` that would have returned that row.
    :meth:`rebuild` builds a row again without some conversations (the CP group's agreed
    skips), under the same lock as the thread, so that two threads never use the processor at once.
    """

    def __init__(self, processor, index: DataIndex, *, seed: int, dp: int, dp_rank: int, start: int,
                 steps: int, prefetch: int = 2) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._processor, self._index = processor, index
        positions = [start + k * dp + dp_rank for k in range(steps)]
        self._thread = threading.Thread(target=self._work, args=(seed, positions), daemon=True,
                                        name="vlmcp-rows")
        self._thread.start()

    def _work(self, seed, positions) -> None:
        for position in positions:
            try:
                with self._lock:
                    item = build_row(self._processor, self._index, row_at(self._index, seed, position))
            except Exception as err:  # handed to the training thread
                item = err
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._stop.is_set() or isinstance(item, Exception):
                return

    def next(self) -> HFRow:
        item = self._queue.get()
        if isinstance(item, Exception):
            raise item
        return item

    def rebuild(self, row: HFRow, exclude: frozenset[int]) -> HFRow:
        """``row`` built again leaving out ``exclude``; its earlier failures are kept."""
        with self._lock:
            again = build_row(self._processor, self._index, row.index, exclude)
        return replace(again, failures=row.failures + again.failures)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
