#!/usr/bin/env bash
# `make demo`: generates with the bundled model, MTP speculation on, and prints the acceptance it gets.
set -euo pipefail
NEXTN=${1:-build/bin/nextn}
cd "$(dirname "$0")/.."
MODEL=${NEXTN_DEMO_MODEL:-tests/fixtures/hy_v4/b_fp32}
echo "== nextn generate on $MODEL (2 MTP layers, k=3) =="
"$NEXTN" generate --model "$MODEL" --ids 5,17,42,99,7,3,250,64,11,128 -n 40 --speculative-tokens 3
echo
echo "== the same without speculation (identical ids) =="
"$NEXTN" generate --model "$MODEL" --ids 5,17,42,99,7,3,250,64,11,128 -n 40 --no-speculate
