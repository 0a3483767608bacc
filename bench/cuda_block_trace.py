#!/usr/bin/env python3
"""Where a replayed decode step's time goes, block by block, from a block trace.

A build with -DTESSERA_CUDA_BLOCK_TRACE=ON records, for every block of every kernel, the
device's global timer before and after its programmatic wait (cuda_pdl_entry), where the block
ends (kernels that mark it) and up to four points inside it (p4..p7), and writes them to
$TESSERA_CUDA_BLOCK_TRACE_FILE when the backend is destroyed:

    TESSERA_CUDA_BLOCK_TRACE_FILE=bt.bin tessera bench -m MODEL --device cuda -p 4 -n 24 -r 1 \\
        --no-bandwidth
    python3 bench/cuda_block_trace.py bt.bin [--names step_cuda_gpu_trace.csv]

A kernel's blocks all pass their wait after its predecessor has finished, so sorting the
records by that time and cutting by grid size gives the kernels in launch order. The steady
steps are the most common repeating sequence of grids; --names takes kernel names from an
Nsight Systems CSV of the same run (bench/cuda_timeline.py says how to make one). The recording
itself (an atomic a block) adds some 30-50 us to a 0.8B step: compare runs of one build.

Per kernel of a step, medians over the steady steps, in microseconds: adv (its first block's
release to the next kernel's), head (how long the median block was resident, its early loads
in flight, before the release), work (release to the median block's end), end>next (its last
block's end to the next kernel's release), and the inner points p4..p7 after the release.
"""
import argparse
import collections
import csv
import statistics
import struct


def load(path):
    data = open(path, "rb").read()
    recs = []
    for i in range(len(data) // 64):
        t0, t1, meta, t3, *pts = struct.unpack_from("<8Q", data, 64 * i)
        recs.append((t1, t0, t3, (meta >> 24) & 0xFFFFFF, pts))
    recs.sort(key=lambda r: r[0])
    return recs


def kernels_of(recs):
    """Cut the release-sorted records into kernels of their grid size (ties in the timer
    interleave two kernels' records: a record of another grid waits for the next cut)."""
    kern, pending, cur, grid = [], collections.deque(), [], None
    for r in recs:
        if grid is None:
            grid, cur = r[3], []
        if r[3] != grid:
            pending.append(r)
            continue
        cur.append(r)
        if len(cur) == grid:
            kern.append((grid, cur))
            grid = None
            while pending and grid is None:
                p = pending.popleft()
                grid, cur = p[3], [p]
                if len(cur) == grid:
                    kern.append((grid, cur))
                    grid = None
    return kern


def steady_steps(grids, min_len=8):
    """The step: the period p (>= min_len) whose repetition covers the most kernels at the end
    of the run; returns (start indices, p)."""
    best = (0, None)
    n = len(grids)
    for p in range(min_len, min(600, n // 3)):
        reps, j = 0, n - p
        while j - p >= 0 and grids[j - p:j] == grids[j:j + p]:
            reps, j = reps + 1, j - p
        if reps * p > best[0]:
            best = (reps * p, (j, p))
    if best[1] is None:
        raise SystemExit("no repeating step found: take a longer run")
    j, p = best[1]
    return list(range(j, n - p, p)), p


def names_from(path):
    rows = [r for r in csv.DictReader(open(path)) if not r["Name"].startswith("[")]
    names = []
    for r in rows:
        n = r["Name"].removeprefix("void ")
        for cut in ("(", "<"):
            n = n.split(cut)[0]
        names.append((n, int(r["GrdX"]) * int(r["GrdY"]) * int(r["GrdZ"])))
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="the file TESSERA_CUDA_BLOCK_TRACE_FILE named")
    ap.add_argument("--names", help="nsys stats cuda_gpu_trace CSV of the same binary")
    ap.add_argument("--skip", type=int, default=4, help="steady steps to leave out first")
    args = ap.parse_args()
    kern = kernels_of(load(args.trace))
    grids = [g for g, _ in kern]
    starts, L = steady_steps(grids)
    starts = starts[args.skip:]
    if not starts:
        raise SystemExit("too few steady steps")
    label = ["" for _ in range(L)]
    if args.names:
        named = names_from(args.names)
        want = grids[starts[0]:starts[0] + L]
        for i in range(len(named) - L, -1, -1):  # the last match: a steady step
            if [g for _, g in named[i:i + L]] == want:
                label = [n for n, _ in named[i:i + L]]
                break
    per = collections.defaultdict(list)
    spans = []
    for s in starts:
        ks = kern[s:s + L + 1]
        rel = [min(r[0] for r in k[1]) for k in ks]
        spans.append(rel[L] - rel[0])
        for j in range(L):
            b = ks[j][1]
            ends = [r[2] for r in b if r[2]]
            row = [rel[j + 1] - rel[j], statistics.median(rel[j] - r[1] for r in b),
                   statistics.median(r[2] - r[0] for r in b if r[2]) if ends else 0,
                   rel[j + 1] - max(ends) if ends else 0]
            for k in range(4):
                v = [r[4][k] - r[0] for r in b if r[4][k]]
                row.append(statistics.median(v) if v else 0)
            per[j].append(row)
    print("%d steady steps of %d kernels; median step (release to release) %.1f us" %
          (len(starts), L, statistics.median(spans) / 1e3))
    print("%3s %-28s %5s %7s %6s %6s %8s %5s %5s %5s %5s" %
          ("j", "kernel", "grid", "adv", "head", "work", "end>next", "p4", "p5", "p6", "p7"))
    for j in range(L):
        m = [statistics.median(x[k] for x in per[j]) / 1e3 for k in range(8)]
        print("%3d %-28s %5d %7.2f %6.2f %6.2f %8.2f %5.2f %5.2f %5.2f %5.2f" %
              ((j, label[j][:28], grids[starts[0] + j]) + tuple(m)))


if __name__ == "__main__":
    main()
