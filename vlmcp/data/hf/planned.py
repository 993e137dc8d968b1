"""The planned dataset (:class:`DataIndex`), and its tokens held to the processor's: one conversation
encoded as its row will encode it, and the first conversation of each kind encoded at planning,
before any rank starts.

:func:`vlmcp.data.hf.rows.build_index` plans the dataset (Note [vlmcp data: HF rows, epochs and
who decodes the images]); the rows are built from it at training.

Planning counts tokens from headers (:func:`vlmcp.data.hf.encode.planned_tokens`); training
decodes the pixels and calls the processor (:func:`vlmcp.data.hf.encode.encode_conversation`),
which refuses a conversation whose tokens differ from the planned ones. Such a difference is
never one conversation's fault: it is vlmcp's expansion against this transformers version's
processor (Note [vlmcp data: the processor's own expansion]), so it would fail every row of
that kind. :func:`check_planned` finds it at planning: it encodes the first conversation of
each kind (text only, one image, several, one video, several, both; pre-training lines apart)
as training will, and a difference is a one-line error naming ``file:line``, not a traceback
on a rank at step 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmcp.data.hf.encode import EncodedSample, encode_conversation
from vlmcp.data.hf.image_bounds import ImageBounds
from vlmcp.data.hf.schema import Conversation, MediaError, Skipped
from vlmcp.data.hf.truncate import Cut, cut_sample
from vlmcp.data.hf.video import VideoSampling

__all__ = ["DataIndex", "check_planned", "encode_planned"]


@dataclass(frozen=True)
class DataIndex:
    """The planned dataset (see Note [vlmcp data: HF rows, epochs and who decodes the images]).

    Attributes:
        conversations: the kept conversations.
        lengths: their token counts.
        rows: indices into ``conversations`` per row.
        seq_len: tokens per row.
        too_long: conversations longer than ``seq_len``, skipped.
        unreadable: conversations skipped at planning for an image or video (header
            unreadable, a size the processor refuses, too few frames); the reason names it.
        format_skipped: lines a format's documented rule leaves out (the readers').
        dropped_turns: turns a format's rule dropped from kept conversations.
        video: how videos were sampled (their token counts depend on it; decoding uses it too).
        images: the pixel bounds images are scaled into (planning and decoding alike).
        cuts: per conversation, where ``--truncate`` cuts it (None: whole); empty: none is cut.
    """

    conversations: list[Conversation]
    lengths: list[int]
    rows: list[list[int]]
    seq_len: int = 0
    too_long: tuple[Skipped, ...] = ()
    unreadable: tuple[Skipped, ...] = ()
    format_skipped: tuple[Skipped, ...] = ()
    dropped_turns: int = 0
    video: VideoSampling = VideoSampling()
    images: ImageBounds = ImageBounds()
    cuts: tuple[Cut | None, ...] = ()

    @property
    def tokens(self) -> int:
        """Tokens of all kept conversations (one epoch)."""
        return sum(self.lengths)


def encode_planned(processor, index: DataIndex, i: int) -> EncodedSample:
    """Conversation ``i`` of ``index`` as its row encodes it: pixels decoded, the processor run, cut
    where ``--truncate`` planned it.

    Raises:
        MediaError: an image or video of it fails to decode (training skips it).
        ValueError: naming ``file:line`` when its tokens are not the planned ones.
    """
    conv = index.conversations[i]
    sample = encode_conversation(processor, conv, index.video, index.images)
    if index.cuts and index.cuts[i] is not None:
        sample = cut_sample(sample, index.cuts[i], conv)
    if len(sample) != index.lengths[i]:
        raise ValueError(f"{conv.where}: {len(sample)} tokens after decoding its images and videos, "
                         f"{index.lengths[i]} planned from their headers")
    return sample


def _kind(conv: Conversation) -> str:
    """What the conversation holds, as :func:`check_planned` tells conversations apart."""
    count = lambda n, one, many: "" if not n else one if n == 1 else many
    media = " and ".join(filter(None, (count(len(conv.images), "an image", "images"),
                                       count(len(conv.videos), "a video", "videos"))))
    return ("pre-training " if conv.pretrain else "") + f"conversation with {media or 'text only'}"


def check_planned(processor, index: DataIndex) -> None:
    """Encode the first conversation of each kind of ``index`` as training will (module docstring).

    A conversation whose image or video fails to decode is left to training (which skips it);
    the next one of its kind is checked instead.

    Raises:
        ValueError: naming ``file:line`` when a conversation's tokens are not the planned ones.
    """
    checked = set()
    for i, conv in enumerate(index.conversations):
        kind = _kind(conv)
        if kind in checked:
            continue
        try:
            encode_planned(processor, index, i)
        except MediaError:
            continue
        except ValueError as err:
            raise ValueError(f"{err} (found at planning, on the first {kind}: every such conversation "
                             "would fail in training)") from None
        checked.add(kind)
