#!/usr/bin/env bash
# `make demo`: both bundled models write Python with their own 2 MTP layers drafting ahead (k tuned per step by
# measured speed), then the same prompt without speculation:
#   models/nextn-hy4-tiny       HY V4 (MLA + DSA indexer, iHC, MoE, FP8), tools/train/train_hy_v4.py
#   models/nextn-qwen4exp-tiny  Qwen4-Exp (Gated DeltaNet + QSA, GatedResidual HC, PLE, MoE, FP8),
#                               tools/train/train_qwen4_exp.py
set -euo pipefail
NEXTN=${1:-build/bin/nextn}
cd "$(dirname "$0")/.."
PROMPT='import os


def read_lines(path):
    """Return the lines of a text file."""
'
for MODEL in models/nextn-hy4-tiny models/nextn-qwen4exp-tiny; do
  echo "== nextn generate --model $MODEL (2 MTP layers drafting; k tuned by speed) =="
  printf '%s' "$PROMPT"
  "$NEXTN" generate --model "$MODEL" --prompt "$PROMPT" -n 96
  echo
  echo "== the same prompt without speculation (identical text, more target forwards) =="
  "$NEXTN" generate --model "$MODEL" --prompt "$PROMPT" -n 96 --no-speculate >/dev/null
  echo
done
