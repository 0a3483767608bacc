#!/bin/bash
# Builds tessera with the CUDA backend on a GPU machine, runs the CUDA tests (plus the CPU unit
# tests and compute-sanitizer) and benchmarks a synthetic 0.8B model. Usage, from the repo root:
#   bash src/backend/cuda/gpu_check.sh [DEBS_DIR]
# DEBS_DIR holds the .deb files of the build dependencies (jansson, pcre2, utf8proc,
# microhttpd, pkgconf) for machines that lack them and have no network; they are unpacked
# under /tmp/sys, never into /. Logs go to $GPU_CHECK_OUT (default /tmp/gpu_check).
set -u
OUT=${GPU_CHECK_OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
B=/tmp/tsb
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if ! pkg-config --exists jansson libpcre2-8 libutf8proc libmicrohttpd 2>/dev/null; then
    S=/tmp/sys
    for f in "${1:-.dev/cuda-deps}"/*.deb; do dpkg -x "$f" $S; done
    L=$S/usr/lib/x86_64-linux-gnu
    sed -i '/^Requires.private/d' $L/pkgconfig/*.pc
    export LD_LIBRARY_PATH=$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PKG_CONFIG_LIBDIR=$L/pkgconfig:$S/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$S
    export CPATH=$S/usr/include LIBRARY_PATH=$L
    PKG="-DPKG_CONFIG_EXECUTABLE=$S/usr/bin/pkgconf"
fi
# -Werror stays off here: the GPU image's newer gcc warns in files outside the backend
t0=$(date +%s)
cmake -S . -B $B -DTESSERA_CUDA=ON -DTESSERA_WERROR=OFF ${PKG:-} >$OUT/cmake.log 2>&1 &&
    cmake --build $B -j16 >>$OUT/cmake.log 2>&1 || { tail -40 $OUT/cmake.log; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
TS_FIXTURES=$PWD/tests/fixtures $B/tests/test_cuda 2>&1 | tee $OUT/test_cuda.log | tail -40
echo "test_cuda rc=${PIPESTATUS[0]}"
(cd $B && timeout 200 ctest -R '^test_' -E test_cuda -j16 2>&1 | tail -6)
M=/tmp/m08
$B/tessera synth --preset 0.8b -o $M >/dev/null && echo "synth ok"
for d in cuda; do
    echo "== bench $d"
    timeout 240 $B/tessera bench -m $M --device $d -p 512 -n 128 --no-bandwidth 2>&1 | tee -a $OUT/bench.log
done
$B/tessera quantize $M /tmp/m08q8.gguf --type q8_0 >/dev/null 2>&1 && echo "== bench cuda q8_0" &&
    timeout 240 $B/tessera bench -m /tmp/m08q8.gguf --device cuda -p 512 -n 128 --no-bandwidth 2>&1 |
    tee -a $OUT/bench.log
echo "== --device cuda on a missing device id path: CUDA_VISIBLE_DEVICES= "
CUDA_VISIBLE_DEVICES= $B/tessera bench -m $M --device cuda -p 8 -n 2; echo "rc=$?"
if command -v compute-sanitizer >/dev/null; then
    echo "== memcheck"
    TS_FIXTURES=$PWD/tests/fixtures timeout 150 compute-sanitizer --tool memcheck \
        $B/tests/test_cuda >$OUT/memcheck.log 2>&1
    echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|failed|FAIL" $OUT/memcheck.log | tail -5
fi
