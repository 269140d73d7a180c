#!/usr/bin/env python3
"""Greedy decoding tokens/s of Hugging Face transformers on a model folder,
the peer of gpu_check.py's speed step (run on the GPU machine, where torch
and transformers are installed).

    hf_decode.py MODEL_DIR PROMPTS_JSON TOKENS BATCH...

PROMPTS_JSON holds token-id lists of one length; for each BATCH, the first
BATCH of them go through model.generate at once (greedy, exactly TOKENS new
tokens each: min_new_tokens keeps an end-of-sequence id from ending one
early), after one warm-up run of that batch.  The weights are loaded in
float32, the precision baton's GPU worker computes in (it widens f16 weights
to f32), and the time runs from the call to the synchronized end, prefill
included, as gpu_check.py times baton.  Prints one line
"RESULT {json}" with tokens, seconds and tokens_per_s per batch, and the
greedy ids of the first prompt (for a comparison, not a check: two
implementations may round a near tie apart).
"""
import json
import sys
import time


def main():
    folder, prompts_path, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    batches = [int(b) for b in sys.argv[4:]]
    import torch
    from transformers import AutoModelForCausalLM
    with open(prompts_path) as f:
        prompts = json.load(f)
    dev = torch.device("cuda:0")
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).to(dev)
    model.eval()
    out = {"torch": torch.__version__, "dtype": "float32", "device": torch.cuda.get_device_name(0)}
    try:
        import transformers
        out["transformers"] = transformers.__version__
    except Exception:
        pass
    with torch.no_grad():
        for b in batches:
            ids = torch.tensor(prompts[:b], dtype=torch.long, device=dev)
            mask = torch.ones_like(ids)
            kw = dict(attention_mask=mask, do_sample=False, max_new_tokens=tokens,
                      min_new_tokens=tokens, pad_token_id=0)
            model.generate(ids, **dict(kw, max_new_tokens=8, min_new_tokens=8))
            torch.cuda.synchronize()
            t = time.time()
            g = model.generate(ids, **kw)
            torch.cuda.synchronize()
            took = time.time() - t
            n = (g.shape[1] - ids.shape[1]) * b
            out["batch_%d" % b] = {"tokens": int(n), "seconds": round(took, 4),
                                   "tokens_per_s": round(n / took, 1)}
            if b == batches[0]:
                out["first_prompt_ids"] = g[0, ids.shape[1]:].tolist()
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
