#!/usr/bin/env bash
# `make demo`: the bundled model (models/nextn-hy4-tiny, trained by tools/train/train_hy_v4.py) writes Python,
# with its own 2 MTP layers drafting up to 2 tokens ahead (k tuned per step by measured speed); then the
# same prompt without speculation.
set -euo pipefail
NEXTN=${1:-build/bin/nextn}
cd "$(dirname "$0")/.."
PROMPT='import os


def read_lines(path):
    """Return the lines of a text file."""
'
echo "== nextn generate (bundled HY V4 + 2 MTP layers drafting up to k=2 tokens, the model's default; k tuned by speed) =="
printf '%s' "$PROMPT"
"$NEXTN" generate --prompt "$PROMPT" -n 96
echo
echo "== the same prompt without speculation (identical text, more target forwards) =="
"$NEXTN" generate --prompt "$PROMPT" -n 96 --no-speculate >/dev/null
