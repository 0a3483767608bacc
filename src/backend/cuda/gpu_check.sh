#!/bin/bash
# Builds tessera with the CUDA backend on a GPU machine, runs the CUDA tests (plus the CPU unit
# tests), benchmarks synthetic Qwen3.5 models and runs compute-sanitizer. Usage, from the repo
# root:
#   bash src/backend/cuda/gpu_check.sh [DEBS_DIR]
# DEBS_DIR holds the .deb files of the build dependencies (jansson, pcre2, utf8proc, curl,
# microhttpd, pkgconf) for machines that lack them and have no network; they are unpacked
# under /tmp/sys, never into /. Logs go to $GPU_CHECK_OUT (default /tmp/gpu_check).
# Knobs: GPU_CHECK_PRESETS (default "0.8b"), GPU_CHECK_TYPES (default "bf16 q4_k_m q8_0"),
# GPU_CHECK_SANITIZERS (default "memcheck"; also racecheck), GPU_CHECK_PARALLEL (default
# "1,8,32,64"), GPU_CHECK_TESTS (default 1; 0 skips the tests), GPU_CHECK_REPS (default 3),
# GPU_CHECK_SAN_TIMEOUT (seconds per sanitizer, default 240), GPU_CHECK_STRESS (default 0: N runs
# of test_cuda's graph-decode and upload checks while another process loads the GPU: a
# compute-sanitizer run of other sections, as when a timing-dependent upload race was found;
# src/backend/cuda/README.md).
set -u
OUT=${GPU_CHECK_OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
B=/tmp/tsb
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if ! pkg-config --exists jansson libpcre2-8 libutf8proc libmicrohttpd libcurl 2>/dev/null; then
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
cmake -S . -B $B -DTESSERA_CUDA=ON -DTESSERA_WERROR=OFF -DCMAKE_BUILD_TYPE=Release ${PKG:-} \
    >$OUT/cmake.log 2>&1 && cmake --build $B -j16 >>$OUT/cmake.log 2>&1 ||
    { tail -40 $OUT/cmake.log; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
if [ "${GPU_CHECK_TESTS:-1}" = 1 ]; then
    TS_FIXTURES=$PWD/tests/fixtures $B/tests/test_cuda > $OUT/test_cuda.log 2>&1
    echo "test_cuda rc=$?"; grep -E "FAIL|failed|graph decode|ok$|skipped" $OUT/test_cuda.log | head -30
    (cd $B && timeout 200 ctest -R '^test_' -E test_cuda -j16 2>&1 | tail -3)
fi
P=${GPU_CHECK_PARALLEL:-1,8,32,64}
for preset in ${GPU_CHECK_PRESETS:-0.8b}; do
    M=/tmp/m$preset
    $B/tessera synth --preset $preset -o $M >/dev/null || { echo "synth $preset failed"; continue; }
    for t in ${GPU_CHECK_TYPES:-bf16 q4_k_m q8_0}; do
        F=$M
        if [ $t != bf16 ]; then
            F=/tmp/m$preset-$t.gguf
            $B/tessera quantize $M $F --type $t >/dev/null 2>&1 || { echo "quantize $t failed"; continue; }
        fi
        echo "== bench $preset $t"
        timeout 300 $B/tessera bench -m $F --device cuda -p 512 -n 128 -r ${GPU_CHECK_REPS:-3} \
            --parallel $P 2>&1 |
            tee -a $OUT/bench.log | grep -E "\| (pp|tg)|bandwidth|first token|rror"
        [ $preset = 0.8b ] || continue
        [ $t = bf16 ] && for mm in 0 1; do # a long prompt: prompt attention fp32 / tensor cores
            echo "-- pp8192, TESSERA_CUDA_ATTN_MMA=$mm"
            TESSERA_CUDA_ATTN_MMA=$mm timeout 120 $B/tessera bench -m $F --device cuda -p 8192 \
                -n 1 -r ${GPU_CHECK_REPS:-3} --no-bandwidth 2>&1 | grep -E "\| pp|first token|rror"
        done
        echo "-- graphs off: tg"
        TESSERA_CUDA_GRAPHS=0 timeout 120 $B/tessera bench -m $F --device cuda -p 0 -n 128 -r 1 \
            --no-bandwidth 2>&1 | grep -E "\| tg|rror"
    done
done
echo "== --device cuda without a visible device: CUDA_VISIBLE_DEVICES= "
CUDA_VISIBLE_DEVICES= $B/tessera bench -m /tmp/m0.8b --device cuda -p 8 -n 2 --no-bandwidth
echo "rc=$?"
for tool in ${GPU_CHECK_SANITIZERS:-memcheck}; do
    command -v compute-sanitizer >/dev/null || break
    echo "== $tool"
    TS_CUDA_QUICK=1 TS_FIXTURES=$PWD/tests/fixtures timeout ${GPU_CHECK_SAN_TIMEOUT:-240} \
        compute-sanitizer --tool $tool $B/tests/test_cuda >$OUT/$tool.log 2>&1
    echo "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|failed|FAIL" $OUT/$tool.log | tail -5
done
if [ "${GPU_CHECK_STRESS:-0}" -gt 0 ] && command -v compute-sanitizer >/dev/null; then
    echo "== graph decode under load, ${GPU_CHECK_STRESS} runs"
    (while true; do TS_CUDA_QUICK=1 TS_CUDA_ONLY=matmul,gdn,runs TS_FIXTURES=$PWD/tests/fixtures \
        compute-sanitizer --tool memcheck $B/tests/test_cuda >/dev/null 2>&1; done) &
    LOAD=$!
    fails=0
    for i in $(seq 1 "$GPU_CHECK_STRESS"); do
        TS_CUDA_ONLY=graph,upload TS_FIXTURES=$PWD/tests/fixtures timeout 120 $B/tests/test_cuda \
            >$OUT/stress_$i.log 2>&1 || { fails=$((fails + 1)); grep -m2 differs $OUT/stress_$i.log; }
    done
    kill $LOAD; pkill -f "compute-sanitizer --tool memcheck $B/tests/test_cuda"
    echo "graph decode under load: $fails of $GPU_CHECK_STRESS runs differ"
fi
