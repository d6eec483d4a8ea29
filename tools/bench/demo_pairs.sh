#!/usr/bin/env bash
# P13's measure of `make demo`: N interleaved pairs of the demo's generate, speculative and plain
# (--no-speculate), for both bundled models, natively and with the AVX2 target forced; prints each run's
# decode tokens/s and the medians.   bash tools/bench/demo_pairs.sh [N=5] [NEXTN=build/bin/nextn]
set -euo pipefail
N=${1:-5}
NEXTN=${2:-build/bin/nextn}
cd "$(dirname "$0")/../.."
PROMPT=$(sed -n "/^PROMPT='/,/^'$/p" scripts/demo.sh | sed "1s/^PROMPT='//; \$d")
PROMPT="$PROMPT
"
rate() {  # target model flag... -> decode tokens/s as generate prints it
  local target=$1 model=$2
  shift 2
  env ${target:+NEXTN_CPU_TARGET=$target} "$NEXTN" generate --model "$model" --prompt "$PROMPT" -n 96 "$@" 2>&1 >/dev/null |
    grep -o '[0-9.]* tokens/s' | head -1 | cut -d' ' -f1
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
for target in "" avx2; do
  for model in models/nextn-hy4-tiny models/nextn-qwen4exp-tiny; do
    spec="" plain=""
    for ((i = 0; i < N; ++i)); do
      spec="$spec $(rate "$target" "$model")"
      plain="$plain $(rate "$target" "$model" --no-speculate)"
    done
    ms=$(echo "$spec" | median) mp=$(echo "$plain" | median)
    printf '%-28s %-7s speculative [%s ] median %s | plain [%s ] median %s | %.2fx\n' "$model" "${target:-native}" \
      "$spec" "$ms" "$plain" "$mp" "$(echo "$ms / $mp" | bc -l)"
  done
done
