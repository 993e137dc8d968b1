"""Packed test rows with images anywhere: a sample is a spec string or an ``(image, text)`` pair.

``"t3 i5 t4 i2 i3 t6"``: 3 text tokens, an image of 5, 4 text, two images back to back
(2 then 3 tokens: they need ``image_ids``), 6 text. ``(5, 7)`` is ``"i5 t7"``.
"""

import torch


def pieces(sample):
    if isinstance(sample, tuple):
        i, t = sample
        return [("i", i)] * (i > 0) + [("t", t)] * (t > 0)
    return [(tok[0], int(tok[1:])) for tok in sample.split()]


def make_row(samples):
    """``[sample, ...]`` -> ``(is_image BoolTensor[L], cu_seqlens LongTensor[S+1], image_ids)``."""
    ids, lens, n_img = [], [], 0
    for sample in samples:
        n = 0
        for kind, k in pieces(sample):
            if kind == "i":
                ids += [n_img] * k
                n_img += 1
            else:
                ids += [-1] * k
            n += k
        lens.append(n)
    image_ids = torch.tensor(ids, dtype=torch.long)
    return image_ids >= 0, torch.tensor([0] + lens).cumsum(0), image_ids
