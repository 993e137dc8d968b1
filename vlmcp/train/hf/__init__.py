"""``vlmcp train --model DIR --data FILE``: a Hugging Face VLM trained under CP.

* :mod:`~vlmcp.train.hf.config` (:class:`HFTrainConfig`), validated up front;
* :mod:`~vlmcp.train.hf.loop`: the run on every rank of a DP x CP world;
* :mod:`~vlmcp.train.hf.agree`: the CP group agrees on the conversations its row skips;
* :mod:`~vlmcp.train.hf.checkpoint`: plain and FSDP (DCP) checkpoints
  (:mod:`~vlmcp.train.hf.dcp_checkpoint`, read through :mod:`~vlmcp.train.hf.dcp_reader`), and
  :mod:`~vlmcp.train.hf.final_model`, the final ``save_pretrained``.
"""
