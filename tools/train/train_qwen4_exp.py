#!/usr/bin/env python3
"""Trains nextn's second bundled model: a small Qwen4-Exp (transformers' Qwen4ExpForCausalLM,
model_type qwen4_exp_text) with 2 MTP layers, on Python source code, and exports it as a published
checkpoint (hub tensor names, FP8 e4m3 block-quantized linear weights, bf16 everything else).

Runs on the GPU machine (torch + transformers 5.17 + tokenizers + safetensors). Usage:
    python3 tools/train/train_qwen4_exp.py OUT_DIR [--train-seconds S] [--smoke]
OUT_DIR receives qwen4_exp/ (config.json, model.safetensors, generation_config.json),
train_report.json and reference.safetensors; the resumable training state goes to --state-dir.

Same data and tokenizer as tools/train/train_hy_v4.py, so that both bundled models are comparable:
every *.py file of the Python standard library and the installed site-packages (200 B - 300 KB); files
whose sha1(path relative to its root) is 0 mod 50 are held out. Tokenizer: the bundled HY V4's
models/nextn-hy4-tiny/tokenizer.json (byte-level BPE, vocab 2048).

The model is this file's own PyTorch implementation of Qwen4-Exp (same parameter names as transformers'
modules, so the export loads into Qwen4ExpForCausalLM; the script checks that it does and that the logits
agree). Differences from transformers are only in how things are computed: the QSA indexer is vectorized
over queries (same math: per query, the complete blocks of `indexer_compress_ratio` visible rows,
mean-pooled raw keys -> k_layernorm -> RoPE at the block's first position; score = sum over heads of
relu(q.k)/sqrt(d); top budget/ratio blocks + the tail of the incomplete block), and the MoE experts are
evaluated densely and weighted by the (sparse) routing weights.

MTP (vLLM's Qwen4ExpMultiTokenPredictor as nextn reads it): shared fc_embedding [H,H], fc_hidden [H,H]
(applied to each hyper-connection stream), pre_fc_norm_embedding [H], pre_fc_norm_hidden [hc*H] (one
(1+w) RMSNorm over all hc*H), one hyper_connection_mixer (GatedResidual without combine), and
mtp.layers.{j}: Qwen4-Exp decoder layers with QSA attention and MoE, no PLE. One MTP row at position p with
token t and multi-stream input m: e = fc_embedding(norm_e(embed(t))); s = fc_hidden(norm_h(m).view(hc,H));
x = (s + e).flatten(); out = layer_j(x) (causal over the layer's own rows, RoPE at p);
logits = lm_head(mixer(out)). Layer 0 row p gets token p+1 and the target's pre-final-mixer multi stream
at p and predicts token p+2; layer 1 row q (q >= 1) gets token q+1 and layer 0's out at q-1 and predicts
token q+2. Loss = LM + 0.3 * mean(MTP losses) + 0.01 * MoE balance loss + 0.1 * indexer loss (the indexer
gets no gradient through its top-k; it learns, on detached inputs, the block distribution of the dense
attention of its layer, as DeepSeek-V3.2's indexer warm-up does, plus a hinge that keeps every complete
block's score above 0.1 so that no two blocks tie at an all-ReLU-closed 0).
"""
import contextlib
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _arg(name, default, cast=float):
    return cast(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


OUT = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "/tmp/q4_out"
SMOKE = "--smoke" in sys.argv
TRAIN_SECONDS = _arg("--train-seconds", 30.0 if SMOKE else 420.0)  # wall clock from script start to end of training
MAX_TRAIN_CHARS = _arg("--max-chars", 3e6 if SMOKE else 80e6)
MAX_STEPS = _arg("--max-steps", 8 if SMOKE else 10**9, int)
STATE_DIR = _arg("--state-dir", "/tmp/qwen4_exp_state", str)
DEVICE = _arg("--device", "cuda" if torch.cuda.is_available() else "cpu", str)
MODEL_NAME = "qwen4_exp"
TOKENIZER = os.path.join(ROOT, "models", "nextn-hy4-tiny", "tokenizer.json")
SEQ = 256
BATCH = 128
VOCAB = 2048
MTP_WEIGHT, BALANCE_WEIGHT, INDEXER_WEIGHT, INDEXER_MARGIN = 0.3, 0.01, 0.1, 0.1

CONFIG = dict(
    vocab_size=VOCAB, hidden_size=256, num_hidden_layers=8,
    layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2,
    hidden_act="silu", rms_norm_eps=1e-6, initializer_range=0.02, max_position_embeddings=2048,
    tie_word_embeddings=False, attention_bias=False,
    # attention (QSA) layers
    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=128, indexer_compress_ratio=16,
    # Gated DeltaNet layers
    linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=4,
    # MoE (every layer)
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
    norm_topk_prob=True, router_aux_loss_coef=BALANCE_WEIGHT,
    # hyper-connections
    hc_count=2, hc_lowrank=16,
    # per-layer n-gram embedding on the first (linear) layer
    ple_layer_ids=[1], ple_embed_dim=32, ple_conv_kernel_size=4, ngram_size=3, heads_per_ngram=2,
    ngram_vocab_size_base=2039, make_ngram_vocab_size_divisible_by=128, seed=1234, split_ngram_parts=4,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
    mtp_num_hidden_layers=2,
)
BLOCK = [128, 128]


def log(*a):
    print(f"[{time.time() - T_START:6.1f}s]", *a, flush=True)


# ----------------------------------------------------------------------------------------------- data
def collect_files():
    """The HY V4 split: same roots, same size filter, same path-hash held-out rule."""
    roots = [sysconfig.get_paths()["stdlib"]] + [p for p in site.getsitepackages() if os.path.isdir(p)]
    train, held, seen = [], [], set()
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


def encode_stream(tok, texts):
    ids = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.append(1)
        ids.extend(enc.ids)
        ids.append(2)
    return torch.tensor(ids, dtype=torch.int64)


# ---------------------------------------------------------------------------------------------- model
def rms(x, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """Qwen4ExpTextRMSNorm: fp32, (1 + weight), optionally per group of `group` features."""

    def __init__(self, dim, group=None, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.group, self.eps = group, eps

    def forward(self, x):
        xf = x.float()
        if self.group:
            xf = xf.reshape(*xf.shape[:-1], -1, self.group)
        out = rms(xf, self.eps)
        if self.group:
            out = out.flatten(-2)
        return (out * (1.0 + self.weight.float())).type_as(x)


class GatedRMSNorm(nn.Module):
    """Qwen4ExpTextRMSNormGated: norm(x) * weight * silu(gate)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, gate):
        dt = x.dtype
        h = self.weight * rms(x.float(), self.eps).to(dt)
        return (h * F.silu(gate.float())).to(dt)


class GatedResidual(nn.Module):
    """Qwen4ExpTextGatedResidual: hyper-connection input mixer (+ per-stream injection weights)."""

    def __init__(self, c, combine=True):
        super().__init__()
        self.hc, self.H = c["hc_count"], c["hidden_size"]
        n = self.hc * self.H
        self.hc_norm = RMSNorm(n, self.H, c["rms_norm_eps"])
        self.input_mix_weight_down = nn.Linear(n, c["hc_lowrank"], bias=False)
        self.input_mix_weight_up = nn.Linear(c["hc_lowrank"], n, bias=False)
        self.block_inject_weight = nn.Linear(n, self.hc, bias=False) if combine else None

    def forward(self, x):
        n = self.hc_norm(x)
        w = F.silu(self.input_mix_weight_down(n) / self.hc)
        w = torch.sigmoid(self.input_mix_weight_up(w)).unflatten(-1, (self.hc, self.H))
        mixed = (w * n.unflatten(-1, (self.hc, self.H))).mean(-2)
        if self.block_inject_weight is None:
            return mixed
        return mixed, x, 2 * torch.sigmoid(self.block_inject_weight(n) / self.hc)


def rope_tables(positions, dim, theta):
    """positions [R] (long) -> cos, sin [R, dim] in fp32 (the two halves repeat the same frequencies)."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
    f = positions.float()[:, None] * inv[None, :]
    e = torch.cat([f, f], -1)
    return e.cos(), e.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def apply_rope(x, cos, sin):
    """x [B, R, heads, d]; rotates the first cos.shape[-1] features (partial RoPE), cos/sin [R, rd]."""
    rd = cos.shape[-1]
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    xr = x[..., :rd]
    return torch.cat([xr * cos + rotate_half(xr) * sin, x[..., rd:]], -1)


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def chunk_gated_delta_rule(query, key, value, g, beta, chunk=64):
    """The gated delta rule over a whole sequence, chunked (transformers' torch_chunk_gated_delta_rule math,
    no initial state). query/key [B,S,h,dk], value [B,S,h,dv], g/beta [B,S,h] -> [B,S,h,dv]."""
    dt0 = query.dtype
    B, S, _, dk = key.shape
    q, k, v, beta, g = [t.transpose(1, 2).float().contiguous() for t in (query, key, value, beta, g)]
    q, k = l2norm(q), l2norm(k)
    q = q * dk ** -0.5
    pad = (chunk - S % chunk) % chunk
    q, k, v = [F.pad(t, (0, 0, 0, pad)) for t in (q, k, v)]
    beta, g = [F.pad(t, (0, pad)) for t in (beta, g)]
    n = (S + pad) // chunk
    vb, kb = v * beta[..., None], k * beta[..., None]
    q, k, kb, vb = [t.reshape(t.shape[0], t.shape[1], n, chunk, t.shape[-1]) for t in (q, k, kb, vb)]
    g = g.reshape(g.shape[0], g.shape[1], n, chunk)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    cg = g.cumsum(-1)
    pair = (cg[..., :, None] - cg[..., None, :]).masked_fill(upper, float("-inf")).exp()
    ut = (kb @ k.transpose(-1, -2)) * pair
    intra = (q @ k.transpose(-1, -2)) * pair
    new_v = torch.linalg.solve_triangular(ut, vb, upper=False, unitriangular=True)
    k_cum = torch.linalg.solve_triangular(ut, kb * cg.exp()[..., None], upper=False, unitriangular=True)
    state = torch.zeros(q.shape[0], q.shape[1], dk, v.shape[-1], dtype=q.dtype, device=q.device)
    q = q * cg.exp()[..., None]
    k = k * (cg[..., -1:] - cg).exp()[..., None]
    cdecay = cg[..., -1].exp()[..., None, None]
    outs = []
    for i in range(n):
        vn = new_v[:, :, i] - k_cum[:, :, i] @ state
        outs.append(q[:, :, i] @ state + intra[:, :, i] @ vn)
        state = state * cdecay[:, :, i] + k[:, :, i].transpose(-1, -2) @ vn
    o = torch.stack(outs, 2).reshape(q.shape[0], q.shape[1], n * chunk, -1)[:, :, :S]
    return o.transpose(1, 2).contiguous().to(dt0)


def no_autocast(device):
    return torch.autocast(device_type=device.type, enabled=False) if device.type == "cuda" else contextlib.nullcontext()


class GatedDeltaNet(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.nk, self.nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        self.dk, self.dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        self.key_dim, self.value_dim = self.nk * self.dk, self.nv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.K = c["linear_conv_kernel_dim"]
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.K, groups=self.conv_dim, bias=False,
                                padding=self.K - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.empty(self.nv).uniform_(0.01, 16).log())
        self.norm = GatedRMSNorm(self.dv, c["rms_norm_eps"])
        self.out_proj = nn.Linear(self.value_dim, H, bias=False)
        self.in_proj_qkv = nn.Linear(H, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(H, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(H, self.nv, bias=False)
        self.in_proj_a = nn.Linear(H, self.nv, bias=False)

    def forward(self, x):
        B, S, _ = x.shape
        w = self.conv1d.weight
        qkv = self.in_proj_qkv(x).transpose(1, 2)
        qkv = F.silu(F.conv1d(qkv.to(w.dtype), w, None, padding=self.K - 1, groups=self.conv_dim)[..., :S])
        qkv = qkv.transpose(1, 2)
        q, k, v = torch.split(qkv, [self.key_dim, self.key_dim, self.value_dim], -1)
        q, k = q.reshape(B, S, self.nk, self.dk), k.reshape(B, S, self.nk, self.dk)
        v = v.reshape(B, S, self.nv, self.dv)
        z = self.in_proj_z(x).reshape(B, S, self.nv, self.dv)
        beta = self.in_proj_b(x).sigmoid()
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        r = self.nv // self.nk
        if r > 1:
            q, k = q.repeat_interleave(r, 2), k.repeat_interleave(r, 2)
        with no_autocast(x.device):
            o = chunk_gated_delta_rule(q, k, v, g, beta)
        o = self.norm(o.reshape(-1, self.dv), z.reshape(-1, self.dv)).reshape(B, S, -1)
        return self.out_proj(o)


class QSAIndexer(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.nh, self.d = c["indexer_n_heads"], c["indexer_head_dim"]
        self.r = c["indexer_compress_ratio"]
        self.topk = c["indexer_budget"] // self.r
        self.index_qk_proj = nn.Linear(H, (self.nh + c["indexer_kv_heads"]) * self.d, bias=False)
        self.q_layernorm = RMSNorm(self.d, eps=c["rms_norm_eps"])
        self.k_layernorm = RMSNorm(self.d, eps=c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        """x [B,R,H] (the rows of this layer, in order), cos/sin [R, rd] at the rows' positions.
        Returns allowed [B,R,R] (causal & (selected blocks | tail)), scores [B,R,NB] (None if NB = 0),
        complete [R,NB] (block n complete for row i)."""
        B, R, _ = x.shape
        dev = x.device
        rows = torch.arange(R, device=dev)
        causal = rows[None, :] <= rows[:, None]
        NB = R // self.r
        if NB == 0:
            return causal[None].expand(B, R, R), None, None
        q, kr = self.index_qk_proj(x).split([self.nh * self.d, self.d], -1)
        q = apply_rope(self.q_layernorm(q.reshape(B, R, self.nh, self.d)), cos, sin)
        pooled = kr[:, :NB * self.r].reshape(B, NB, self.r, self.d).float().mean(2).to(kr.dtype)
        starts = torch.arange(NB, device=dev) * self.r
        kb = apply_rope(self.k_layernorm(pooled)[:, :, None, :], cos[starts], sin[starts])[:, :, 0]
        scores = torch.einsum("bshd,bnd->bshn", q.float(), kb.float()).relu().sum(2) / math.sqrt(self.d)
        complete = (torch.arange(NB, device=dev)[None, :] + 1) * self.r - 1 <= rows[:, None]  # [R,NB]
        masked = scores.detach().masked_fill(~complete, float("-inf"))
        idx = masked.topk(min(self.topk, NB), dim=-1).indices
        sel = torch.zeros(B, R, NB, dtype=torch.bool, device=dev).scatter(-1, idx, True) & complete
        n_complete = (rows + 1) // self.r
        tail = rows[None, :] >= (n_complete * self.r)[:, None]  # [R(query), R(key)]
        blk = rows // self.r
        in_block = blk < NB
        sel_tok = sel[:, :, blk.clamp(max=NB - 1)] & in_block[None, None, :]
        return causal & (tail[None] | sel_tok), scores, complete


def sdpa(q, k, v, mask, scale):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    a = (q.float() @ k.float().transpose(-1, -2)) * scale
    a = a.masked_fill(~mask, float("-inf")).softmax(-1)
    return (a @ v.float()).to(q.dtype)


class Attention(nn.Module):
    """Qwen4ExpTextAttention (QSA): gated q, q/k norms, partial RoPE, GQA, indexer-selected keys."""

    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.q_proj = nn.Linear(H, self.nh * self.hd * 2, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm = RMSNorm(self.hd, eps=c["rms_norm_eps"])
        self.k_norm = RMSNorm(self.hd, eps=c["rms_norm_eps"])
        self.indexer = QSAIndexer(c)
        self.last = None  # (allowed, scores, complete) of the last call, for evaluation

    def forward(self, x, cos, sin, row_override=None, aux=None):
        B, R, _ = x.shape
        allowed, scores, complete = self.indexer(x.detach(), cos, sin)
        if row_override is not None:
            allowed = allowed.clone()
            rows, masks = row_override
            allowed[:, rows] = masks
        self.last = (allowed.detach(), None if scores is None else scores.detach(), complete)
        q, gate = self.q_proj(x).view(B, R, self.nh, 2 * self.hd).chunk(2, -1)
        gate = gate.reshape(B, R, self.nh * self.hd)
        q = apply_rope(self.q_norm(q), cos, sin)
        k = apply_rope(self.k_norm(self.k_proj(x).view(B, R, self.nkv, self.hd)), cos, sin)
        v = self.v_proj(x).view(B, R, self.nkv, self.hd)
        rep = self.nh // self.nkv
        q, k, v = q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(rep, 1), v.transpose(1, 2).repeat_interleave(rep, 1)
        o = sdpa(q, k, v, allowed[:, None], self.hd ** -0.5)
        o = o.transpose(1, 2).reshape(B, R, self.nh * self.hd) * torch.sigmoid(gate)
        if aux is not None and scores is not None:
            aux["indexer"].append(self.indexer_kl(q, k, scores, complete))
        return self.o_proj(o)

    def indexer_kl(self, q, k, scores, complete):
        """KL(dense attention mass per complete block || softmax(indexer scores)), rows with >= 2 blocks."""
        B, _, R, _ = q.shape
        NB, r = scores.shape[-1], self.indexer.r
        with torch.no_grad():
            a = (q.float() @ k.float().transpose(-1, -2)) * self.hd ** -0.5
            rows = torch.arange(R, device=q.device)
            a = a.masked_fill(rows[None, :] > rows[:, None], float("-inf")).softmax(-1)
            blk = a[..., :NB * r].reshape(B, self.nh, R, NB, r).sum(-1).sum(1)
            blk = blk.masked_fill(~complete, 0.0)
            p = blk / blk.sum(-1, keepdim=True).clamp_min(1e-9)
            logp = p.clamp_min(1e-9).log()
        logq = scores.masked_fill(~complete, float("-inf")).log_softmax(-1).masked_fill(~complete, 0.0)
        kl = (p * (logp - logq)).masked_fill(~complete, 0.0).sum(-1)  # [B,R]
        # keep every complete block's score above a small margin: an all-zero (every ReLU closed) score
        # would tie with others and make the top-k depend on each implementation's tie-breaking
        hinge = (INDEXER_MARGIN - scores).relu().masked_fill(~complete, 0.0).sum(-1) / complete.sum(-1).clamp_min(1)
        if R < 2 * r:  # no row has two complete blocks
            return scores.sum() * 0
        return (kl + hinge)[:, 2 * r - 1:].mean()  # rows with >= 2 complete blocks


class Router(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.k, self.norm = c["num_experts_per_tok"], c["norm_topk_prob"]
        self.weight = nn.Parameter(torch.zeros(c["num_experts"], c["hidden_size"]))

    def forward(self, x):
        logits = F.linear(x, self.weight)
        probs = logits.float().softmax(-1)
        top, idx = probs.topk(self.k, -1)
        if self.norm:
            top = top / top.sum(-1, keepdim=True)
        return probs, top.to(logits.dtype), idx


class Experts(nn.Module):
    def __init__(self, c):
        super().__init__()
        E, I, H = c["num_experts"], c["moe_intermediate_size"], c["hidden_size"]
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, I))

    def forward(self, x, w):
        """x [N,H], w [N,E] routing weights (0 for experts not chosen) -> sum_e w_e * expert_e(x)."""
        g, u = torch.einsum("nh,eoh->neo", x, self.gate_up_proj).chunk(2, -1)
        h = F.silu(g) * u * w[..., None].to(g.dtype)
        return torch.einsum("nei,ehi->nh", h, self.down_proj)


class MLP(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoe(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.E = c["num_experts"]
        self.gate = Router(c)
        self.experts = Experts(c)
        self.shared_expert = MLP(c["hidden_size"], c["shared_expert_intermediate_size"])
        self.shared_expert_gate = nn.Linear(c["hidden_size"], 1, bias=False)

    def forward(self, x, aux=None):
        B, S, H = x.shape
        xf = x.reshape(-1, H)
        probs, top, idx = self.gate(xf)
        w = torch.zeros(xf.shape[0], self.E, dtype=top.dtype, device=x.device).scatter(1, idx, top)
        y = self.experts(xf, w) + torch.sigmoid(self.shared_expert_gate(xf)) * self.shared_expert(xf)
        if aux is not None:
            f = F.one_hot(idx, self.E).sum(1).float().mean(0)
            aux["balance"].append(self.E * (f * probs.mean(0)).sum())
        return y.reshape(B, S, H)


_MASK64 = (1 << 64) - 1
_GAMMA, _M1, _M2, _PRIME_1 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 10007


def _splitmix64(v):
    v = (v + _GAMMA) & _MASK64
    v = ((v ^ (v >> 30)) * _M1) & _MASK64
    v = ((v ^ (v >> 27)) * _M2) & _MASK64
    return (v ^ (v >> 31)) & _MASK64


def layer_multipliers(vocab, n, ple_index, seed):
    half = max(1, (((1 << 63) - 1) // max(vocab, 1)) // 2)
    base = seed + _PRIME_1 * ple_index
    return [2 * (_splitmix64((base + _GAMMA * (i + 1)) & _MASK64) % half) + 1 for i in range(n)]


def _is_prime(v):
    if v < 2:
        return False
    if v % 2 == 0:
        return v == 2
    return all(v % d for d in range(3, math.isqrt(v) + 1, 2))


def nth_prime_after(start, count):
    p = start
    for _ in range(count):
        p += 1
        while not _is_prime(p):
            p += 1
    return p


class NGramEmbedding(nn.Module):
    """Hashed 2..n-gram embeddings (Qwen4ExpTextNGramEmbedding, no cache: context starts as eos)."""

    def __init__(self, c, dim, ple_index):
        super().__init__()
        self.n, self.hpn = c["ngram_size"], c["heads_per_ngram"]
        self.heads = (self.n - 1) * self.hpn
        self.eos = c["eos_token_id"]
        sizes, offsets, total = [], [], 0
        for h in range(self.heads):
            s = nth_prime_after(c["ngram_vocab_size_base"] - 1, ple_index * self.heads + h + 1)
            sizes.append(s)
            offsets.append(total)
            total += s
        self.head_vocab_sizes, self.head_offsets = sizes, offsets
        self.register_buffer("mult", torch.tensor(layer_multipliers(c["vocab_size"], self.n, ple_index, c["seed"])),
                             persistent=False)
        self.register_buffer("sizes", torch.tensor(sizes), persistent=False)
        self.register_buffer("offsets", torch.tensor(offsets), persistent=False)
        div = c["make_ngram_vocab_size_divisible_by"]
        self.ngram_embedding = nn.Embedding(-(-total // div) * div, dim // self.heads)

    def shift(self, t, s):
        if s == 0:
            return t
        B, S = t.shape
        pos = torch.arange(S, device=t.device)
        eos_pos = torch.where(t == self.eos, pos, torch.full_like(pos, -1))
        prev = torch.cummax(eos_pos, dim=1).values
        prev = torch.cat([prev.new_full((B, 1), -1), prev[:, :-1]], 1)
        in_seg = pos[None] - (prev + 1)
        src = pos - s
        shifted = t.gather(1, src.clamp_min(0)[None].expand(B, -1))
        valid = (in_seg >= s) & (src[None] >= 0)
        return torch.where(valid, shifted, torch.full_like(shifted, self.eos))

    def hashed_ids(self, ids):
        B, S = ids.shape
        hist = torch.cat([ids.new_full((B, self.n - 1), self.eos), ids.long()], 1)
        sh = [self.shift(hist, s) for s in range(self.n)]
        blocks = []
        for ng in range(2, self.n + 1):
            a = (ng - 2) * self.hpn
            mixed = sh[0] * self.mult[0]
            for p in range(1, ng):
                mixed = torch.bitwise_xor(mixed, sh[p] * self.mult[p])
            blocks.append(torch.remainder(mixed[..., None], self.sizes[a:a + self.hpn]) + self.offsets[a:a + self.hpn])
        return torch.cat(blocks, -1)[:, -S:]

    def forward(self, ids):
        return self.ngram_embedding(self.hashed_ids(ids)).flatten(-2)


class PLELayer(nn.Module):
    def __init__(self, c, ple_index):
        super().__init__()
        self.H, self.hc = c["hidden_size"], c["hc_count"]
        d, n, eps = c["ple_embed_dim"], self.H * self.hc, c["rms_norm_eps"]
        self.ple_embedding = NGramEmbedding(c, d, ple_index)
        self.K, self.dil = c["ple_conv_kernel_size"], c["ngram_size"]
        self.key_proj = nn.Linear(d, n, bias=False)
        self.value_proj = nn.Linear(d, self.H, bias=False)
        self.norm_key = RMSNorm(n, self.H, eps)
        self.norm_query = RMSNorm(n, self.H, eps)
        self.norm_conv = RMSNorm(n, self.H, eps)
        self.conv1d = nn.Conv1d(n, n, self.K, groups=n, dilation=self.dil, bias=False)

    def forward(self, x, ids):
        e = self.ple_embedding(ids)
        key = self.norm_key(self.key_proj(e)).unflatten(-1, (self.hc, self.H))
        value = self.value_proj(e)
        query = self.norm_query(x).unflatten(-1, (self.hc, self.H))
        gate = (key * query).sum(-1, keepdim=True) / math.sqrt(self.H)
        gate = gate.abs().clamp_min(1e-6).sqrt() * gate.sign()
        gv = torch.sigmoid(gate) * value.unsqueeze(-2)
        gvn = self.norm_conv(gv.flatten(-2))
        gv = gv.flatten(-2)
        h = F.pad(gvn.transpose(1, 2), ((self.K - 1) * self.dil, 0))
        return gv + F.silu(self.conv1d(h)).transpose(1, 2)


class DecoderLayer(nn.Module):
    def __init__(self, c, layer_type, ple_index=None):
        super().__init__()
        self.layer_type = layer_type
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(c)
        else:
            self.self_attn = Attention(c)
        self.mlp = SparseMoe(c)
        self.ple = PLELayer(c, ple_index) if ple_index is not None else None
        self.attn_hyper_connection = GatedResidual(c)
        self.mlp_hyper_connection = GatedResidual(c)

    def forward(self, x, cos, sin, ids=None, row_override=None, aux=None):
        if self.ple is not None:
            x = x + self.ple(x, ids)
        h, hin, inj = self.attn_hyper_connection(x)
        if self.layer_type == "linear_attention":
            h = self.linear_attn(h)
        else:
            h = self.self_attn(h, cos, sin, row_override, aux)
        x = hin + (h.unsqueeze(-2) * inj.unsqueeze(-1)).flatten(-2)
        h, hin, inj = self.mlp_hyper_connection(x)
        h = self.mlp(h, aux)
        return hin + (h.unsqueeze(-2) * inj.unsqueeze(-1)).flatten(-2)


class TextModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        ple_ids = c["ple_layer_ids"]
        types = ["qwen_sparse_attention" if t == "full_attention" else t for t in c["layer_types"]]
        self.layers = nn.ModuleList(
            DecoderLayer(c, t, ple_ids.index(i + 1) if i + 1 in ple_ids else None) for i, t in enumerate(types))
        self.hyper_connection_mixer = GatedResidual(c, combine=False)


class MTP(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, hc, eps = c["hidden_size"], c["hc_count"], c["rms_norm_eps"]
        self.H, self.hc = H, hc
        self.fc_embedding = nn.Linear(H, H, bias=False)
        self.fc_hidden = nn.Linear(H, H, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(H, eps=eps)
        self.pre_fc_norm_hidden = RMSNorm(hc * H, eps=eps)
        self.layers = nn.ModuleList(DecoderLayer(c, "qwen_sparse_attention") for _ in range(c["mtp_num_hidden_layers"]))
        self.hyper_connection_mixer = GatedResidual(c, combine=False)

    def fuse(self, emb, multi):
        e = self.fc_embedding(self.pre_fc_norm_embedding(emb))
        s = self.fc_hidden(self.pre_fc_norm_hidden(multi).unflatten(-1, (self.hc, self.H)))
        return (s + e.unsqueeze(-2)).flatten(-2)


class Qwen4Exp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = TextModel(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.mtp = MTP(c)
        self.rd = int(c["head_dim"] * c["rope_parameters"].get("partial_rotary_factor", 1.0))
        self.theta = c["rope_parameters"]["rope_theta"]

    def rope(self, positions):
        return rope_tables(positions, self.rd, self.theta)

    def target(self, ids, aux=None, collect=None):
        """ids [B,S] -> (pre-final-mixer multi stream [B,S,hc*H], logits [B,S,V])."""
        cos, sin = self.rope(torch.arange(ids.shape[1], device=ids.device))
        x = self.model.embed_tokens(ids).repeat(1, 1, self.c["hc_count"])
        for layer in self.model.layers:
            x = layer(x, cos, sin, ids=ids, aux=aux)
            if collect is not None:
                collect.append(x)
        return x, self.lm_head(self.model.hyper_connection_mixer(x))

    def mtp_layer(self, j, x, positions, row_override=None, aux=None):
        """MTP layer j over fused inputs x [B,R,hc*H] at `positions` [R] -> (out multi, logits)."""
        cos, sin = self.rope(positions)
        out = self.mtp.layers[j](x, cos, sin, row_override=row_override, aux=aux)
        return out, self.lm_head(self.mtp.hyper_connection_mixer(out))

    def mtp_chain(self, ids, multi, aux=None):
        """Teacher-forced chain over a window: ids [B,S], target multi [B,S,.] -> [(out, logits)] per layer;
        layer j has rows at positions j..S-2, row p gets token p+1 and predicts token p+2."""
        S = ids.shape[1]
        res, prev = [], multi[:, :S - 1]
        for j in range(len(self.mtp.layers)):
            x = self.mtp.fuse(self.model.embed_tokens(ids[:, j + 1:]), prev)
            out, logits = self.mtp_layer(j, x, torch.arange(j, S - 1, device=ids.device), aux=aux)
            res.append((out, logits))
            prev = out[:, :-1]
        return res


def init_weights(net, c):
    std = c["initializer_range"]
    for name, m in net.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, std)
        elif isinstance(m, (Experts,)):
            nn.init.normal_(m.gate_up_proj, 0.0, std)
            nn.init.normal_(m.down_proj, 0.0, std)
        elif isinstance(m, Router):
            nn.init.normal_(m.weight, 0.0, std)
        elif isinstance(m, PLELayer):
            nn.init.zeros_(m.conv1d.weight)


# --------------------------------------------------------------------------------------------- export
QUANT_SUFFIXES = ("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight", "linear_attn.out_proj.weight",
                  "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                  "self_attn.o_proj.weight", "self_attn.indexer.index_qk_proj.weight",
                  "shared_expert.gate_proj.weight", "shared_expert.up_proj.weight", "shared_expert.down_proj.weight",
                  "ple.key_proj.weight", "ple.value_proj.weight", "mtp.fc_embedding.weight", "mtp.fc_hidden.weight")


def is_quantized(hub):
    return ".mlp.experts." in hub or hub.endswith(QUANT_SUFFIXES)


def quantize_fp8(w, block):
    """[R, C] -> (e4m3 [R, C], fp32 scale_inv [ceil(R/b0), ceil(C/b1)]); w ~= q * scale_inv blockwise."""
    R, C = w.shape
    b0, b1 = block
    rb, cb = -(-R // b0), -(-C // b1)
    pad = torch.zeros(rb * b0, cb * b1, dtype=torch.float32, device=w.device)
    pad[:R, :C] = w.float()
    blocks = pad.view(rb, b0, cb, b1)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.view(rb * b0, cb * b1)[:R, :C].contiguous(), scale.contiguous()


def dequantize(q, s, block):
    R, C = q.shape
    return q.float() * s.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:R, :C]


def to_hub(net):
    """Internal state dict -> hub tensors (FP8 + scales, bf16) and modules_to_not_convert."""
    c = net.c
    parts = c["split_ngram_parts"]
    tensors = {}

    def put(name, t):
        t = t.detach().float().cpu()
        if is_quantized(name):
            q, s = quantize_fp8(t, BLOCK)
            tensors[name] = q
            tensors[name[:-len(".weight")] + ".weight_scale_inv"] = s
        else:
            tensors[name] = t.to(torch.bfloat16).contiguous()

    for name, t in net.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base, I = name[:-len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                put(f"{base}{e}.gate_proj.weight", t[e, :I])
                put(f"{base}{e}.up_proj.weight", t[e, I:])
        elif name.endswith("mlp.experts.down_proj"):
            base = name[:-len("down_proj")]
            for e in range(t.shape[0]):
                put(f"{base}{e}.down_proj.weight", t[e])
        elif name.endswith("ngram_embedding.weight"):
            base = name[:-len("weight")]
            for i, sh in enumerate(t.chunk(parts, 0)):
                put(f"{base}shard_{i}.weight", sh)
        else:
            put(name, t)
    not_convert = sorted(n for n, m in net.named_modules()  # every Linear-like module left bf16, routers too
                         if isinstance(m, (nn.Linear, Router)) and not is_quantized(n + ".weight"))
    return tensors, not_convert


def from_hub(tensors, c):
    """Hub tensors -> internal fp32 state dict (FP8 dequantized, experts merged, n-gram shards joined)."""
    out, experts, shards = {}, {}, {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        w = dequantize(t, tensors[name[:-len(".weight")] + ".weight_scale_inv"], BLOCK) if t.dtype == torch.float8_e4m3fn \
            else t.float()
        if ".mlp.experts." in name:
            base, rest = name.split(".mlp.experts.")
            e, proj = rest.split(".")[:2]
            experts.setdefault(base, {}).setdefault(proj, {})[int(e)] = w
        elif ".ngram_embedding.shard_" in name:
            base, rest = name.split(".shard_")
            shards.setdefault(base, {})[int(rest.split(".")[0])] = w
        else:
            out[name] = w
    for base, d in experts.items():
        E = len(d["gate_proj"])
        out[f"{base}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([d["gate_proj"][e], d["up_proj"][e]], 0) for e in range(E)])
        out[f"{base}.mlp.experts.down_proj"] = torch.stack([d["down_proj"][e] for e in range(E)])
    for base, d in shards.items():
        out[f"{base}.weight"] = torch.cat([d[i] for i in range(len(d))], 0)
    return out


def write_checkpoint(net, model_dir):
    from safetensors.torch import save_file
    os.makedirs(model_dir, exist_ok=True)
    tensors, not_convert = to_hub(net)
    save_file(tensors, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg = dict(CONFIG)
    cfg.update(model_type="qwen4_exp_text", architectures=["Qwen4ExpForCausalLM"], dtype="bfloat16",
               quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                    "weight_block_size": BLOCK, "modules_to_not_convert": not_convert})
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "do_sample": False,
                   "num_speculative_tokens": 3}, f, indent=2)
    return tensors, not_convert


# ------------------------------------------------------------------------------------------ training
def losses(net, batch, aux=None):
    inp, tgt = batch[:, :-1], batch[:, 1:]
    multi, logits = net.target(inp, aux)
    V = logits.shape[-1]
    lm = F.cross_entropy(logits.float().reshape(-1, V), tgt.reshape(-1))
    acc = [(logits.argmax(-1) == tgt).float().mean()]
    mtp = []
    for j, (_, lg) in enumerate(net.mtp_chain(inp, multi, aux)):
        t = tgt[:, j + 1:]
        mtp.append(F.cross_entropy(lg.float().reshape(-1, V), t.reshape(-1)))
        acc.append((lg.argmax(-1) == t).float().mean())
    return lm, mtp, acc


def batch_from(ids, n, gen=None):
    starts = torch.randint(0, ids.numel() - SEQ - 2, (n,), device=ids.device, generator=gen)
    return torch.stack([ids[s:s + SEQ + 1] for s in starts.tolist()])


@torch.no_grad()
def evaluate(net, held_ids, n_batches, bs, autocast):
    gen = torch.Generator(device=held_ids.device).manual_seed(123)
    tot = None
    ties = [0, 0]
    for _ in range(n_batches):
        with autocast():
            lm, mtp, acc = losses(net, batch_from(held_ids, bs, gen))
        row = torch.tensor([lm.item()] + [m.item() for m in mtp] + [a.item() for a in acc])
        tot = row if tot is None else tot + row
        for layer in list(net.model.layers) + list(net.mtp.layers):
            if layer.layer_type != "linear_attention" and layer.self_attn.last[1] is not None:
                t, n = topk_near_ties(layer.self_attn)
                ties[0] += t
                ties[1] += n
    tot = (tot / n_batches).tolist()
    n = len(net.mtp.layers)
    return dict(lm_loss=tot[0], mtp_loss=tot[1:1 + n], top1_target=tot[1 + n], top1_mtp=tot[2 + n:],
                topk_boundary_near_ties=ties[0], topk_boundary_decisions=ties[1])


def topk_near_ties(attn, rel=1e-4):
    """How many top-k block decisions of the last call had the k-th and (k+1)-th scores within rel."""
    _, scores, complete = attn.last
    k = attn.indexer.topk
    rows = complete.sum(-1) > k
    if not bool(rows.any()):
        return 0, 0
    s = scores[:, rows].float().masked_fill(~complete[rows][None], float("-inf"))
    top = s.topk(k + 1, dim=-1).values
    a, b = top[..., k - 1], top[..., k]
    return int(((a - b).abs() <= rel * a.abs().clamp_min(1e-6)).sum()), a.numel()


@torch.no_grad()
def greedy(net, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        _, lg = net.target(torch.tensor([ids], device=net.lm_head.weight.device))
        ids.append(int(lg[0, -1].argmax()))
    return ids


@torch.no_grad()
def acceptance(net, prompts, n_new, k):
    """Greedy MTP speculation as nextn runs it (docs/speculative.md), counted on the target's greedy
    continuation: a round at m (target has processed [0, m), t_m is the newest token) drafts d1 from
    layer 0's canonical row m-1, then step s = 1..k-1 uses layer s mod 2 on one row at position m-1+s
    (token d_s, hidden = step s-1's out) attending, instead of running its indexer, to the positions
    layer 0's row m-1 selected, plus the layer's speculative rows of this round; drafts are accepted
    while they equal the target's greedy tokens, and the round moves m by accepted + 1."""
    dev = net.lm_head.weight.device
    n_mtp = len(net.mtp.layers)
    rounds, accepted, per_pos = 0, 0, [0] * k
    for prompt in prompts:
        s = torch.tensor([greedy(net, prompt, n_new)], device=dev)
        T = s.shape[1]
        multi, _ = net.target(s)
        # canonical rows of every layer over the whole sequence (causal, so a prefix's rows are the same)
        canon_x, canon_out, canon_pred, prev = [], [], [], multi[:, :T - 1]
        for j in range(n_mtp):
            x = net.mtp.fuse(net.model.embed_tokens(s[:, j + 1:]), prev)
            out, lg = net.mtp_layer(j, x, torch.arange(j, T - 1, device=dev))
            if j == 0:
                allowed0 = net.mtp.layers[0].self_attn.last[0][0]  # [rows, rows], row = position
            canon_x.append(x)
            canon_out.append(out)
            canon_pred.append(lg.argmax(-1)[0])
            prev = out[:, :-1]
        m = len(prompt)
        while m + k < T:
            S0 = allowed0[m - 1, :m]  # positions 0..m-1 selected by layer 0's row m-1
            drafts = [int(canon_pred[0][m - 1])]
            h = canon_out[0][:, m - 1:m]
            spec = [[] for _ in range(n_mtp)]  # this round's speculative rows per layer: (x, position)
            for step in range(1, k):
                j, pos = step % n_mtp, m - 1 + step
                xr = net.mtp.fuse(net.model.embed_tokens(torch.tensor([[drafts[-1]]], device=dev)), h)
                spec[j].append((xr, pos))
                ncan = m - j  # layer j's canonical rows: positions j..m-1
                xs = torch.cat([canon_x[j][:, :ncan]] + [x for x, _ in spec[j]], 1)
                positions = torch.tensor(list(range(j, m)) + [p for _, p in spec[j]], device=dev)
                R = xs.shape[1]
                mask = torch.zeros(R, dtype=torch.bool, device=dev)
                mask[:ncan] = S0[j:m]
                mask[ncan:] = True
                out, lg = net.mtp_layer(j, xs, positions, row_override=([R - 1], mask[None, None, :]))
                drafts.append(int(lg[0, -1].argmax()))
                h = out[:, -1:]
            a = 0
            while a < k and drafts[a] == int(s[0, m + 1 + a]):
                per_pos[a] += 1
                a += 1
            rounds += 1
            accepted += a
            m += a + 1
    return dict(k=k, rounds=rounds, mean_acceptance_length=1 + accepted / max(rounds, 1),
                per_position_acceptance=[p / max(rounds, 1) for p in per_pos], prompts=len(prompts),
                tokens_per_prompt=n_new)


# ------------------------------------------------------------------------------------- transformers
def hf_check(model_dir, net, prompt, report, n_greedy):
    """Loads the export with transformers and compares with this file's model on the same weights."""
    import transformers
    from transformers import Qwen4ExpForCausalLM
    dev = net.lm_head.weight.device
    ids = torch.tensor([prompt], device=dev)
    mine_layers = []
    with torch.no_grad():
        multi, ref = net.target(ids, collect=mine_layers)
    ref = ref[0].float()
    # rows from which a top-k decision of ours was a near-tie (transformers may break it otherwise)
    first_tie = len(prompt)
    for layer in net.model.layers:
        if layer.layer_type != "linear_attention":
            _, sc, comp = layer.self_attn.last
            k = layer.self_attn.indexer.topk
            for row in range(sc.shape[1]):
                n = int(comp[row].sum())
                if n > k:
                    top = sc[0, row, :n].float().topk(k + 1).values
                    if (top[k - 1] - top[k]).abs() <= 1e-4 * top[k - 1].abs().clamp_min(1e-6):
                        first_tie = min(first_tie, row)
                        break
    out = {"prompt_tokens": len(prompt), "first_near_tie_row": first_tie}

    def compare(lg):
        d = (lg - ref).abs().max().item()
        r = dict(max_abs_diff=d, rel=d / ref.abs().max().item(),
                 argmax_agree=(lg.argmax(-1) == ref.argmax(-1)).float().mean().item())
        if first_tie < len(prompt):
            r["rel_before_first_tie"] = (lg[:first_tie] - ref[:first_tie]).abs().max().item() / ref.abs().max().item()
        return r

    variants = [("dequantize", lambda: dict(dtype=torch.float32, quantization_config=transformers.FineGrainedFP8Config(
        dequantize=True)), None), ("fp8", lambda: dict(dtype=torch.bfloat16), None)]
    hf_tight = hf_loose = None
    for name, kw, tol in variants:
        try:
            hf = Qwen4ExpForCausalLM.from_pretrained(model_dir, **kw()).to(dev).eval()
            if name == "dequantize":  # transformers dequantizes FP8 weights to bf16; run them in fp32
                hf = hf.float()
            with torch.no_grad():
                lg = hf(input_ids=ids).logits[0].float()
            r = compare(lg)
            hf_loose = hf_loose or (hf if name == "dequantize" else None)
            if tol is not None:
                r["ok"] = r.get("rel_before_first_tie", r["rel"]) < tol
                if r["ok"]:
                    hf_tight = hf
                else:  # where it starts to differ: transformers' per-layer outputs against ours
                    with torch.no_grad():
                        hs = hf(input_ids=ids, output_hidden_states=True).hidden_states
                    r["per_layer"] = [[i, list(h.shape), [round((h - m).abs().max().item() / m.abs().max().item(), 6)
                                                         for m in mine_layers if m.shape == h.shape][:len(mine_layers)]]
                                      for i, h in enumerate(hs)]
            out[name] = r
            log("transformers", name, r)
        except Exception as ex:  # noqa: BLE001 - report what transformers says
            out[name] = {"error": f"{type(ex).__name__}: {str(ex)[:400]}"}
            log("transformers", name, "failed:", out[name]["error"])
    if hf_tight is None:  # plain (unquantized) copy of the same weights
        try:
            from safetensors.torch import load_file, save_file
            plain = "/tmp/qwen4_exp_plain"
            os.makedirs(plain, exist_ok=True)
            t = load_file(os.path.join(model_dir, "model.safetensors"))
            deq = {}
            for n, v in t.items():
                if n.endswith("_scale_inv"):
                    continue
                deq[n] = dequantize(v, t[n[:-len(".weight")] + ".weight_scale_inv"], BLOCK) if v.dtype == torch.float8_e4m3fn else v.float()
            save_file(deq, os.path.join(plain, "model.safetensors"), metadata={"format": "pt"})
            cfg = json.load(open(os.path.join(model_dir, "config.json")))
            cfg.pop("quantization_config")
            cfg["dtype"] = "float32"
            json.dump(cfg, open(os.path.join(plain, "config.json"), "w"))
            hf = Qwen4ExpForCausalLM.from_pretrained(plain, dtype=torch.float32).to(dev).eval()
            with torch.no_grad():
                lg = hf(input_ids=ids).logits[0].float()
            r = compare(lg)
            r["ok"] = r.get("rel_before_first_tie", r["rel"]) < 1e-3
            hf_loose = hf_loose or hf
            out["plain_fp32_copy"] = r
            log("transformers plain copy", r)
            if r["ok"]:
                hf_tight = hf
        except Exception as ex:  # noqa: BLE001
            out["plain_fp32_copy"] = {"error": f"{type(ex).__name__}: {str(ex)[:400]}"}
            log("transformers plain copy failed:", out["plain_fp32_copy"]["error"])
    ref_out = None
    if hf_tight is None and hf_loose is not None:
        log("transformers' logits differ from ours: greedy and MTP checks on the loaded model anyway")
    if hf_tight is not None or hf_loose is not None:
        hf_tight = hf_tight or hf_loose
        try:  # transformers' cached greedy decoding vs this file's full-recompute greedy
            with torch.no_grad():
                o = hf_tight(input_ids=ids, use_cache=True)
                past, nxt, g = o.past_key_values, o.logits[0, -1].argmax(), []
                for _ in range(n_greedy):
                    g.append(int(nxt))
                    o = hf_tight(input_ids=nxt.view(1, 1), past_key_values=past, use_cache=True)
                    past, nxt = o.past_key_values, o.logits[0, -1].argmax()
                g = torch.tensor(g)
            mine = greedy(net, prompt, n_greedy)[len(prompt):]
            out["greedy_cached_agree"] = int(sum(int(a) == b for a, b in zip(g.tolist(), mine)))
            out["greedy_len"] = n_greedy
            log("greedy: transformers (cache) vs ours agree on", out["greedy_cached_agree"], "of", n_greedy)
            ref_out = {"input_ids": ids[0].cpu(), "greedy_ids": g.cpu().long()}
            with torch.no_grad():
                ref_out["logits"] = hf_tight(input_ids=ids).logits[0].float().cpu()
        except Exception as ex:  # noqa: BLE001
            out["greedy_error"] = f"{type(ex).__name__}: {str(ex)[:400]}"
            log("greedy check failed:", out["greedy_error"])
        try:  # the MTP layers are transformers decoder layers: same names, same math
            import copy
            from transformers.models.qwen4_exp import modeling_qwen4_exp as M
            cfg2 = copy.deepcopy(hf_tight.config)
            L = cfg2.num_hidden_layers
            cfg2.layer_types = list(cfg2.layer_types) + ["qwen_sparse_attention"] * len(net.mtp.layers)
            diffs = []
            with torch.no_grad():
                chain = net.mtp_chain(ids, multi)
                prev = multi[:, :ids.shape[1] - 1]
                for j in range(len(net.mtp.layers)):
                    layer = M.Qwen4ExpTextDecoderLayer(cfg2, L + j).to(dev).float().eval()
                    layer.load_state_dict(net.mtp.layers[j].state_dict(), strict=True)
                    x = net.mtp.fuse(net.model.embed_tokens(ids[:, j + 1:]), prev)
                    R = x.shape[1]
                    pos = torch.arange(j, j + R, device=dev)[None, None].expand(3, 1, R)
                    pe = hf_tight.model.rotary_emb(x, pos)
                    mask = torch.ones(R, R, dtype=torch.bool, device=dev).tril()[None, None]
                    y = layer(x, position_embeddings=pe, attention_mask=mask)
                    y = y[0] if isinstance(y, tuple) else y
                    diffs.append((y - chain[j][0]).abs().max().item() / chain[j][0].abs().max().item())
                    prev = chain[j][0][:, :-1]
            out["mtp_layers_vs_transformers_decoder_layer_rel"] = diffs
            log("MTP layers vs transformers' Qwen4ExpTextDecoderLayer (rel max diff):", diffs)
            ref_out["mtp0_logits"] = chain[0][1][0].float().cpu()
            ref_out["mtp1_logits"] = chain[1][1][0].float().cpu()
        except Exception as ex:  # noqa: BLE001
            out["mtp_check_error"] = f"{type(ex).__name__}: {str(ex)[:400]}"
            log("MTP check failed:", out["mtp_check_error"])
    report["transformers_check"] = out
    return ref_out


# ------------------------------------------------------------------------------------------------ main
def main():
    from tokenizers import Tokenizer
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(STATE_DIR, exist_ok=True)
    torch.manual_seed(0)
    random.seed(0)
    dev = torch.device(DEVICE)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if dev.type == "cuda" else contextlib.nullcontext
    train_files, held_files = collect_files()
    log(f"{len(train_files)} train files, {len(held_files)} held-out files")
    train_texts, train_chars = [], 0
    random.Random(0).shuffle(train_files)
    for _, _, p in train_files:
        t = read(p)
        if t:
            train_texts.append(t)
            train_chars += len(t)
        if train_chars >= MAX_TRAIN_CHARS:
            break
    held_texts = [t for t in (read(p) for _, _, p in held_files) if t]
    if SMOKE:
        held_texts = held_texts[:60]
    log(f"train {train_chars / 1e6:.1f} M chars, held-out {sum(map(len, held_texts)) / 1e6:.1f} M chars")
    tok = Tokenizer.from_file(TOKENIZER)
    log("tokenizer vocab", tok.get_vocab_size(), "eos id", tok.token_to_id("<|eos|>"))
    assert tok.token_to_id("<|eos|>") == CONFIG["eos_token_id"] and tok.get_vocab_size() <= VOCAB
    train_ids = encode_stream(tok, train_texts).to(dev)
    held_ids = encode_stream(tok, held_texts).to(dev)
    log(f"train {train_ids.numel() / 1e6:.1f} M tokens, held-out {held_ids.numel() / 1e6:.2f} M tokens")

    net = Qwen4Exp(CONFIG)
    init_weights(net, CONFIG)
    net.to(dev)
    n_target = sum(p.numel() for n, p in net.named_parameters() if not n.startswith("mtp."))
    n_mtp = sum(p.numel() for n, p in net.named_parameters() if n.startswith("mtp."))
    hub, _ = to_hub(net)
    size = sum(t.numel() * t.element_size() for t in hub.values())
    log(f"target {n_target / 1e6:.2f} M params, MTP {n_mtp / 1e6:.2f} M params, export {size / 1e6:.3f} MB "
        f"in {len(hub)} tensors")
    decay = [p for n, p in net.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in net.named_parameters() if p.dim() < 2]
    params = decay + no_decay
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=2e-3, betas=(0.9, 0.95))
    state_path = os.path.join(STATE_DIR, "state.pt")
    step = 0
    if os.path.exists(state_path) and not SMOKE:
        st = torch.load(state_path, map_location=dev)
        net.load_state_dict(st["net"])
        opt.load_state_dict(st["opt"])
        step = st["step"]
        log("resumed at step", step)

    deadline = T_START + TRAIN_SECONDS
    warmup = 60
    run_budget = max(deadline - time.time(), 1.0)
    net.train()
    t_train = time.time()
    steps_this_run = 0
    while time.time() < deadline and steps_this_run < MAX_STEPS:
        frac = min((time.time() - t_train) / run_budget, 1.0)
        lr = 2e-3 * min(1.0, (step + 1) / warmup) * max(0.1, 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        batch = batch_from(train_ids, BATCH)
        aux = {"balance": [], "indexer": []}
        with autocast():
            lm, mtp, acc = losses(net, batch, aux)
            bal = torch.stack(aux["balance"]).mean()
            idx = torch.stack(aux["indexer"]).mean()
            loss = lm + MTP_WEIGHT * torch.stack(mtp).mean() + BALANCE_WEIGHT * bal + INDEXER_WEIGHT * idx
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        steps_this_run += 1
        if step % (2 if SMOKE else 100) == 0:
            log(f"step {step} lr {lr:.2e} lm {lm.item():.3f} mtp {' '.join(f'{m.item():.3f}' for m in mtp)} "
                f"bal {bal.item():.3f} idxKL {idx.item():.3f} ({steps_this_run / (time.time() - t_train):.2f} it/s)")
    train_seconds = time.time() - t_train
    if not SMOKE:
        torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "step": step}, state_path)
    log(f"trained {steps_this_run} steps this run ({step} total) in {train_seconds:.0f} s; state saved")

    # Export, then every measurement on the exported weights (dequantized, fp32).
    model_dir = os.path.join(OUT, MODEL_NAME)
    tensors, not_convert = write_checkpoint(net, model_dir)
    size = os.path.getsize(os.path.join(model_dir, "model.safetensors"))
    log(f"exported {len(tensors)} tensors, model.safetensors {size / 1e6:.3f} MB, {len(not_convert)} modules not converted")
    report = dict(steps=step, steps_this_run=steps_this_run, tokens_seen=step * BATCH * SEQ, seq=SEQ, batch=BATCH,
                  train_seconds=train_seconds, train_tokens=int(train_ids.numel()),
                  heldout_tokens=int(held_ids.numel()), train_files=len(train_files), heldout_files=len(held_files),
                  target_params=n_target, mtp_params=n_mtp, safetensors_bytes=size, device=torch.cuda.get_device_name()
                  if dev.type == "cuda" else "cpu", torch=torch.__version__)
    rep_path = os.path.join(OUT, "train_report.json")

    def save_report():
        with open(rep_path, "w") as f:
            json.dump(report, f, indent=2)

    save_report()
    ev = Qwen4Exp(CONFIG)
    missing, unexpected = ev.load_state_dict(from_hub(tensors, CONFIG), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    ev.to(dev).eval()
    with torch.no_grad():
        report["heldout_exported_fp32"] = evaluate(ev, held_ids, 2 if SMOKE else 20, 16, contextlib.nullcontext)
        log("held-out (exported weights, fp32):", report["heldout_exported_fp32"])
        net.eval()
        report["heldout_training_weights_bf16"] = evaluate(net, held_ids, 2 if SMOKE else 20, 16, autocast)
        log("held-out (training weights, bf16 autocast):", report["heldout_training_weights_bf16"])
    save_report()

    prompt = [1] + tok.encode(held_texts[0][:4000], add_special_tokens=False).ids[:191]
    try:
        import transformers
        report["transformers"] = transformers.__version__
        ref = hf_check(model_dir, ev, prompt, report, 8 if SMOKE else 48)
        tight = any(isinstance(v, dict) and v.get("ok") for v in report["transformers_check"].values())
        if ref is not None and tight:
            from safetensors.torch import save_file
            save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(OUT, "reference.safetensors"))
    except Exception as ex:  # noqa: BLE001
        report["transformers_check_error"] = f"{type(ex).__name__}: {str(ex)[:400]}"
        log("transformers check failed:", report["transformers_check_error"])
    save_report()

    oracle = os.path.join(ROOT, "tests", "fixtures", "bundled", "tokenizer_oracle.jsonl")
    texts = [json.loads(l)["text"] for l in open(oracle)] if os.path.exists(oracle) else []
    texts = [t for t in texts if len(t) > 200][: 2 if SMOKE else 12]
    prompts = [[1] + tok.encode(t, add_special_tokens=False).ids for t in texts]
    t0 = time.time()
    report["acceptance_greedy"] = acceptance(ev, prompts, 16 if SMOKE else 128, 3)
    report["acceptance_greedy"]["seconds"] = time.time() - t0
    log("greedy acceptance:", report["acceptance_greedy"])
    save_report()
    log("done")


if __name__ == "__main__":
    main()
