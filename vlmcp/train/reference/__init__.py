"""``vlmcp train`` for the built-in reference VLM: its configuration, step and loop.

* :mod:`~vlmcp.train.reference.config` (:class:`TrainConfig`), validated up front;
* :mod:`~vlmcp.train.reference.step`: one forward/backward of a packed row on a CP rank;
* :mod:`~vlmcp.train.reference.loop`: the run on every rank of a DP x CP world.

Checkpoints, state, schedule and groups are the shared layer, :mod:`vlmcp.train`.
"""
