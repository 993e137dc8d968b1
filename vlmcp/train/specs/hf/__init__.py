"""A Hugging Face model directory as a training spec (``vlmcp train --model DIR --data FILE``).

* :mod:`.config` — :class:`HFTrainConfig`: the loop's fields with a pretrained model's defaults,
  and the directory's, the data's and fine-tuning's own;
* :mod:`.spec` — :class:`HFSpec`, the rank side: the rows, the loss, the final save;
* :mod:`.model` — the model loaded, frozen or LoRA'd (:mod:`.finetune`, checked by
  :mod:`.finetune_config`), parallelized, FSDP-sharded; its parts for the norms;
* :mod:`.agree` — the CP group agrees on the conversations its row skips;
* :mod:`.final_model` — the trained model's ``save_pretrained``, written like a checkpoint;
* :mod:`.launch`, :mod:`.model_check`, :mod:`.report` — the launcher's side: the model directory
  checked, the data planned, the run announced and summarized.
"""
