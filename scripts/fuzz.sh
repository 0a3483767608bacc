#!/usr/bin/env bash
# Fuzzes the parsers of untrusted input with libFuzzer + ASan + UBSan for a bounded time.
#   scripts/fuzz.sh [SECONDS] [JOBS] [TARGET]      (defaults: 60 seconds, 1 job, gguf)
# TARGET: gguf, safetensors, hfconfig, bpe_load, bpe_encode, openai, toolcall, textout, grammar,
#   image, video, or all
# (each in turn, SECONDS apiece); tests/fuzz/README.md says what each one covers.
# Builds build-fuzz/fuzz_TARGET with clang, writes its seed corpus (gguf: with our own writer,
# tests/fuzz/gguf_seeds.c; the others: tests/fuzz/make_seeds.py, from the repository's fixtures),
# then runs the fuzzer; the corpus it grows is kept in build-fuzz/corpus/TARGET between runs.
# Exits non-zero when the fuzzer finds a crash, a leak, undefined behaviour or a timeout; the
# input that did it is left in build-fuzz/artifacts/TARGET/ (replay it with
# `build-fuzz/fuzz_TARGET FILE`). Needs clang with libFuzzer (Debian 12: clang-14 and
# libclang-rt-14-dev). Override the compiler with CLANG=..., the directory with TS_FUZZ_DIR=...
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
JOBS=${2:-1}
TARGET=${3:-gguf}
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
ALL="gguf safetensors hfconfig bpe_load bpe_encode openai toolcall textout grammar image video"

BASE="src/base/status.c src/base/mmapfile.c src/base/tensor.c src/base/utf8.c"
GGUF="src/format/gguf_read.c src/format/gguf_meta.c"
BPE="src/text/bpe.c src/text/bpe_load.c src/text/utf8.c"
# The public tokenizer (ts_tokenizer_open, ts_chat_tokenize) and everything it reads.
TOKENIZER="$BPE src/text/spm.c src/text/tokenizer.c src/text/chat.c src/text/chat_gemma.c src/text/chat_continue.c
           src/text/chat_json.c $GGUF"
# Grammars: the automaton, JSON Schema, tool calls.
GRAMMAR="src/text/grammar.c src/text/grammar_vocab.c src/text/json_grammar.c
         src/text/json_schema.c src/text/tool_grammar.c src/text/tool_grammar_py.c src/text/gbnf.c src/text/regex_grammar.c
         src/text/utf8_ranges.c"
PKGS="jansson libpcre2-8 libutf8proc libpng libjpeg libwebp libwebpdemux zlib libavformat libavcodec
      libswscale libavutil"
# shellcheck disable=SC2086
LIBS="$(pkg-config --libs $PKGS) -lpthread -lm"
FLAGS="-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -Iinclude -Isrc -Wall -Wextra
       -DTS_SOURCE_DIR=\"$PWD\" $(pkg-config --cflags $PKGS)"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"

# What each target links, its dictionary and its input cap (small inputs keep the rate high;
# the structure of every format here is in its first few KiB).
# src/image without video_stub.c (it stands in for the decoder in a build without FFmpeg)
IMAGE=$(ls src/image/*.c | grep -v '/video_stub\.c$' | tr '\n' ' ')
sources() {
  case $1 in
    gguf) echo "$GGUF" ;;
    safetensors) echo "src/format/safetensors.c src/format/tensor_stream.c" ;;
    hfconfig) echo "src/format/hfconfig.c" ;;
    bpe_load | bpe_encode) echo "$BPE" ;;
    openai) echo "src/serve/openai.c src/serve/json_load.c src/serve/prep.c src/serve/base64.c src/serve/images.c src/serve/budget.c src/serve/responses_request.c src/serve/responses_store.c src/serve/messages_request.c src/serve/messages.c src/serve/rename.c src/serve/truncate.c src/serve/embeddings.c src/serve/infill.c src/serve/respond.c src/serve/job.c src/serve/lora.c $IMAGE $TOKENIZER $GRAMMAR" ;;
    toolcall) echo "src/serve/toolcall.c src/serve/toolcall_py.c src/text/utf8.c" ;;
    textout) echo "src/serve/textout.c src/serve/stop.c src/serve/toolcall.c src/serve/toolcall_py.c $BPE" ;;
    grammar) echo "$TOKENIZER $GRAMMAR" ;;
    image | video) echo "$IMAGE" ;;
    *) echo "fuzz.sh: unknown target '$1' (one of: $ALL, all)" >&2; exit 2 ;;
  esac
}
dict() {
  case $1 in
    bpe_load | bpe_encode) echo tests/fuzz/bpe.dict ;;
    textout) echo "" ;;
    *) echo "tests/fuzz/$1.dict" ;;
  esac
}
max_len() {
  case $1 in
    bpe_load) echo 65536 ;;
    safetensors) echo 16384 ;;
    *) echo 8192 ;;
  esac
}

build() {
  local t=$1
  mkdir -p "$OUT/corpus/$t" "$OUT/seeds/$t" "$OUT/artifacts/$t"
  # shellcheck disable=SC2046,SC2086
  $CC $FLAGS $SAN -fsanitize=fuzzer $BASE $(sources "$t") "tests/fuzz/fuzz_$t.c" $LIBS \
    -o "$OUT/fuzz_$t"
  rm -f "$OUT/seeds/$t"/*
  if [ "$t" = gguf ]; then
    # shellcheck disable=SC2086
    $CC $FLAGS $SAN $BASE $GGUF src/format/gguf_write.c src/format/tensor_stream.c \
      tests/fuzz/gguf_seeds.c -o "$OUT/gguf_seeds"
    "$OUT/gguf_seeds" "$OUT/seeds/$t"
  else
    python3 tests/fuzz/make_seeds.py "$t" "$OUT/seeds/$t"
  fi
}

run() {
  local t=$1 d
  d=$(dict "$t")
  local args=(-max_total_time="$SECS" -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048
              -artifact_prefix="$OUT/artifacts/$t/" -print_final_stats=1)
  if [ -n "$d" ]; then args+=(-dict="$d"); fi
  if [ "$JOBS" -gt 1 ]; then args+=(-fork="$JOBS"); fi
  echo "fuzz.sh: $t: $CC, ${SECS}s, $JOBS job(s), corpus $OUT/corpus/$t"
  "$OUT/fuzz_$t" "${args[@]}" "$OUT/corpus/$t" "$OUT/seeds/$t"
}

if [ "$TARGET" = all ]; then TARGETS=$ALL; else TARGETS=$TARGET; sources "$TARGET" > /dev/null; fi
status=0
for t in $TARGETS; do build "$t"; done
for t in $TARGETS; do run "$t" || status=$?; done
exit $status
