"""bench/cuda_timeline.py on a trace made up here: steps cut at each argmax, kernels grouped by
name and grid, a kernel's advance its end minus the previous kernel's end (PDL overlap makes
durations misleading), medians over the steady steps after the skipped ones."""

import csv
import os
import subprocess
import sys

from conftest import REPO

SCRIPT = os.path.join(REPO, "bench", "cuda_timeline.py")
FIELDS = ["Start (ns)", "Duration (ns)", "GrdX", "GrdY", "GrdZ", "Name"]


def write_trace(path, steps):
    """steps: lists of (name, grid x, start ns from the step's start, duration ns)"""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerow({"Start (ns)": 0, "Duration (ns)": 500, "GrdX": "", "GrdY": "", "GrdZ": "",
                    "Name": "[CUDA memcpy Host-to-Device]"})  # not a kernel: left out
        t0 = 1000
        for kernels in steps:
            for name, gx, start, dur in kernels:
                w.writerow({"Start (ns)": t0 + start, "Duration (ns)": dur, "GrdX": gx,
                            "GrdY": 1, "GrdZ": 1, "Name": name})
            t0 += 100000


def run(path, *args):
    out = subprocess.run([sys.executable, SCRIPT, path, *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def row_of(out, name):
    for line in out.splitlines():
        if line.startswith(name):
            return line.split()
    raise AssertionError("no row for %s in:\n%s" % (name, out))


def test_advances_and_lags(tmp_path):
    # A gemv launched early (starts 2 us before the norm ends) and ending 5 us after it, then
    # the argmax after a 1 us gap. The third step's gemv ends 1 us later: the median keeps the
    # typical value. The first step, a different length (prefill), is not summarised.
    prefill = [("void k_prefill(const float *)", 8, 0, 3000), ("k_argmax(const float *)", 4,
                                                                 3000, 1000)]
    step = [("k_rmsnorm(const float *)", 1, 0, 4000),
            ("void k_gemv(g1_args)", 256, 2000, 7000),
            ("k_argmax(const float *)", 4, 10000, 2000)]
    slow = [step[0], ("void k_gemv(g1_args)", 256, 2000, 8000),
            ("k_argmax(const float *)", 4, 11000, 2000)]
    path = str(tmp_path / "trace.csv")
    write_trace(path, [prefill, step, step, slow, step])
    out = run(path, "--skip", "0")
    assert out.startswith("4 steps of 3 kernels, median span 12.0 us")
    gemv = row_of(out, "k_gemv")
    assert gemv[1] == "g256x1x1"
    n, dur, lag, adv = int(gemv[2]), float(gemv[3]), float(gemv[4]), float(gemv[5])
    assert (n, dur, lag, adv) == (1, 7.0, -2.0, 5.0)
    argmax = row_of(out, "k_argmax")
    assert (float(argmax[4]), float(argmax[5])) == (1.0, 3.0)
    assert "sum of advances 12.0 us" in out  # 4 + 5 + 3: the step's span
    assert "k_prefill" not in out and "memcpy" not in out


def test_skip_and_too_few_steps(tmp_path):
    step = [("k_rmsnorm(const float *)", 1, 0, 1000), ("k_argmax(const float *)", 4, 1000, 1000)]
    path = str(tmp_path / "trace.csv")
    write_trace(path, [step, step])
    out = subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True)
    assert out.returncode != 0 and "too few steps" in out.stderr
    assert run(path, "--skip", "1").startswith("1 steps of 2 kernels")
