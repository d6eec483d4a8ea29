#!/usr/bin/env bash
# The GPU checks the CUDA backends still owe (P11), in one device call. Here, first:
#   bash tools/device/pack_cpu_binaries.sh && rm -f devrun/nextn_bench_* && strip devrun/nextn*
#   tar -cf - devrun | xz --x86 --lzma2=preset=9e -T2 > devrun.tar.xz
# (9e: ~9 MB where preset 3 gave 14; the device refuses a tree over 64 MiB and the tracked files are ~53 MB)
# then on the device machine (run's carry: ["devrun.tar.xz"]):
#   tar -xJf devrun.tar.xz && bash tools/device/gpu_checks.sh [STEP ...]
# (STEP: tests, sanitizer, bench, parity, tp, side, kernels, branches, shapes, sampled)
# (no argument: the first five, in that order). Output goes to stdout and, per step, to $OUT/gpu_checks/*.log.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
run=${NEXTN_RUN:-devrun/run}  # (NEXTN_RUN: another launcher, e.g. to try the script on a CPU build)
logs=${OUT:-/tmp}/gpu_checks
mkdir -p "$logs"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests sanitizer bench parity tp)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# The bundled models without tokenizer.json (the packed ICU is a stub: bench and id prompts never tokenize).
models=/tmp/gpu_check_models
mkdir -p "$models"
for m in nextn-hy4-tiny nextn-qwen4exp-tiny; do
  [ -d "$models/$m" ] || { cp -r "models/$m" "$models/$m" && rm -f "$models/$m/tokenizer.json"; }
done

for step in "${steps[@]}"; do
  echo "=== $step"
  case $step in
    tests)  # every GPU test, and the engine tests that run on the GPU when there is one
      $run nextn_tests --gtest_filter='*Cuda*:EngineBatching.*:CrossSequence.*:HYV4*:Generate*:KTuner*:EngineTuner.*' \
        > "$logs/tests.log" 2>&1
      grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran' "$logs/tests.log" | head -60
      ;;
    sanitizer)  # out-of-bounds and uninitialized device memory in Qwen4-Exp's backend (the newest)
      san=$(ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
      if [ -z "$san" ]; then echo "no compute-sanitizer"; continue; fi
      "$san" --tool memcheck --print-limit 5 $run nextn_tests \
        --gtest_filter='CudaQwen4Exp.*tiny*:CudaRecurrent.*:CudaSparseAttention.*:CudaMixers.*' > "$logs/sanitizer.log" 2>&1
      grep -E 'ERROR SUMMARY|PASSED|FAILED|Invalid' "$logs/sanitizer.log" | head -20
      ;;
    bench)  # both bundled models on the GPU, 1-64 sequences, plain and speculative
      for m in nextn-qwen4exp-tiny nextn-hy4-tiny; do
        $run nextn bench --device cuda --model "$models/$m" --tokens 96 --concurrency 1,8,32,64 \
          --repeats "${NEXTN_BENCH_REPEATS:-1}" \
          > "$logs/bench_$m.log" 2>&1
        grep -E '^machine|^decode|verify cost|k=[1-4]|tuned|^ +(1|8|32|64) ' "$logs/bench_$m.log" | cut -c1-160
      done
      ;;
    parity)  # the same ids on CPU and GPU: target and MTP-layer-0 logits side by side (nextn logits --draft)
      ids=1,17,42,99,123,7,300,511,64,2000,5,77,1024,256,33,8,250,3,901,12
      for m in nextn-qwen4exp-tiny nextn-hy4-tiny; do
        for dev in cpu cuda; do
          $run nextn logits --device "$dev" --model "$models/$m" --ids "$ids" --draft \
            --output "$logs/logits_${m}_$dev.safetensors" > "$logs/logits_${m}_$dev.log" 2>&1 ||
            tail -3 "$logs/logits_${m}_$dev.log"
        done
        python3 tools/device/compare_logits.py "$logs/logits_${m}_cpu.safetensors" "$logs/logits_${m}_cuda.safetensors" "$m" || true
      done
      ;;
    tp)  # tensor-parallel ranks on the GPU(s): in-process ranks sharing the GPU (host-staged) or one a GPU (NCCL)
      # (the CLI's rank processes are not started here: under devrun/run, /proc/self/exe is the packed loader)
      $run nextn_tests --gtest_filter='*CudaTensorParallel*:TensorParallel*' > "$logs/tp_tests.log" 2>&1
      grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]|SKIPPED \]' "$logs/tp_tests.log" | head -20
      ;;
    side)  # side by side with transformers' generate() on the same GPU: Qwen4-Exp's bundled model, batch 1 and 16
      # (transformers' figure includes its prefill; nextn's is bench's decode rate. HY V4's: sixteenth session)
      m=nextn-qwen4exp-tiny
      python3 tools/bench/hf_generate.py "models/$m" --tokens 64 --prompt-tokens 64 --batch 1,16 \
        > "$logs/hf_$m.log" 2>&1
      grep -E '^\{' "$logs/hf_$m.log" || tail -5 "$logs/hf_$m.log"
      $run nextn bench --device cuda --model "$models/$m" --tokens 64 --concurrency 1,16 --repeats 2 \
        > "$logs/side_$m.log" 2>&1
      grep -E '^machine|^decode|tuned|^ +(1|16) ' "$logs/side_$m.log" | cut -c1-160
      ;;
    kernels)  # where a step's time goes, kernel by kernel (Nsight Compute): a 4-row forward and 1-row decode
      # steps of the 8-layer 7168-wide FP8 synthetic (written by bench the first time; docs/performance.md,
      # thirty-fifth session)
      ncu=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
      if [ -z "$ncu" ]; then echo "no ncu"; continue; fi
      syn=/tmp/gpu_check_nx8
      $run nextn bench --device cuda --synthetic --dtype fp8 --mlp dense --hidden 7168 --layers 8 --tokens 32 \
        --repeats 1 --cache-dir "$syn" > "$logs/kernels_bench.log" 2>&1
      grep -E '^decode' "$logs/kernels_bench.log" | cut -c1-160
      dir=$(ls -d "$syn"/*/ | head -1)
      "$ncu" --csv --metrics gpu__time_duration.sum --target-processes all $run nextn generate --device cuda \
        --model "$dir" --ids 11,12,13,14 -n 3 --no-speculate --ignore-eos > "$logs/kernels.csv" 2> "$logs/kernels.err"
      python3 tools/device/ncu_table.py "$logs/kernels.csv"
      ;;
    branches)  # kernel branches on a second stream (the default) against none (NEXTN_CUDA_BRANCHES=0), interleaved:
      # the GPU tests with them off, then the 8-layer 7168-wide FP8 synthetic and both bundled models at 1-64 sequences
      NEXTN_CUDA_BRANCHES=0 $run nextn_tests \
        --gtest_filter='*Cuda*:EngineBatching.*:CrossSequence.*:HYV4*:Generate*:KTuner*:EngineTuner.*' \
        > "$logs/branch_tests.log" 2>&1
      grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]' "$logs/branch_tests.log" | head -20
      for pass in 1 2; do
        for on in 0 1; do
          echo "8-layer synthetic, NEXTN_CUDA_BRANCHES=$on"
          NEXTN_CUDA_BRANCHES=$on $run nextn bench --device cuda --synthetic --dtype fp8 --mlp dense --hidden 7168 \
            --layers 8 --tokens 64 --repeats 1 --cache-dir /tmp/gpu_check_nx8 \
            --oracle-acceptance 0.84,0.73,0.58,0.73 2>&1 | grep -E '^decode|verify cost|k=3' | cut -c1-160
        done
      done
      for m in nextn-hy4-tiny nextn-qwen4exp-tiny; do
        for on in 0 1; do
          echo "$m, NEXTN_CUDA_BRANCHES=$on"
          NEXTN_CUDA_BRANCHES=$on $run nextn bench --device cuda --model "$models/$m" --tokens 96 \
            --concurrency 1,8,32,64 --repeats 1 2>&1 | grep -E '^decode|^ +(1|8|32|64) ' | cut -c1-160
        done
      done
      ;;
    shapes)  # the FP8 kernel's launch shapes on the attention's medium and narrow matrices (experiment switches)
      b() { $run nextn_bench_cuda --gib 0.5 --dtype fp8 --rows 1,4 --out "$1" --in "$2" 2>&1 | grep -iE 'e4m3|fp8'; }
      for sh in "7168 3584" "6272 7168" "5376 2688"; do
        for v in default 1,8,128,2 1,8,128,4 1,16,128,2; do
          echo "$sh medium=$v"
          if [ $v = default ]; then b $sh; else NEXTN_CUDA_FP8_MEDIUM=$v b $sh; fi
        done
      done
      for v in default 1,16,64,4 1,8,64,4 1,32,128,2; do
        echo "928 7168 narrow=$v"
        if [ $v = default ]; then b 928 7168; else NEXTN_CUDA_FP8_NARROW=$v b 928 7168; fi
      done
      ;;
    sampled)  # sampled requests at 1-64 sequences (T 0.8, top-p 0.9): the host's decisions on one thread
      # (--threads 1) against the pool's (the default), interleaved; the bundled models, then the 8-layer 7168-wide
      # FP8 synthetic (a 32000-token vocabulary, and a random model's flat rows: the nucleus most of them)
      for pass in 1 2; do
        for t in 1 0; do
          for m in nextn-hy4-tiny nextn-qwen4exp-tiny; do
            echo "$m, sampled, --threads $t"
            $run nextn bench --device cuda --model "$models/$m" --tokens 64 --concurrency 1,8,32,64 --repeats 1 \
              --concurrency-temperature 0.8 --concurrency-top-p 0.9 --threads $t 2>&1 |
              grep -E '^ +(1|8|32|64) ' | cut -c1-160
          done
        done
      done
      for t in 1 0; do
        echo "8-layer synthetic, sampled, --threads $t"
        $run nextn bench --device cuda --synthetic --dtype fp8 --mlp dense --hidden 7168 --layers 8 --tokens 32 \
          --repeats 1 --cache-dir /tmp/gpu_check_nx8 --concurrency 1,8,64 --concurrency-temperature 0.8 \
          --concurrency-top-p 0.9 --threads $t 2>&1 | grep -E '^decode|^ +(1|8|64) ' | cut -c1-160
      done
      ;;
    *) echo "unknown step $step (tests, sanitizer, bench, parity, tp, side, kernels, branches, shapes, sampled)" ;;
  esac
done
