#!/usr/bin/env bash
# Runs every libFuzzer target of a -DNEXTN_FUZZ=ON build for SECONDS each (one after the other), starting from
# seeds made of the committed fixtures (nextn_fuzz_seeds) plus whatever WORK_DIR/corpus already holds; inputs
# that reach new code are added to WORK_DIR/corpus/<target>/.
#   usage: fuzz/run.sh BUILD_DIR SECONDS [WORK_DIR]        (default WORK_DIR: BUILD_DIR/fuzz)
# Exits non-zero when a target finds a crash, a sanitizer report, a broken invariant, a leak, an input taking
# more than 10 s or more than 2 GB; the input is saved as WORK_DIR/artifacts/<target>-crash-... (or -leak-,
# -timeout-, -oom-) and the end of the target's log (WORK_DIR/logs/<target>.log) is printed.
# Reproduce with: BUILD_DIR/bin/fuzz_<target> THAT_FILE. FUZZ_TARGETS="a b" runs only those targets.
set -euo pipefail
build=$(cd "$1" && pwd)
seconds=$2
work=${3:-$build/fuzz}
read -ra targets <<<"${FUZZ_TARGETS:-safetensors hy_v4_config qwen4_exp_config tokenizer_encode tokenizer_json cli_args openai_request chat_template structured_output}"

mkdir -p "$work"
work=$(cd "$work" && pwd)
seeds=$work/seeds
corpus=$work/corpus
rm -rf "$seeds"
"$build/bin/nextn_fuzz_seeds" "$seeds" >/dev/null
mkdir -p "$work/artifacts" "$work/logs"

failed=()
for t in "${targets[@]}"; do
  mkdir -p "$corpus/$t"
  log=$work/logs/$t.log
  start=$SECONDS
  if "$build/bin/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$work/artifacts/$t-" "$corpus/$t" "$seeds/$t" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(sed -n 's/^#[0-9]*[[:space:]]*DONE[[:space:]]*cov: \([0-9]*\).*/\1/p' "$log")
    echo "fuzz $t: ok, $runs inputs in $((SECONDS - start)) s, coverage $cov, corpus $(ls "$corpus/$t" | wc -l) files" \
         "($(du -sk "$corpus/$t" | cut -f1) KB), seeds $(ls "$seeds/$t" | wc -l)"
  else
    failed+=("$t")
    echo "fuzz $t: FAILED after $((SECONDS - start)) s; the end of $log:"
    tail -n 60 "$log"
    ls "$work/artifacts/$t-"* 2>/dev/null | sed 's/^/  saved input: /'
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed targets: ${failed[*]}"
  exit 1
fi
