"""``vlmcp train`` for the built-in reference VLM: configuration, step, loop, checkpoints.

* :mod:`~vlmcp.train.reference.config` (:class:`TrainConfig`), validated up front;
* :mod:`~vlmcp.train.reference.step`: one forward/backward of a packed row on a CP rank;
* :mod:`~vlmcp.train.reference.loop`: the run on every rank of a DP x CP world;
* :mod:`~vlmcp.train.reference.checkpoint` and :mod:`~vlmcp.train.reference.state`:
  atomic checkpoints and the full training state for exact resume.
"""
