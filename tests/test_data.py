"""The built-in dataset: determinism, packing invariants, resume, and that the image matters."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import vlmcp
from vlmcp.data import (
    BOS_ID,
    EOS_ID,
    IMAGE_ID,
    MAX_SENTENCE_TOKENS,
    PAD_ID,
    VOCAB_SIZE,
    ShapesConfig,
    ShapesDataset,
    decode,
    encode,
    pack_row,
    pack_rows,
)
from vlmcp.data.builtin.shapes import COLOUR_RGB
from vlmcp.data.builtin.vocab import COLS, ROWS

pytestmark = pytest.mark.timeout(60)

CONFIGS = [
    ShapesConfig(),
    ShapesConfig(seed=3, patch_size=4, min_image_size=8, max_image_size=24, grid=3, max_objects=4,
                 text_only_every=3),
    ShapesConfig(seed=5, square_images=True, text_only_every=0),
]


def rows_equal(a, b):
    return (torch.equal(a.input_ids, b.input_ids) and torch.equal(a.is_image, b.is_image)
            and torch.equal(a.cu_seqlens, b.cu_seqlens) and torch.equal(a.labels, b.labels)
            and len(a.images) == len(b.images)
            and all(torch.equal(x, y) for x, y in zip(a.images, b.images, strict=True))
            and (a.start, a.stop, a.filler_len) == (b.start, b.stop, b.filler_len))


@pytest.mark.parametrize("kwargs, needle", [
    (dict(seed=-1), "seed"),
    (dict(patch_size=0), "patch_size"),
    (dict(min_image_size=12), "min_image_size=12 must be a multiple of patch_size=8"),
    (dict(max_image_size=8), "max_image_size"),
    (dict(min_image_size=32, max_image_size=24), "max_image_size"),
    (dict(grid=4), "grid"),
    (dict(max_objects=5), "max_objects=5 exceeds the 4 cells"),
    (dict(max_objects=0), "max_objects"),
    (dict(text_only_every=1), "text_only_every=1"),
    (dict(text_only_every=-2), "text_only_every"),
    (dict(square_images=1), "square_images"),
    (dict(patch_size=True), "patch_size"),
])
def test_bad_config_names_the_value(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        ShapesConfig(**kwargs)


def test_config_is_frozen_and_keyword_only():
    with pytest.raises(TypeError):
        ShapesConfig(0)
    with pytest.raises(AttributeError):
        ShapesConfig().seed = 1


def test_vocab_round_trip_and_special_ids():
    assert (PAD_ID, BOS_ID, EOS_ID, IMAGE_ID) == (0, 1, 2, 3)
    words = "a red circle top left and a blue square bottom right".split()
    assert decode(encode(words)) == " ".join(words)
    assert max(encode(words)) < VOCAB_SIZE
    with pytest.raises(KeyError, match="'dog'"):
        encode(["a", "dog"])


def test_samples_are_deterministic_and_random_access():
    a, b = ShapesDataset(ShapesConfig(seed=7)), ShapesDataset(ShapesConfig(seed=7))
    forward = [a[i] for i in range(12)]
    backward = [b[i] for i in reversed(range(12))][::-1]
    for x, y in zip(forward, backward, strict=True):
        assert torch.equal(x.input_ids, y.input_ids) and x.text == y.text
        assert torch.equal(x.image_ids, y.image_ids) and len(x.images) == len(y.images)
        assert all(torch.equal(p, q) for p, q in zip(x.images, y.images, strict=True))
    other = ShapesDataset(ShapesConfig(seed=8))
    assert any(a[i].text != other[i].text for i in range(12))
    with pytest.raises(IndexError):
        a[-1]


def test_same_seed_same_rows_other_seed_other_rows():
    rows = pack_rows(ShapesDataset(ShapesConfig(seed=1)), 200, 0, 3)
    again = pack_rows(ShapesDataset(ShapesConfig(seed=1)), 200, 0, 3)
    other = pack_rows(ShapesDataset(ShapesConfig(seed=2)), 200, 0, 3)
    assert all(rows_equal(x, y) for x, y in zip(rows, again, strict=True))
    assert not any(torch.equal(x.input_ids, y.input_ids) for x, y in zip(rows, other, strict=True))


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("extra", [0, 7, 150])
def test_packing_invariants(cfg, extra):
    ds = ShapesDataset(cfg)
    seq_len = ds.max_sample_len + extra
    rows = pack_rows(ds, seq_len, 0, 4)
    for row in rows:
        assert row.input_ids.shape == row.is_image.shape == row.labels.shape == (seq_len,)
        assert row.input_ids.dtype == row.labels.dtype == torch.long
        assert row.is_image.dtype == torch.bool
        cu = row.cu_seqlens
        assert cu.dtype == torch.long and cu[0] == 0 and cu[-1] == seq_len
        assert bool((cu[1:] > cu[:-1]).all())
        # The row is exactly its samples, in order, then the filler.
        samples = [ds[i] for i in range(row.start, row.stop)]
        assert row.stop > row.start
        expected = torch.cat([s.input_ids for s in samples])
        assert torch.equal(row.input_ids[:expected.numel()], expected)
        assert row.filler_len == seq_len - expected.numel()
        assert bool((row.input_ids[expected.numel():] == PAD_ID).all())
        assert row.num_samples == len(samples) + (row.filler_len > 0)
        # Images: every sample's, in row order, numbered 0.. across the row; sizes match.
        images = [im for s in samples for im in s.images]
        assert len(row.images) == len(images) == row.image_grid_thw.shape[0]
        assert all(torch.equal(a, b) for a, b in zip(row.images, images, strict=True))
        assert int(row.is_image.sum()) == sum(s.image_tokens for s in samples)
        assert torch.equal(row.is_image, row.input_ids == IMAGE_ID)
        assert torch.equal(row.is_image, row.image_ids >= 0)
        for k, image in enumerate(row.images):
            _, h, w = image.shape
            assert image.shape[0] == 3 and image.dtype == torch.float32
            assert h % cfg.patch_size == 0 and w % cfg.patch_size == 0
            assert cfg.min_image_size <= min(h, w) and max(h, w) <= cfg.max_image_size
            assert int((row.image_ids == k).sum()) == (h // cfg.patch_size) * (w // cfg.patch_size)
            assert row.image_grid_thw[k].tolist() == [1, h // cfg.patch_size, w // cfg.patch_size]
            assert 0 <= float(image.min()) and float(image.max()) <= 1
        first = 0
        for i, s in enumerate(samples):
            ids = row.image_ids[cu[i]:cu[i + 1]]
            assert torch.equal(ids, torch.where(s.is_image, s.image_ids + first, -1))
            assert not bool(s.is_image[0])  # chat-like: a prompt (or the sentence) comes first
            first += len(s.images)
        # Labels: next text token of the same sample, nothing on images, last tokens, filler.
        labels = torch.full((seq_len,), vlmcp.IGNORE_INDEX)
        for i in range(len(samples)):
            for p in range(int(cu[i]), int(cu[i + 1]) - 1):
                if not row.is_image[p] and not row.is_image[p + 1]:
                    labels[p] = row.input_ids[p + 1]
        assert torch.equal(row.labels, labels)
        assert row.num_targets == int((labels != vlmcp.IGNORE_INDEX).sum())
        # Downstream consumers accept every row.
        for P in (1, 2, 3, 4):
            for strategy in ("replicate", "shard"):
                plan = row.plan(P, image_strategy=strategy)
                assert torch.equal(plan.image_lens[:len(samples)],
                                   torch.tensor([s.image_tokens for s in samples]))
                assert plan.num_images == len(row.images)
        mrope = vlmcp.mrope_position_ids(row.is_image, row.image_grid_thw, row.cu_seqlens, row.image_ids)
        assert mrope.shape == (3, seq_len)
    for a, b in zip(rows, rows[1:], strict=False):
        assert a.stop == b.start


def test_rows_mix_images_and_text_and_always_hold_an_image():
    cfg = ShapesConfig()
    ds = ShapesDataset(cfg)
    seq_len = cfg.max_sample_len + MAX_SENTENCE_TOKENS
    rows = pack_rows(ds, seq_len, 0, 40)
    assert all(len(r.images) > 0 for r in rows)
    kinds = {ds.kind(i) for r in rows for i in range(r.start, r.stop)}
    assert kinds == {"sentence", "caption", "compare", "video"}
    text_only = ds[3]
    assert text_only.images == () and text_only.image_tokens == 0
    assert text_only.input_ids[0] == BOS_ID and text_only.input_ids[-1] == EOS_ID


def test_resume_from_data_position_equals_continuing():
    ds = ShapesDataset(ShapesConfig(seed=11))
    straight = pack_rows(ds, 160, 0, 7)
    position = straight[2].stop  # what a checkpoint after three rows stores
    resumed = pack_rows(ShapesDataset(ShapesConfig(seed=11)), 160, position, 4)
    assert all(rows_equal(x, y) for x, y in zip(straight[3:], resumed, strict=True))
    assert rows_equal(pack_row(ds, 160, straight[4].start), straight[4])


def test_seq_len_too_short_is_a_clear_error():
    ds = ShapesDataset()
    n = ds.max_sample_len  # a video of 3 frames of 6x6 patches, a prompt and a caption
    assert n == 3 + 3 * 36 + 13
    with pytest.raises(ValueError, match=rf"seq_len={n - 1} is too short for one sample.*{n} tokens"):
        pack_row(ds, n - 1)
    pack_row(ds, n)  # exactly the longest sample is enough
    with pytest.raises(ValueError, match="position"):
        pack_row(ds, n, -1)
    with pytest.raises(ValueError, match="num_rows"):
        pack_rows(ds, n, 0, 0)
    with pytest.raises(TypeError, match="ShapesDataset"):
        pack_row(ShapesConfig(), n)


def test_caption_describes_the_image():
    cfg = ShapesConfig(grid=3, max_objects=4)
    ds = ShapesDataset(cfg)
    checked = 0
    for i in range(40):
        s = ds[i]
        if ds.kind(i) != "caption":
            continue
        words = s.text.split()
        named = {}
        for j in range(0, len(words), 6):  # "a <colour> <shape> <row> <col>" [and]
            _, colour, _, row, col = words[j:j + 5]
            named[ROWS[3].index(row) * 3 + COLS[3].index(col)] = colour
        image = s.images[0]
        _, h, w = image.shape
        for cell in range(9):
            r, c = divmod(cell, 3)
            block = image[:, r * h // 3:(r + 1) * h // 3, c * w // 3:(c + 1) * w // 3].reshape(3, -1)
            if cell in named:
                # some pixel of the cell has the named colour (up to the tint jitter)
                base = torch.tensor(COLOUR_RGB[named[cell]]).view(3, 1)
                assert bool(((block - base).abs().max(dim=0).values <= 0.06).any()), (i, cell)
            else:
                assert float(block.max()) < 0.1, (i, cell)  # background only
        checked += 1
    assert checked >= 15


class _CaptionModel(nn.Module):
    """Next caption token from the current token, its position and a pooled image."""

    def __init__(self, hidden=32):
        super().__init__()
        self.tok = nn.Embedding(VOCAB_SIZE, hidden)
        self.pos = nn.Embedding(32, hidden)
        self.img = nn.Linear(48, hidden)
        self.out = nn.Sequential(nn.GELU(), nn.Linear(hidden, 2 * hidden), nn.GELU(),
                                 nn.Linear(2 * hidden, VOCAB_SIZE))

    def forward(self, ids, image_features):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1])) + self.img(image_features)[:, None]
        return self.out(x)


def _caption_batch(ds, start, n):
    samples = [ds[i] for i in range(start, start + 3 * n) if ds.kind(i) == "caption"][:n]
    length = max(len(s) - s.image_tokens for s in samples)
    ids = torch.zeros(n, length, dtype=torch.long)
    has_target = torch.zeros(n, length - 1, dtype=torch.bool)
    for b, s in enumerate(samples):
        text = s.input_ids[~s.is_image]  # the prompt, then the caption
        ids[b, :len(text)] = text
        has_target[b, :len(text) - 1] = True
    features = torch.stack([F.adaptive_avg_pool2d(s.images[0], (4, 4)).flatten() for s in samples])
    return ids, has_target, features


def _caption_loss(model, ids, has_target, features):
    logits = model(ids, features)[:, :-1]
    return F.cross_entropy(logits[has_target], ids[:, 1:][has_target])


def test_looking_at_the_image_lowers_the_caption_loss():
    ds = ShapesDataset(ShapesConfig(seed=1))
    train, held_out = _caption_batch(ds, 0, 384), _caption_batch(ds, 100_000, 128)
    losses = {}
    for sees_image in (True, False):
        torch.manual_seed(0)
        model = _CaptionModel()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        scale = 1.0 if sees_image else 0.0
        for _ in range(80):
            ids, has_target, features = train
            loss = _caption_loss(model, ids, has_target, features * scale)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            ids, has_target, features = held_out
            losses[sees_image] = float(_caption_loss(model, ids, has_target, features * scale))
    # Grammar alone gets the blind model to ~0.85 nats; colours and cells need the image.
    assert losses[True] < losses[False] - 0.15, losses
