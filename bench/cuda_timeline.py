#!/usr/bin/env python3
"""Where a replayed decode step's time goes, kernel by kernel, from an Nsight Systems trace.

A CUDA graph's kernels overlap under programmatic dependent launch, so a kernel's duration says
little about what it costs the step. What it costs is how far it moves the end of the chain:
its end minus the previous kernel's end ("adv" below). "lag" is its start minus the previous
kernel's end (negative: launched early, waiting or loading while the previous kernel ran).

Take the trace with the graphs' kernels as separate nodes, then list them as CSV:

    nsys profile -o step --trace cuda --cuda-graph-trace node \\
        tessera bench -m MODEL --device cuda -p 4 -n 24 -r 1 --no-bandwidth
    nsys stats --report cuda_gpu_trace --format csv --output step step.nsys-rep
    python3 bench/cuda_timeline.py step_cuda_gpu_trace.csv

Steps are cut at each argmax kernel (the last kernel of a greedy step); the steps of the most
common length after the first few (warm-up, prefill) are summarised, each kernel's medians over
those steps, then grouped by kernel and grid.
"""
import argparse
import collections
import csv
import statistics


def kernel_name(row):
    name = row["Name"].removeprefix("void ")
    for cut in ("(const", "(float", "(g1_args"):
        name = name.split(cut)[0]
    return "%s g%sx%sx%s" % (name[:64], row["GrdX"], row["GrdY"], row["GrdZ"])


def steps_of(rows):
    steps, cur = [], []
    for r in rows:
        if r["Name"].startswith("["):  # copies and memsets
            continue
        cur.append(r)
        if r["Name"].startswith("k_argmax"):
            steps.append(cur)
            cur = []
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="nsys stats --report cuda_gpu_trace --format csv output")
    ap.add_argument("--skip", type=int, default=4, help="steady steps to leave out first")
    ap.add_argument("--show", type=int, default=0,
                    help="also print the first N kernels of one step")
    args = ap.parse_args()
    steps = steps_of(list(csv.DictReader(open(args.csv))))
    if not steps:
        raise SystemExit("no step found (no k_argmax kernel in the trace)")
    length = collections.Counter(len(s) for s in steps).most_common(1)[0][0]
    steady = [s for s in steps if len(s) == length][args.skip:]
    if not steady:
        raise SystemExit("too few steps of %d kernels; take a longer run" % length)
    per_pos = collections.defaultdict(list)
    spans = []
    for s in steady:
        start = int(s[0]["Start (ns)"])
        prev_end = None
        for i, r in enumerate(s):
            t, d = int(r["Start (ns)"]), int(r["Duration (ns)"])
            lag = t - prev_end if prev_end is not None else 0
            adv = t + d - prev_end if prev_end is not None else d
            per_pos[(i, kernel_name(r))].append((d, lag, adv))
            prev_end = t + d
        spans.append(prev_end - start)
    groups = collections.defaultdict(list)
    for (_, name), v in per_pos.items():
        groups[name].append([statistics.median(x[k] for x in v) for k in range(3)])
    print("%d steps of %d kernels, median span %.1f us" %
          (len(steady), length, statistics.median(spans) / 1e3))
    print("%-72s %4s %8s %8s %8s %9s" % ("kernel, grid", "n", "dur us", "lag us", "adv us",
                                          "adv sum"))
    total = 0.0
    for name, v in sorted(groups.items(), key=lambda kv: -sum(x[2] for x in kv[1])):
        adv_sum = sum(x[2] for x in v)
        total += adv_sum
        print("%-72s %4d %8.2f %8.2f %8.2f %9.1f" % (
            name, len(v), statistics.mean(x[0] for x in v) / 1e3,
            statistics.mean(x[1] for x in v) / 1e3, statistics.mean(x[2] for x in v) / 1e3,
            adv_sum / 1e3))
    print("sum of advances %.1f us" % (total / 1e3))
    if args.show:
        s = steady[len(steady) // 2]
        t0 = int(s[0]["Start (ns)"])
        print("\none step, us from its first kernel's start: start, end, duration")
        for r in s[:args.show]:
            t, d = int(r["Start (ns)"]) - t0, int(r["Duration (ns)"])
            print("%8.2f %8.2f %7.2f  %s" % (t / 1e3, (t + d) / 1e3, d / 1e3, kernel_name(r)))


if __name__ == "__main__":
    main()
