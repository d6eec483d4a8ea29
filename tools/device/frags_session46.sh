# Session 46: the FP8 kernel's passes of several 8-row fragments (NEXTN_CUDA_FP8_FRAGS), on a GPU.
set -u
NEXTN_CUDA_FP8_FRAGS=4 timeout 170 bash tools/device/gpu_checks.sh tests
for f in 1 4; do echo "FRAGS=$f"; NEXTN_CUDA_FP8_FRAGS=$f devrun/run nextn_bench_cuda --gib 2 --dtype fp8 --out 18432 --in 7168 --rows 1,8,9,16,32,64,128 | grep -E "^\| F8|copy"; done
NEXTN_CUDA_FP8_FRAGS=2 devrun/run nextn_bench_cuda --gib 2 --dtype fp8 --out 18432 --in 7168 --rows 32,64 | grep -E "^\| F8"
for f in 1 4; do echo "synthetic FRAGS=$f"; NEXTN_CUDA_FP8_FRAGS=$f timeout 150 devrun/run nextn bench --device cuda --synthetic --dtype fp8 --mlp dense --hidden 7168 --layers 8 --tokens 32 --repeats 1 --cache-dir /tmp/nx8 --concurrency 1,8,64 2>&1 | grep -E "^decode|verify cost|^ +(1|8|64) " | cut -c1-170; done
for t in 48 88 416 84; do echo "bf16 wide tile $t"; NEXTN_CUDA_WIDE_TILE=$t devrun/run nextn_bench_cuda --gib 1 --dtype bf16 --out 32000 --in 7168 --rows 1,16,64 | grep -E "^\| BF16"; done
