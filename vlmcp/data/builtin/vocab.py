"""The built-in dataset's word-level vocabulary.

The vocabulary is fixed (it does not depend on the dataset config), so a model's
embedding size is ``VOCAB_SIZE`` for every run and a checkpoint stays loadable
when the dataset config changes. Ids 0-3 are special; words follow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = [
    "BOS_ID", "COLOURS", "COLS", "EOS_ID", "IMAGE_ID", "PAD_ID", "PROMPT_WORDS", "ROWS", "SHAPES",
    "SPECIAL_TOKENS",
    "VOCAB_SIZE", "WORDS", "decode", "encode",
]

PAD_ID = 0
"""Filler tokens that complete a packed row (their labels are ignored)."""
BOS_ID = 1
EOS_ID = 2
IMAGE_ID = 3
"""Placeholder id of image-token slots; the model replaces their embeddings."""
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<image>")

COLOURS = ("red", "green", "blue", "yellow", "purple", "white")
SHAPES = ("circle", "square", "triangle", "cross", "diamond")
# Grid row and column names by grid size; a position is "<row> <col>", always two words.
ROWS = {2: ("top", "bottom"), 3: ("top", "middle", "bottom")}
COLS = {2: ("left", "right"), 3: ("left", "center", "right")}
_RELATIONS = ("left", "right", "of", "above", "below")
_GLUE = ("a", "and", "the", "is")
PROMPT_WORDS = ("describe", "compare", "picture", "pictures", "video", "first", "second")
"""Words of the prompts before images and of the comparison answers."""

WORDS: tuple[str, ...] = tuple(dict.fromkeys(
    SPECIAL_TOKENS + COLOURS + SHAPES + ROWS[3] + COLS[3] + _RELATIONS + _GLUE + PROMPT_WORDS))
VOCAB_SIZE = len(WORDS)
_ID = {w: i for i, w in enumerate(WORDS)}


def encode(words: Iterable[str]) -> list[int]:
    """Token ids of ``words`` (no BOS/EOS added).

    Raises:
        KeyError: for a word outside the vocabulary (the message names it).
    """
    try:
        return [_ID[w] for w in words]
    except KeyError as err:
        raise KeyError(f"word {err.args[0]!r} is not in the vlmcp.data vocabulary") from None


def decode(ids: Sequence[int]) -> str:
    """Space-joined words of ``ids``; special tokens appear as ``<pad>``, ``<bos>``, ..."""
    return " ".join(WORDS[int(i)] for i in ids)
