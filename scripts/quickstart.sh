#!/usr/bin/env bash
# Sets up, builds, and runs tessera: greedy generation on a small Qwen3.5 checkpoint from the
# test fixtures, then prefill/decode speed on a synthetic checkpoint with the real 0.8B shapes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j "$(nproc)"
M=tests/fixtures/qwen35/tiny_b_bf16_untied_interval3
echo "== tessera run on $M"
./build/tessera run -m "$M" --ids "$(sed -n 1p "$M/ref/greedy_0.txt" | tr ' ' ',')" -n 20
SYN=${TESSERA_SYNTH_DIR:-build/qwen35-0.8b-bf16}
[ -f "$SYN/model.safetensors" ] || ./build/tessera synth --arch qwen35 --preset 0.8b -o "$SYN"
echo "== tessera bench on the synthetic Qwen3.5-0.8B (BF16)"
./build/tessera bench -m "$SYN" -p 512 -n 128 --threads "$(nproc)"
