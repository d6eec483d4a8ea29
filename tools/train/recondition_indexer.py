#!/usr/bin/env python3
"""Gives the bundled model a tie-free DSA indexer, then re-records its transformers reference.

transformers trains HY V4's indexer under no_grad, so after tools/train/train_hy_v4.py the indexer is
still at its random init: with 4 heads, 1/16 of the keys score exactly 0 (every ReLU closed), and the
top-k choice among those ties is up to each implementation (torch.topk versus nextn's lower-position
rule) — outputs past index_topk would then differ for no arithmetic reason. The model learned to live
with an arbitrary selection, so we redraw the (untrained) indexer projections with 16 heads, where an
all-zero score has probability 2^-16, check that no top-k decision of the reference run is a near-tie,
and report the held-out loss before and after.

Usage (GPU machine): python3 tools/train/recondition_indexer.py MODEL_DIR OUT_DIR
"""
import json
import os
import random
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import HYV4Config, HYV4ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))
sys.path.insert(0, HERE)
from make_hy_v4_fixtures import HUB_RENAMES, MTPLayerRef, TopkGapMonitor  # noqa: E402
from train_hy_v4 import collect_files, quantize_fp8, read, reference_outputs  # noqa: E402

SRC, OUT = sys.argv[1], sys.argv[2]
NEW_HEADS = 16


def to_internal(hub):
    for a, b in HUB_RENAMES:
        if b in hub:
            hub = hub.replace(b, a)
    return hub


def dequantize(tensors, block=128):
    """hub-named checkpoint -> {hub name: fp32 tensor} with FP8 weights dequantized blockwise."""
    out = {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            sname = name[:-len(".weight")] + ".weight_scale_inv" if name.endswith(".weight") else name + "_scale_inv"
            s = tensors[sname].float()
            *lead, R, C = t.shape
            full = s.repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)[..., :R, :C]
            out[name] = t.float() * full
        else:
            out[name] = t.float()
    return out


def build(config, deq, L, n_mtp):
    model = HYV4ForCausalLM(config).float().eval()
    target = {to_internal(k): v for k, v in deq.items() if not k.startswith("model.mtp_layers.")}
    missing, unexpected = model.load_state_dict(target, strict=False)
    assert not [k for k in missing if "inv_freq" not in k], missing
    mtps = []
    for i in range(n_mtp):
        pre = f"model.mtp_layers.{i}."
        sd = {to_internal("." + k[len(pre):])[1:]: v for k, v in deq.items() if k.startswith(pre)}
        r = MTPLayerRef(config, L + i).float().eval()
        missing, _ = r.load_state_dict(sd, strict=False)
        assert not [k for k in missing if "rotary" not in k], missing
        mtps.append(r)
    return model, mtps


def main():
    torch.set_grad_enabled(False)
    os.makedirs(OUT, exist_ok=True)
    cfg = json.load(open(os.path.join(SRC, "config.json")))
    tensors = load_file(os.path.join(SRC, "model.safetensors"))
    L, n_mtp = cfg["num_hidden_layers"], cfg["num_nextn_predict_layers"]
    hcfg = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "quantization_config", "dtype")}

    # held-out windows for the before/after loss
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(SRC, "tokenizer.json"))
    _, held = collect_files()
    texts = [t for t in (read(p) for _, _, p in held) if t]
    ids = []
    for e in tok.encode_batch(texts, add_special_tokens=False):
        ids += [1] + e.ids + [2]
    ids = torch.tensor(ids)
    g = torch.Generator().manual_seed(5)
    starts = torch.randint(0, ids.numel() - 258, (24,), generator=g)
    windows = torch.stack([ids[s:s + 257] for s in starts.tolist()]).cuda()

    def heldout_loss(config, deq):
        model, _ = build(config, deq, L, n_mtp)
        model = model.cuda()
        tot = 0.0
        for w in windows.split(8):
            out = model(input_ids=w[:, :-1])
            tot += torch.nn.functional.cross_entropy(out.logits.float().reshape(-1, out.logits.shape[-1]),
                                                     w[:, 1:].reshape(-1)).item()
        return tot / len(windows.split(8))

    config_old = HYV4Config(**hcfg)
    config_old._attn_implementation = "eager"
    loss_old = heldout_loss(config_old, dequantize(tensors))
    print("held-out loss, original indexer:", loss_old, flush=True)

    hcfg["index_n_heads"] = NEW_HEADS
    cfg["index_n_heads"] = NEW_HEADS
    config = HYV4Config(**hcfg)
    config._attn_implementation = "eager"
    q_lora, ihd = cfg["q_lora_rank"], cfg["index_head_dim"]
    H = cfg["hidden_size"]
    best = None
    for seed in range(6):
        gen = torch.Generator().manual_seed(1000 + seed)
        new = dict(tensors)
        for name in list(tensors):
            if name.endswith("indexer.wq_b.weight"):
                w = torch.randn(NEW_HEADS * ihd, q_lora, generator=gen) / q_lora ** 0.5
                q, s, _ = quantize_fp8(w)
                new[name], new[name[:-len(".weight")] + ".weight_scale_inv"] = q, s
            elif name.endswith("indexer.weights_proj.weight"):
                new[name] = (torch.randn(NEW_HEADS, H, generator=gen) / H ** 0.5).float()
        deq = dequantize(new)
        model, mtps = build(config, deq, L, n_mtp)
        # the reference prompt of the bundled test (first held-out file, bos + 191 tokens)
        prompt = [1] + tok.encode(texts[0][:4000], add_special_tokens=False).ids[:191]
        with TopkGapMonitor(cfg["n_routed_experts"] // cfg["n_group"]) as mon:
            ref = reference_outputs(model, mtps[0], prompt)
        print(f"seed {seed}: min top-k gap {mon.min_gap:.2e}", flush=True)
        if best is None or mon.min_gap > best[0]:
            best = (mon.min_gap, seed, new, deq, ref)
        if mon.min_gap >= 3e-5:
            break
    gap, seed, new, deq, ref = best
    loss_new = heldout_loss(config, deq)
    print("held-out loss, reconditioned indexer:", loss_new, flush=True)

    model_out = os.path.join(OUT, "nextn-hy4-tiny")
    os.makedirs(model_out, exist_ok=True)
    for f in os.listdir(SRC):
        if f not in ("model.safetensors", "config.json"):
            shutil.copy(os.path.join(SRC, f), model_out)
    save_file({k: v.contiguous() for k, v in new.items()}, os.path.join(model_out, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(model_out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    ref_dir = os.path.join(OUT, "bundled_reference")
    os.makedirs(ref_dir, exist_ok=True)
    save_file(ref, os.path.join(ref_dir, "reference.safetensors"))
    with open(os.path.join(ref_dir, "recondition_report.json"), "w") as f:
        json.dump({"heldout_loss_original_indexer": loss_old, "heldout_loss_reconditioned_indexer": loss_new,
                   "index_n_heads": NEW_HEADS, "indexer_seed": 1000 + seed, "min_topk_gap": gap,
                   "heldout_windows": int(windows.shape[0]), "window_tokens": 256}, f, indent=2)
    print("done", flush=True)


if __name__ == "__main__":
    main()
