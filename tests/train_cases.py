"""Test specs: a real :class:`~vlmcp.train.spec.TrainSpec` wrapped to inject a fault or read the model
(module level: spawned ranks unpickle them by name). The training runtime has no test hooks; a
test gets the same effect by wrapping the spec its ranks run."""

from __future__ import annotations

import os
import signal

import torch.distributed as dist

from vlmcp.train.spec import RowLoss


class Wrapped:
    """A spec that is ``inner`` except where a subclass says otherwise."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        if name == "inner":  # not set yet (while unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)


class _Steps:
    """``inner``'s batches, calling ``before(step)`` before each (``step``: 0-based)."""

    def __init__(self, inner, start: int, before) -> None:
        self.inner, self.start, self.before = inner, start, before

    def __iter__(self):
        for k, batch in enumerate(self.inner):
            self.before(self.start + k)
            yield batch

    def close(self) -> None:
        self.inner.close()


class KillAt(Wrapped):
    """Rank ``rank`` of the world dies by SIGKILL when it starts step ``step`` (0-based)."""

    def __init__(self, inner, rank: int, step: int) -> None:
        super().__init__(inner)
        self.rank, self.step = rank, step

    def batches(self, groups, start, position):
        me = dist.get_rank(groups.world)

        def before(step):
            if (me, step) == (self.rank, self.step):
                os.kill(os.getpid(), signal.SIGKILL)

        return _Steps(self.inner.batches(groups, start, position), start, before)


class NanAt(Wrapped):
    """Rank 1 (or 0 alone) makes the loss of every row of step ``step`` (1-based) NaN."""

    def __init__(self, inner, step: int) -> None:
        super().__init__(inner)
        self.step, self.now = step, None

    def batches(self, groups, start, position):
        def before(step):
            self.now = step + 1

        return _Steps(self.inner.batches(groups, start, position), start, before)

    def row_loss(self, model, row, groups) -> RowLoss:
        res = self.inner.row_loss(model, row, groups)
        world = dist.get_world_size(groups.world)
        if model.training and self.now == self.step and dist.get_rank(groups.world) == min(1, world - 1):
            res = res._replace(loss=res.loss * float("nan"))
        return res


class Probe(Wrapped):
    """``probe(model, processor, index, cp_group)`` after the last step, on every rank, into the
    summary's ``"probe"`` (a Hugging Face spec's trained in-memory model, before its final save)."""

    def __init__(self, inner, probe) -> None:
        super().__init__(inner)
        self.probe = probe

    def finish(self, model, groups, stopped):
        got = self.probe(model, self.inner.processor, self.inner.index, groups.cp)
        return {**self.inner.finish(model, groups, stopped), "probe": got}


def prepare_killing(rank: int, step: int):
    """A reference launcher's ``prepare`` whose spec kills ``rank`` at ``step`` (monkeypatch it in)."""
    from vlmcp.train.specs.reference.spec import ReferenceSpec

    return lambda cfg, say: KillAt(ReferenceSpec(cfg), rank, step)


def hf_rank(group, cfg, index, probe=None, eval_index=None, nan_at_step=None) -> dict:
    """A rank of ``vlmcp train --model`` on planned data: the loop on the Hugging Face spec, wrapped
    with a :class:`Probe` and a :class:`NanAt` where asked."""
    from vlmcp.train.loop import train_rank
    from vlmcp.train.specs.hf.spec import HFSpec

    spec = HFSpec(cfg, index, eval_index)
    if probe is not None:
        spec = Probe(spec, probe)
    if nan_at_step is not None:
        spec = NanAt(spec, nan_at_step)
    return train_rank(group, spec)


def reference_rank(group, cfg, nan_at_step=None) -> dict:
    """A rank of ``vlmcp train`` on the reference VLM, its loss made NaN at ``nan_at_step`` where asked."""
    from vlmcp.train.loop import train_rank
    from vlmcp.train.specs.reference.spec import ReferenceSpec

    spec = ReferenceSpec(cfg)
    return train_rank(group, spec if nan_at_step is None else NanAt(spec, nan_at_step))
