#!/usr/bin/env bash
# Fuzzes the GGUF reader with libFuzzer + ASan + UBSan for a bounded time.
#   scripts/fuzz.sh [SECONDS] [JOBS]      (defaults: 60 seconds, 1 job)
# Builds build-fuzz/fuzz_gguf with clang, writes a seed corpus with our own writer
# (tests/fuzz/gguf_seeds.c), then runs the fuzzer; the corpus it grows is kept in
# build-fuzz/corpus between runs. Exits non-zero when the fuzzer finds a crash, a leak, undefined
# behaviour or a timeout; the input that did it is left in build-fuzz/artifacts/ (replay it with
# `build-fuzz/fuzz_gguf FILE`). Needs clang with libFuzzer (Debian 12: clang-14 and
# libclang-rt-14-dev). Override the compiler with CLANG=..., the directory with TS_FUZZ_DIR=...
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
JOBS=${2:-1}
OUT=${TS_FUZZ_DIR:-build-fuzz}
CC=${CLANG:-}
if [ -z "$CC" ]; then
  for c in clang clang-14 clang-15 clang-16; do
    if command -v "$c" > /dev/null; then CC=$c; break; fi
  done
fi
if [ -z "$CC" ]; then
  echo "fuzz.sh: clang not found (apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 2
fi

mkdir -p "$OUT/corpus" "$OUT/seeds" "$OUT/artifacts"
LIB="src/format/gguf_read.c src/format/gguf_meta.c src/base/status.c src/base/mmapfile.c
     src/base/tensor.c"
FLAGS="-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -Iinclude -Isrc -Wall -Wextra"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"

# shellcheck disable=SC2086
$CC $FLAGS $SAN -fsanitize=fuzzer $LIB tests/fuzz/fuzz_gguf.c -o "$OUT/fuzz_gguf"
# shellcheck disable=SC2086
$CC $FLAGS $SAN $LIB src/format/gguf_write.c src/format/tensor_stream.c tests/fuzz/gguf_seeds.c -o "$OUT/gguf_seeds"
rm -f "$OUT/seeds"/*
"$OUT/gguf_seeds" "$OUT/seeds"

ARGS=(-max_total_time="$SECS" -max_len=8192 -timeout=10 -rss_limit_mb=2048
      -dict=tests/fuzz/gguf.dict -artifact_prefix="$OUT/artifacts/" -print_final_stats=1)
if [ "$JOBS" -gt 1 ]; then ARGS+=(-fork="$JOBS"); fi
echo "fuzz.sh: $CC, ${SECS}s, $JOBS job(s), corpus $OUT/corpus"
"$OUT/fuzz_gguf" "${ARGS[@]}" "$OUT/corpus" "$OUT/seeds"
