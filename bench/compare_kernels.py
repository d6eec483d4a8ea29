#!/usr/bin/env python3
"""Markdown tables from nextn_bench_kernels JSON output (--benchmark_out=FILE --benchmark_out_format=json).

    bench/compare_kernels.py after.json                 # one run
    bench/compare_kernels.py before.json after.json     # before -> after, with speed-ups
    bench/compare_kernels.py b1.json,b2.json a1.json,a2.json

With --benchmark_repetitions the median aggregate is used. Several comma-separated files (rounds of the
same benchmarks) keep each benchmark's best round: on a shared machine interference only slows a run down.
pct_read is the GB/s of the run over the plain read bandwidth that same run measured (same thread count).
"""
import json
import re
import sys


def load(path):
    with open(path) as f:
        data = json.load(f)
    runs = {}
    for b in data["benchmarks"]:
        name = b["name"]
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") != "median":
                continue
            name = b["run_name"]
        name = name.replace("/real_time", "")
        runs[name] = b
    return runs, data.get("context", {})


def load_best(paths):
    best, ctx = {}, {}
    for path in paths.split(","):
        runs, ctx = load(path)
        for name, b in runs.items():
            if name not in best or gbs(b) > gbs(best[name]):
                best[name] = b
    return best, ctx


def gbs(b):
    return b.get("GB/s", 0.0) / 1e9 if b.get("GB/s", 0.0) > 1e6 else b.get("GB/s", 0.0)


def main():
    paths = sys.argv[1:]
    if not paths or len(paths) > 2:
        sys.exit(__doc__)
    sets = [load_best(p) for p in paths]
    after, ctx = sets[-1]
    before = sets[0][0] if len(sets) == 2 else None
    print(f"matmul target: {ctx.get('matmul_target', '?')}, {ctx.get('num_cpus', '?')} CPUs, "
          f"load average {ctx.get('load_avg', '?')}\n")
    print("| benchmark | " + ("before GB/s | " if before else "") + "GB/s | % of read BW | " +
          ("speed-up |" if before else ""))
    print("|---|" + ("---:|" if before else "") + "---:|---:|" + ("---:|" if before else ""))
    for name, b in after.items():
        if not name.startswith("BM_Matmul") and not name.startswith("BM_Read"):
            continue
        g = gbs(b)
        pct = b.get("pct_read")
        row = f"| {re.sub(r'^BM_', '', name)} | "
        if before:
            ob = before.get(name)
            row += (f"{gbs(ob):.2f} | " if ob else "- | ")
        row += f"{g:.2f} | " + (f"{pct:.0f}% | " if pct is not None else "- | ")
        if before:
            ob = before.get(name)
            row += (f"{g / gbs(ob):.2f}x |" if ob and gbs(ob) > 0 else "- |")
        print(row)


if __name__ == "__main__":
    main()
