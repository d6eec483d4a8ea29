#!/usr/bin/env bash
# P10's measure of `nextn serve` with and without speculation, apart from the clients' own CPU time: a fresh
# server pinned to CPU 0 with one compute thread, the node clients (serve_bench.mjs) pinned to CPU 1, N pairs of
# runs per level (off / on interleaved); with --control the "on" runs are plain too (an A/A measurement: the
# spread of its pairs is the machine's noise). Needs 2 CPUs, `taskset`, node and a built nextn.
#   bash tools/bench/serve_pairs.sh [--control] [PAIRS=6] [LEVELS=32,8,64,1] [NEXTN=build/bin/nextn]
set -euo pipefail
control=""
if [ "${1:-}" = "--control" ]; then control="--control"; shift; fi
PAIRS=${1:-6}
LEVELS=${2:-32,8,64,1}
NEXTN=${3:-build/bin/nextn}
PORT=${PORT:-8123}
cd "$(dirname "$0")/../.."
taskset -c 0 "$NEXTN" serve --model models/nextn-hy4-tiny --port "$PORT" --threads 1 >/tmp/nextn_serve_pairs.log 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.2; done
taskset -c 1 node tools/bench/serve_bench.mjs --url "http://127.0.0.1:$PORT" --concurrency "$LEVELS" \
  --requests-per-client 4 --repeat "$PAIRS" $control
echo "tuner rounds per batch class and k (the server's /metrics):"
curl -s "http://127.0.0.1:$PORT/metrics" | grep '^nextn:spec_decode_tuner_rounds_total' || true
