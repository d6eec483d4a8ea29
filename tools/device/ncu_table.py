#!/usr/bin/env python3
"""Where a GPU forward's time goes, kernel by kernel, from Nsight Compute's CSV (gpu_checks.sh's `kernels` step).

    python3 tools/device/ncu_table.py NCU.csv [--top N]

The CSV is `ncu --csv --metrics gpu__time_duration.sum ... nextn generate ...`: one row per kernel launch. Launches
are split into forwards at each `embed_rows_kernel` (a forward's first kernel); the first forward (the prompt's
rows) and the last (a one-row decode step) are printed as calls, us a call, us in all and share, largest first.
Nsight Compute runs each kernel alone at its own clocks with the caches flushed: short kernels read long, and the
sum exceeds a graph-replayed step; the shares say where to look. Standard library only.
"""
import argparse
import collections
import csv
import sys


def launches(path):
    rows = [r for r in csv.reader(open(path, newline="")) if len(r) > 5]
    if not rows:
        sys.exit(f"{path}: no kernel rows (was ncu run with --csv?)")
    head = rows[0]
    try:
        name, value = head.index("Kernel Name"), head.index("Metric Value")
    except ValueError:
        sys.exit(f"{path}: no 'Kernel Name' / 'Metric Value' columns")
    out = []
    for r in rows[1:]:
        try:
            ns = float(r[value].replace(",", ""))
        except ValueError:
            continue
        kernel = r[name].split("(")[0].replace("void ", "")
        for scope in ("nextn::cuda::", "unnamed>::", "(anonymous namespace)::"):
            kernel = kernel.replace(scope, "")  # (ncu writes the anonymous namespace as "unnamed>::")
        out.append((kernel, ns / 1000.0))
    return out


def forwards(kernels):
    starts = [i for i, (k, _) in enumerate(kernels) if k.startswith("embed_rows_kernel")]
    if not starts:
        return [kernels]
    return [kernels[s:e] for s, e in zip(starts, starts[1:] + [len(kernels)])]


def table(forward, top):
    by = collections.OrderedDict()
    for kernel, us in forward:
        c = by.setdefault(kernel, [0, 0.0])
        c[0] += 1
        c[1] += us
    total = sum(us for _, us in forward)
    lines = [f"  {len(forward)} launches, {total:.1f} us in all"]
    for kernel, (calls, us) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"    {kernel[:56]:56s} {calls:4d} {us / calls:8.1f} {us:9.1f} {100 * us / total:5.1f}%")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=16)
    a = ap.parse_args()
    fw = forwards(launches(a.csv))
    print(f"{a.csv}: {len(fw)} forwards, us each: " + ", ".join(f"{sum(us for _, us in f):.1f}" for f in fw))
    print("first forward (the prompt's rows): kernel, calls, us a call, us, share")
    print(table(fw[0], a.top))
    if len(fw) > 1:
        print("last forward (one row): kernel, calls, us a call, us, share")
        print(table(fw[-1], a.top))


if __name__ == "__main__":
    main()
