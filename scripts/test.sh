#!/usr/bin/env bash
# Builds tessera with warnings as errors and runs the whole test suite; then builds the unit
# tests with ASan + UBSan and runs them again. Usage: scripts/test.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
jobs=$(nproc)
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DTESSERA_WERROR=ON > /dev/null
cmake --build "$B" -j "$jobs"
(cd "$B" && ctest --output-on-failure -j "$jobs")
# the CUDA backend must build wherever nvcc is (its tests skip without a GPU)
if command -v nvcc > /dev/null && [ "${TS_SKIP_CUDA:-0}" != 1 ]; then
  cmake -S . -B "$B-cuda" -DCMAKE_BUILD_TYPE=Release -DTESSERA_WERROR=ON -DTESSERA_CUDA=ON > /dev/null
  cmake --build "$B-cuda" -j "$jobs"
  (cd "$B-cuda" && ctest --output-on-failure -R '^test_cuda$')
fi
# every parser of untrusted input (model files, request bodies, model output) under libFuzzer
# for a bounded time each, from the corpus the last runs grew where there is one
if [ "${TS_SKIP_FUZZ:-0}" != 1 ]; then
  bash scripts/fuzz.sh "${TS_FUZZ_SECONDS:-20}" 1 all
fi
if [ "${TS_SKIP_SANITIZE:-0}" != 1 ]; then
  cmake -S . -B "$B-asan" -DCMAKE_BUILD_TYPE=Debug -DTESSERA_WERROR=ON -DTESSERA_SANITIZE=ON > /dev/null
  cmake --build "$B-asan" -j "$jobs"
  # the unit tests, then the server integration suite against the sanitized server
  (cd "$B-asan" && TS_SKIP_SYNTH=1 ctest --output-on-failure -j "$jobs" -R '^test_')
  TS_SERVER_BIN="$PWD/$B-asan/tessera" TS_BIN="$PWD/$B/tessera" TS_BUILD="$PWD/$B" \
    TS_FIXTURES="$PWD/tests/fixtures" python3 -m pytest -q -p no:cacheprovider tests/py/test_server_*.py
fi
