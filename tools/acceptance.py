#!/usr/bin/env python3
"""Acceptance and speed of MTP speculation on held-out Python files, through the nextn CLI.

Usage: python3 tools/acceptance.py [--model DIR] [--tokens N] [--prompts N]
Prompts: the held-out snippets recorded with the bundled model (tests/fixtures/bundled/
tokenizer_oracle.jsonl: slices of files the model never saw). Prints markdown tables for
docs/performance.md: greedy k = 1..4 (mean acceptance length, per-position acceptance, decode tokens/s
with and without speculation) and sampling at T = 1 with draft probabilities kept or ignored.
"""
import argparse
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("--model", default=os.path.join(ROOT, "models", "nextn-hy4-tiny"))
ap.add_argument("--tokens", type=int, default=128)
ap.add_argument("--prompts", type=int, default=12)
ap.add_argument("--nextn", default=os.path.join(ROOT, "build", "bin", "nextn"))
args = ap.parse_args()

texts = [json.loads(l)["text"] for l in open(os.path.join(ROOT, "tests/fixtures/bundled/tokenizer_oracle.jsonl"))]
texts = [t for t in texts if len(t) > 200][: args.prompts]


def run(extra):
    agg = dict(d=0, a=0, n=0, pos=None, gen=0, sec=0.0)
    for i, t in enumerate(texts):
        out = subprocess.run([args.nextn, "generate", "--model", args.model, "--prompt", t, "-n", str(args.tokens),
                              "--json", "--ignore-eos", "--seed", str(i)] + extra, capture_output=True, text=True,
                             check=True)
        s = json.loads(out.stdout)["stats"]
        agg["d"] += s["num_draft_tokens"]
        agg["a"] += s["num_accepted_tokens"]
        agg["n"] += s["num_drafts"]
        agg["gen"] += s["num_generated"] - 1
        agg["sec"] += s["decode_seconds"]
        pp = [p * s["num_drafts"] for p in s["per_position_acceptance"]]
        agg["pos"] = pp if agg["pos"] is None else [x + y for x, y in zip(agg["pos"], pp)]
    tps = agg["gen"] / agg["sec"]
    mal = 1 + agg["a"] / agg["n"] if agg["n"] else 1.0
    pos = [p / agg["n"] for p in agg["pos"]] if agg["n"] else []
    return mal, pos, tps, (agg["a"] / agg["d"] if agg["d"] else 0.0)


_, _, base, _ = run(["--no-speculate"])
print(f"{len(texts)} held-out prompts, {args.tokens} tokens each; plain greedy decode {base:.1f} tokens/s\n")
print("| k | mean acceptance length | per-position acceptance | tokens/s | speedup |")
print("| --- | --- | --- | --- | --- |")
for k in range(1, 5):
    mal, pos, tps, _ = run(["--speculative-tokens", str(k)])
    print(f"| {k} | {mal:.2f} | {' / '.join(f'{p:.3f}' for p in pos)} | {tps:.1f} | {tps / base:.2f}x |")
print("\n| sampling, k = 3 | acceptance rate | mean acceptance length |")
print("| --- | --- | --- |")
for name, extra in [("T = 1, draft probabilities kept", ["--temperature", "1"]),
                    ("T = 1, draft treated as one-hot (q ignored)", ["--temperature", "1", "--no-draft-probs"]),
                    ("T = 0.7, top-p 0.95, kept", ["--temperature", "0.7", "--top-p", "0.95"]),
                    ("T = 0.7, top-p 0.95, one-hot", ["--temperature", "0.7", "--top-p", "0.95", "--no-draft-probs"])]:
    mal, _, _, rate = run(["--speculative-tokens", "3"] + extra)
    print(f"| {name} | {rate:.3f} | {mal:.2f} |")
