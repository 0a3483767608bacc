"""bench/cuda_block_trace.py on a block trace made up here: records (written unordered) cut
into kernels by release time and grid size, the repeating step found after a prefill of other
grids, and each kernel's advance, head start, work, end-to-next and inner points as medians over
the steady steps; names taken from an Nsight Systems CSV."""

import csv
import os
import struct
import subprocess
import sys

from conftest import REPO

SCRIPT = os.path.join(REPO, "bench", "cuda_block_trace.py")
GRIDS = [4, 2, 3, 1, 4, 2, 3, 5]  # a step of 8 kernels (the script wants at least 8)
RELEASE = [0, 4000, 9000, 12000, 15000, 20000, 26000, 30000]  # ns from the step's start
STEP_NS = 40000


def record(t0, t1, grid, block, end=0, p4=0):
    return struct.pack("<8Q", t0, t1, (7 << 48) | (grid << 24) | block, end, p4, 0, 0, 0)


def write_trace(path, steps, slow_step=None):
    recs = []
    t = 1000
    for b in range(6):  # a prefill kernel of another grid, before the steady steps
        recs.append(record(t - 500, t, 6, b, t + 800))
    t += 5000
    for s in range(steps):
        for j, (g, r) in enumerate(zip(GRIDS, RELEASE)):
            rel = t + r
            for b in range(g):
                # block b resident (1 + b) us before the release, released b * 10 ns late,
                # its end 2 us (3 us in the slow step's kernel 1) after its release, its
                # inner point 4 at 500 ns; kernel 3 marks no end
                t1 = rel + 10 * b
                work = 3000 if (s == slow_step and j == 1) else 2000
                end = 0 if j == 3 else t1 + work
                recs.append(record(rel - 1000 * (1 + b), t1, g, b, end, t1 + 500))
        t += STEP_NS
    # unordered in the file, as the translation units' buffers are written
    with open(path, "wb") as f:
        for r in reversed(recs):
            f.write(r)


def run(path, *args):
    out = subprocess.run([sys.executable, SCRIPT, path, *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def rows(out):
    table = {}
    for line in out.splitlines()[2:]:
        f = line.split()
        table[int(f[0])] = f
    return table


def test_kernels_and_medians(tmp_path):
    path = str(tmp_path / "bt.bin")
    write_trace(path, steps=7, slow_step=3)
    out = run(path, "--skip", "0")
    # 7 steps, the last has no next release to close its last kernel: 6 summarised
    assert out.startswith("6 steady steps of 8 kernels; median step (release to release) 40.0 us")
    t = rows(out)
    assert [int(t[j][1]) for j in range(8)] == GRIDS
    # kernel 0: advance 4 us; head start of the median block (blocks 1 and 2 of 0..3: 2.5 us
    # before the first release); work 2 us; its last block's end (3 * 10 ns + 2 us) to the
    # next release (4 us): 1.97 us; inner point 0.5 us
    assert t[0][2:] == ["4.00", "2.50", "2.00", "1.97", "0.50", "0.00", "0.00", "0.00"]
    # kernel 1's work is 3 us in one step only: the median keeps 2
    assert t[1][2:5] == ["5.00", "1.50", "2.00"]
    # no end marked: work and end-to-next 0
    assert t[3][4:6] == ["0.00", "0.00"]
    # the step's last kernel advances to the next step's first release
    assert t[7][2] == "10.00"


def test_skip_and_names(tmp_path):
    path = str(tmp_path / "bt.bin")
    write_trace(path, steps=7)
    assert run(path).startswith("2 steady steps of 8 kernels")  # --skip 4 by default
    names = str(tmp_path / "names.csv")
    with open(names, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["Name", "GrdX", "GrdY", "GrdZ"])
        w.writeheader()
        w.writerow({"Name": "[CUDA memcpy Host-to-Device]", "GrdX": "", "GrdY": "", "GrdZ": ""})
        for j, g in enumerate(GRIDS):
            w.writerow({"Name": "void k_%d<4>(const float *)" % j, "GrdX": g, "GrdY": 1,
                        "GrdZ": 1})
    t = rows(run(path, "--skip", "0", "--names", names))
    assert [t[j][1] for j in range(8)] == ["k_%d" % j for j in range(8)]


def test_too_few_steps(tmp_path):
    path = str(tmp_path / "bt.bin")
    write_trace(path, steps=2)
    out = subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True)
    assert out.returncode != 0 and "step" in out.stderr
