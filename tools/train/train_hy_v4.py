#!/usr/bin/env python3
"""Trains nextn's bundled model: a small HY V4 (transformers' HYV4ForCausalLM) with 2 MTP layers, on
Python source code, and exports it exactly as a published checkpoint (hub names, FP8 block-quantized
linear weights, bf16 embeddings/norms).

Runs on the GPU machine (torch + transformers + tokenizers). Usage:
    python3 tools/train/train_hy_v4.py OUT_DIR [--train-seconds S]
Resumable: if OUT_DIR/state.pt exists (same machine), training continues from it.

Data: every *.py file of the Python standard library and the installed site-packages; files whose
path hash (sha1 of the path relative to its root) is 0 mod 50 are held out for evaluation.
Tokenizer: byte-level BPE (vocab 2048, <|pad|> <|bos|> <|eos|>) trained with `tokenizers` on the training
files, with a Qwen2-style Split regex pre-tokenizer + ByteLevel, NFC normalizer.
MTP: DeepSeek-V3-style sequential modules (the vLLM seed's HYV4MultiTokenPredictorLayer wiring, built
from transformers' HY V4 modules in tools/fixtures/make_hy_v4_fixtures.py): layer 0 at position p sees
token p+1 and the target hidden at p and predicts token p+2; layer 1 at position q sees token q+1 and
layer 0's output at q-1 and predicts token q+2. Loss = LM + 0.3 * mean(MTP losses).
"""
import glob
import hashlib
import json
import math
import os
import random
import site
import sys
import sysconfig
import time

T_START = time.time()
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import HYV4Config, HYV4ForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
from make_hy_v4_fixtures import MTPLayerRef, mtp_state_dict_names, to_hub  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/train_out"
def _arg(name, default):
    return float(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


TRAIN_SECONDS = _arg("--train-seconds", 400.0)  # wall-clock budget from script start to the end of training
MAX_TRAIN_CHARS = _arg("--max-chars", 80e6)
MODEL_NAME = "nextn-hy4-tiny"
SEQ = 256
BATCH = 128
VOCAB = 2048
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CONFIG = dict(
    vocab_size=VOCAB, hidden_size=256, intermediate_size=512, moe_intermediate_size=96,
    num_hidden_layers=18, num_attention_heads=4, q_lora_rank=128, kv_lora_rank=64,
    qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
    index_topk=128, index_head_dim=32, index_n_heads=4,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
    routed_scaling_factor=2.0, norm_topk_prob=True, hc_mult=2, swiglu_limit=10.0,
    max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, rms_norm_eps=1e-5,
    num_nextn_predict_layers=2,
)


def log(*a):
    print(f"[{time.time() - T_START:6.1f}s]", *a, flush=True)


def collect_files():
    roots = [sysconfig.get_paths()["stdlib"]] + [p for p in site.getsitepackages() if os.path.isdir(p)]
    train, held = [], []
    seen = set()
    for root in roots:
        for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            try:
                if os.path.getsize(path) > 300_000 or os.path.getsize(path) < 200:
                    continue
            except OSError:
                continue
            rel = os.path.relpath(path, root)
            bucket = held if int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 50 == 0 else train
            bucket.append((root, rel, path))
    return train, held


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, OSError):
        return None


def train_tokenizer(texts):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|pad|>", "<|bos|>", "<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2,
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def encode_stream(tok, texts):
    ids = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.append(1)
        ids.extend(enc.ids)
        ids.append(2)
    return torch.tensor(ids, dtype=torch.int64)


def quantize_fp8(w, block=128):
    """[..., R, C] fp32 -> (e4m3 weight, fp32 scale_inv [..., ceil(R/b), ceil(C/b)]); w ≈ q * scale_inv."""
    *lead, R, C = w.shape
    rb, cb = -(-R // block), -(-C // block)
    pad = torch.zeros(*lead, rb * block, cb * block, dtype=torch.float32, device=w.device)
    pad[..., :R, :C] = w.float()
    blocks = pad.view(*lead, rb, block, cb, block)
    amax = blocks.abs().amax(dim=(-3, -1)).clamp(min=1e-12)  # [..., rb, cb]
    scale = amax / 448.0
    q = (blocks / scale[..., :, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    deq = (q.float() * scale[..., :, None, :, None]).view(*lead, rb * block, cb * block)[..., :R, :C]
    q = q.view(*lead, rb * block, cb * block)[..., :R, :C].contiguous()
    return q, scale.contiguous(), deq.contiguous()


@torch.no_grad()
def reference_outputs(model, mtp0, prompt, n_greedy=48):
    """What nextn's bundled-model test checks, from transformers: the prompt's logits, a greedy
    continuation decoded through the HF cache, and MTP layer 0's logits over the prompt (position p gets
    token p+1 and the target hidden state at p; embedding zeroed at position 0)."""
    ids = torch.tensor([prompt])
    T = ids.shape[1]
    out = model(input_ids=ids)
    hidden = model.model(input_ids=ids).last_hidden_state
    o = model(input_ids=ids, use_cache=True)
    past, nxt, greedy = o.past_key_values, o.logits[0, -1].argmax(), []
    for _ in range(n_greedy):
        greedy.append(int(nxt))
        o = model(input_ids=nxt.view(1, 1), past_key_values=past, use_cache=True)
        past, nxt = o.past_key_values, o.logits[0, -1].argmax()
    e0 = model.model.embed_tokens(ids[:, 1:]).clone()
    e0[:, 0] = 0
    g0 = mtp0(e0, hidden[:, :-1], torch.arange(T - 1))
    return {"input_ids": ids[0].contiguous(), "logits": out.logits[0].float().contiguous(),
            "greedy_ids": torch.tensor(greedy, dtype=torch.int64),
            "draft_logits": model.lm_head(g0)[0].float().contiguous()}


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    random.seed(0)
    dev = "cuda"
    train_files, held_files = collect_files()
    log(f"{len(train_files)} train files, {len(held_files)} held-out files")
    train_texts, held_texts, train_chars = [], [], 0
    random.Random(0).shuffle(train_files)
    for _, _, p in train_files:
        t = read(p)
        if t:
            train_texts.append(t)
            train_chars += len(t)
        if train_chars >= MAX_TRAIN_CHARS:
            break
    held_texts = [t for t in (read(p) for _, _, p in held_files) if t]
    log(f"train {train_chars / 1e6:.1f} M chars, held-out {sum(map(len, held_texts)) / 1e6:.1f} M chars")

    model_dir = os.path.join(OUT, MODEL_NAME)
    os.makedirs(model_dir, exist_ok=True)
    tok_path = os.path.join(model_dir, "tokenizer.json")
    if os.path.exists(tok_path):
        tok = Tokenizer.from_file(tok_path)
    else:
        rnd = random.Random(1)
        sample = rnd.sample(train_texts, min(len(train_texts), 6000))
        tok = train_tokenizer(sample)
        tok.save(tok_path)
    log("tokenizer ready, vocab", tok.get_vocab_size())
    train_ids = encode_stream(tok, train_texts)
    held_ids = encode_stream(tok, held_texts)
    log(f"train {train_ids.numel() / 1e6:.1f} M tokens, held-out {held_ids.numel() / 1e6:.2f} M tokens")
    train_ids, held_ids = train_ids.to(dev), held_ids.to(dev)

    config = HYV4Config(**CONFIG)
    config._attn_implementation = "eager"
    model = HYV4ForCausalLM(config).to(dev)
    L = config.num_hidden_layers
    mtps = nn.ModuleList([MTPLayerRef(config, L + i) for i in range(2)]).to(dev)
    with torch.no_grad():  # the MTP modules: transformers' HY V4 init scheme
        for n, p in mtps.named_parameters():
            if "norm" in n and n.endswith("weight"):
                p.fill_(1.0)
            elif n.endswith("bias") or n.endswith("sinks"):
                p.zero_()
            else:
                p.normal_(0.0, config.initializer_range)
        for n, b in mtps.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.zero_()
    params = [p for p in list(model.parameters()) + list(mtps.parameters()) if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1.5e-3, betas=(0.9, 0.95), weight_decay=0.1)
    state_path = os.path.join(OUT, "state.pt")
    step = 0
    if os.path.exists(state_path):
        st = torch.load(state_path, map_location=dev)
        model.load_state_dict(st["model"])
        mtps.load_state_dict(st["mtps"])
        opt.load_state_dict(st["opt"])
        step = st["step"]
        log("resumed at step", step)
    n_params = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtps.parameters())
    log(f"target {n_params / 1e6:.2f} M params, MTP {n_mtp / 1e6:.2f} M params")

    embed = model.model.embed_tokens

    def losses(batch):
        inp, tgt = batch[:, :-1], batch[:, 1:]
        S = inp.shape[1]
        h = model.model(input_ids=inp).last_hidden_state
        lm = F.cross_entropy(model.lm_head(h).float().reshape(-1, VOCAB), tgt.reshape(-1))
        e0 = embed(inp[:, 1:]).clone()
        e0[:, 0] = 0  # the seed zeroes the embedding at position 0
        g0 = mtps[0](e0, h[:, :-1], torch.arange(S - 1, device=dev))
        l0 = model.lm_head(g0).float()
        mtp0 = F.cross_entropy(l0.reshape(-1, VOCAB), tgt[:, 1:].reshape(-1))
        g1 = mtps[1](embed(inp[:, 2:]), g0[:, :-1], torch.arange(1, S - 1, device=dev))
        l1 = model.lm_head(g1).float()
        mtp1 = F.cross_entropy(l1.reshape(-1, VOCAB), tgt[:, 2:].reshape(-1))
        acc0 = (l0.argmax(-1) == tgt[:, 1:]).float().mean()
        acc1 = (l1.argmax(-1) == tgt[:, 2:]).float().mean()
        acc_t = (model.lm_head(h).argmax(-1) == tgt).float().mean()
        return lm, mtp0, mtp1, acc_t, acc0, acc1

    def batch_from(ids, n, gen=None):
        starts = torch.randint(0, ids.numel() - SEQ - 2, (n,), device=dev, generator=gen)
        return torch.stack([ids[s:s + SEQ + 1] for s in starts.tolist()])

    deadline = T_START + TRAIN_SECONDS
    warmup = 60
    run_budget = max(deadline - time.time(), 1.0)
    model.train()
    mtps.train()
    t_train = time.time()
    steps_this_run = 0
    while time.time() < deadline:
        # linear warm-up, then cosine decay to 10% over this run's wall-clock budget
        frac = min((time.time() - t_train) / run_budget, 1.0)
        lr = 2e-3 * min(1.0, (step + 1) / warmup) * max(0.1, 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        batch = batch_from(train_ids, BATCH)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lm, m0, m1, *_ = losses(batch)
            loss = lm + 0.3 * (m0 + m1) / 2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        steps_this_run += 1
        if step % 100 == 0:
            log(f"step {step} lr {lr:.2e} lm {lm.item():.3f} mtp0 {m0.item():.3f} mtp1 {m1.item():.3f} "
                f"({steps_this_run / (time.time() - t_train):.2f} it/s)")
    torch.save({"model": model.state_dict(), "mtps": mtps.state_dict(), "opt": opt.state_dict(), "step": step},
               state_path)
    log("saved state at step", step)

    # Held-out evaluation.
    model.eval()
    mtps.eval()
    gen = torch.Generator(device=dev).manual_seed(123)
    agg = torch.zeros(6)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(20):
            r = losses(batch_from(held_ids, 16, gen))
            agg += torch.tensor([x.item() for x in r])
    agg /= 20
    report = dict(steps=step, tokens_seen=step * BATCH * SEQ, train_tokens=int(train_ids.numel()),
                  heldout_tokens=int(held_ids.numel()), train_files=len(train_files), heldout_files=len(held_files),
                  heldout_lm_loss=agg[0].item(), heldout_mtp0_loss=agg[1].item(), heldout_mtp1_loss=agg[2].item(),
                  heldout_top1_target=agg[3].item(), heldout_top1_mtp0=agg[4].item(), heldout_top1_mtp1=agg[5].item(),
                  target_params=n_params, mtp_params=n_mtp, train_seconds=time.time() - t_train)
    log("eval", report)

    # Export as a published checkpoint: hub names, FP8 block-quantized linear weights.
    quant_ignored = ["lm_head"]
    tensors, deq_target, deq_mtp = {}, {}, [dict() for _ in mtps]

    def is_quantized(internal):
        leaf = internal.split(".")[-1]
        if "layers." not in internal and not internal.startswith("mtp"):
            return False
        if internal.endswith("mlp.gate.weight") or "weights_proj" in internal:
            return False
        if leaf in ("gate_up_proj", "down_proj") and ".experts." in internal + ".":
            return True
        return leaf == "weight" and any(k in internal for k in (
            "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "self_attn.gate_proj",
            "indexer.wq_b", "indexer.wk", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
            "shared_experts.", "eh_proj"))

    def export(internal, t, hub, deq_store, deq_key, exclude=False):
        t = t.detach().float()
        if is_quantized(internal) and not exclude:
            q, s, d = quantize_fp8(t)
            tensors[hub] = q.cpu()
            scale_name = hub[:-len(".weight")] + ".weight_scale_inv" if hub.endswith(".weight") else hub + "_scale_inv"
            tensors[scale_name] = s.cpu()
            deq_store[deq_key] = d.cpu()
        else:
            keep32 = any(k in internal for k in ("e_score_correction_bias", "sinks", "hc_", "attn_hc", "ffn_hc",
                                                   "weights_proj", "k_norm", "mlp.gate.weight"))
            tensors[hub] = t.cpu().to(torch.float32 if keep32 else torch.bfloat16)
            deq_store[deq_key] = tensors[hub].float()
            if internal.endswith(".weight") and t.dim() == 2 and (internal.endswith("mlp.gate.weight") or "weights_proj" in internal):
                quant_ignored.append(hub[:-len(".weight")])

    for n, t in model.state_dict().items():
        export(n, t, to_hub(n), deq_target, n)
    excluded_mtp = "model.mtp_layers.0.eh_proj"  # exercises MTP-named exclusion lists (left bf16)
    for i, m in enumerate(mtps):
        names = mtp_state_dict_names(m, i)
        sd = m.state_dict()
        for n, ck in names.items():
            hub = to_hub("." + ck)[1:]
            export("mtp." + n, sd[n], hub, deq_mtp[i], n, exclude=hub.startswith(excluded_mtp + "."))
    quant_ignored.append(excluded_mtp)
    save_file(tensors, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg_json = dict(CONFIG)
    cfg_json.update(model_type="hy_v4", architectures=["HYV4ForCausalLM"], dtype="bfloat16",
                    mtp_quant_algo="FP8",
                    quantization_config={"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                         "activation_scheme": "dynamic", "ignored_layers": sorted(set(quant_ignored))})
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2, sort_keys=True)
    with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "do_sample": False}, f, indent=2)
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
                   "pad_token": "<|pad|>", "add_bos_token": True, "model_max_length": 4096}, f, indent=2)
    log("exported", sum(t.numel() * t.element_size() for t in tensors.values()) / 1e6, "MB")

    # Reference outputs of the exported weights (dequantized, fp32) for nextn's end-to-end test.
    ref_model = HYV4ForCausalLM(config).float().eval()
    missing, unexpected = ref_model.load_state_dict(deq_target, strict=False)
    assert not [k for k in missing if "inv_freq" not in k], missing
    refs = []
    for i in range(2):
        r = MTPLayerRef(config, L + i).float().eval()
        r.load_state_dict(deq_mtp[i], strict=False)
        refs.append(r)
    prompt = [1] + tok.encode(held_texts[0][:4000], add_special_tokens=False).ids[:191]
    ref = reference_outputs(ref_model, refs[0], prompt)
    T = len(prompt)
    ref_dir = os.path.join(OUT, "bundled_reference")
    os.makedirs(ref_dir, exist_ok=True)
    save_file(ref, os.path.join(ref_dir, "reference.safetensors"))

    # Token ids recorded by `tokenizers` for nextn's tokenizer test.
    rnd = random.Random(7)
    samples = []
    for t in held_texts[:400]:
        a = rnd.randrange(0, max(1, len(t) - 400))
        samples.append(t[a:a + rnd.randrange(20, 400)])
    samples += ["héllo wörld — naïve café", "数据 处理 😀👍🏽 👨‍👩‍👧", "x  =  1\t\t# tabs\n\n\n  y=2", "3.14159 12345678901234",
                "<|bos|>def f():<|eos|>", "don't I'll we've", "\u00e9\u0065\u0301 (NFC vs NFD)", "   ", ""]
    with open(os.path.join(ref_dir, "tokenizer_oracle.jsonl"), "w") as f:
        for s in samples:
            f.write(json.dumps({"text": s, "ids": tok.encode(s, add_special_tokens=False).ids}) + "\n")
    report["reference_prompt_tokens"] = T
    with open(os.path.join(ref_dir, "train_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    log("done")


if __name__ == "__main__":
    main()
