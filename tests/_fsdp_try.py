import time, os, pickle
from vlmcp.testing import run_on_ranks
from tests import trainer_cases as tc


def fsdp_case(group, ref):
    tc.trainer_env(group)
    res, trainer = tc.run_trainer("/tmp/trn/m_qwen2_vl", "/tmp/trn/shapes/train.jsonl", "/tmp/trn/out_fsdp", {"cp_size": 2},
                                  fsdp="full_shard", fsdp_config={"fsdp_version": 2, "transformer_layer_cls_to_wrap": ["Qwen2VLDecoderLayer"]})
    res["weights"] = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in res["weights"].items()}
    model = trainer.accelerator.unwrap_model(trainer.model)
    return tc.compare(res, ref, group, model)

if __name__ == "__main__":
    os.environ["HF_HUB_OFFLINE"] = "1"
    ref = run_on_ranks(tc.plain_grid, 1, [("/tmp/trn/m_qwen2_vl", "/tmp/trn/shapes/train.jsonl", "/tmp/trn/out_ref")], timeout=300)[0][0]
    pickle.dump(ref, open("/tmp/trn/ref_qwen.pkl", "wb"))
    t = time.time()
    res = run_on_ranks(fsdp_case, 2, ref, timeout=400)
    print(time.time() - t, res[0])
