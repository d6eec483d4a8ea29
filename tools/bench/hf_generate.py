"""transformers' own generate() on a checkpoint folder: the side-by-side for nextn's GPU numbers
(docs/performance.md). Runs on the GPU machine, which has torch and transformers:

    python3 tools/bench/hf_generate.py DIR [--tokens 64] [--prompt-tokens 64] [--batch 1,16]

Greedy decoding of --tokens new tokens after a random prompt of --prompt-tokens, each batch size after a
short warm-up; prints one JSON line per batch with tokens/s = batch * tokens / wall time of generate()
(prefill included: at these prompt lengths it is a few percent). The model computes in bf16; FP8 checkpoints
are dequantized to bf16 at load (transformers' FP8 kernels need a package the GPU machine lacks), so its
decode reads twice the bytes nextn's does.
"""
import argparse
import json
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM, FineGrainedFP8Config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--batch", default="1,16")
    a = ap.parse_args()
    config = AutoConfig.from_pretrained(a.dir)
    kwargs = {}
    if getattr(config, "quantization_config", None):  # FP8 blocks: dequantized at load (no FP8 kernels needed)
        kwargs["quantization_config"] = FineGrainedFP8Config(dequantize=True)
    if config.pad_token_id is not None and not 0 <= config.pad_token_id < config.vocab_size:
        config.pad_token_id = None  # (a synthetic checkpoint's pad id may lie outside its vocabulary)
    model = AutoModelForCausalLM.from_pretrained(a.dir, config=config, dtype=torch.bfloat16, device_map="cuda",
                                                 **kwargs).eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(7)
    for b in (int(x) for x in a.batch.split(",")):
        ids = torch.randint(3, vocab, (b, a.prompt_tokens), generator=gen).cuda()
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False)
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, max_new_tokens=a.tokens, min_new_tokens=a.tokens,
                                 do_sample=False)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        new = out.shape[1] - ids.shape[1]
        print(json.dumps({"model": a.dir, "batch": b, "new_tokens": new, "seconds": round(seconds, 4),
                          "tokens_per_s": round(b * new / seconds, 2),
                          "transformers": __import__("transformers").__version__,
                          "gpu": torch.cuda.get_device_name()}), flush=True)


if __name__ == "__main__":
    main()
