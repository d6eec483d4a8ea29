#!/usr/bin/env bash
# Runs every libFuzzer target of a -DNEXTN_FUZZ=ON build for SECONDS each (one after the other), starting from
# seeds made of the committed fixtures (nextn_fuzz_seeds) plus whatever CORPUS_DIR already holds; new inputs
# that reach new code are added to CORPUS_DIR/<target>/.
#   usage: fuzz/run.sh BUILD_DIR SECONDS [CORPUS_DIR]        (default CORPUS_DIR: BUILD_DIR/fuzz-corpus)
# Exits non-zero when a target finds a crash, a sanitizer report, a broken invariant, a leak, an input taking
# more than 10 s or more than 2 GB; the input is saved as BUILD_DIR/fuzz-artifacts/<target>-crash-... and the
# log's end is printed. Reproduce with: BUILD_DIR/bin/fuzz_<target> THAT_FILE
set -euo pipefail
build=$(cd "$1" && pwd)
seconds=$2
corpus=${3:-$build/fuzz-corpus}
targets=(safetensors hy_v4_config tokenizer_encode tokenizer_json cli_args)

seeds=$build/fuzz-seeds
rm -rf "$seeds"
"$build/bin/nextn_fuzz_seeds" "$seeds" >/dev/null
mkdir -p "$build/fuzz-artifacts" "$build/fuzz-logs"

failed=()
for t in "${targets[@]}"; do
  mkdir -p "$corpus/$t"
  log=$build/fuzz-logs/$t.log
  start=$SECONDS
  if "$build/bin/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$build/fuzz-artifacts/$t-" "$corpus/$t" "$seeds/$t" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    echo "fuzz $t: ok, $runs inputs in $((SECONDS - start)) s, corpus $(ls "$corpus/$t" | wc -l) files" \
         "($(du -sk "$corpus/$t" | cut -f1) KB), seeds $(ls "$seeds/$t" | wc -l)"
  else
    failed+=("$t")
    echo "fuzz $t: FAILED after $((SECONDS - start)) s; the end of $log:"
    tail -n 60 "$log"
    ls "$build/fuzz-artifacts/$t-"* 2>/dev/null | sed 's/^/  saved input: /'
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed targets: ${failed[*]}"
  exit 1
fi
