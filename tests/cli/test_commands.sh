#!/usr/bin/env bash
# The command forms other tooling relies on: logits, run --print-ids, bench --json, synth, and
# exit status 2 with one clear line for a broken model.
set -u
BIN=${TS_BIN:-build/tessera}
FX=${TS_FIXTURES:-tests/fixtures}/qwen35
M=$FX/tiny_a_f32_tied_explicit
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=$((fail + 1)); else echo "ok: $1"; fi; }

ids=$(tr ' ' ',' < "$M/ref/prompt_1.ids" | tr -d '\n')
n=$(wc -w < "$M/ref/prompt_1.ids")
"$BIN" logits -m "$M" --ids "$ids" -o "$tmp/l.bin" > "$tmp/out" 2>&1
check "logits exit 0" "[ $? -eq 0 ]"
check "logits file is n x vocab floats" "[ $(stat -c %s "$tmp/l.bin") -eq $((n * 512 * 4)) ]"
check "logits prints a summary" "grep -q 'tokens $n' '$tmp/out'"

# LoRA adapters: --lora / --lora-scaled give PEFT's logits (tools/gen_lora_fixtures.py)
L=${TS_FIXTURES:-tests/fixtures}/lora/qwen35_text
"$BIN" logits -m "$M" --ids "$ids" --lora "$L/all" --lora-scaled "$L/some" -1.5 \
  --lora-scaled "$L/all" 0 -o "$tmp/lora.bin" > /dev/null 2>&1
check "logits --lora exit 0 with three adapters" "[ $? -eq 0 ]"
"$BIN" logits -m "$M" --ids "$ids" --lora-scaled "$L/all" 0.5 --lora-scaled "$L/some" -1.5 \
  -o "$tmp/mix.bin" > /dev/null 2>&1
check "logits --lora-scaled matches PEFT's mix" \
  "python3 -c 'import numpy as n; a=n.fromfile(\"$tmp/mix.bin\",\"<f4\"); b=n.fromfile(\"$L/mix_1.logits\",\"<f4\"); assert n.linalg.norm(a-b)/n.linalg.norm(b) < 1e-4'"
"$BIN" logits -m "$M" --ids 1,2 --lora "$tmp/none" > "$tmp/out" 2>&1
check "a missing adapter: exit 2 and the reason" "[ $? -eq 2 ] && grep -q 'no such file' '$tmp/out'"
"$BIN" logits -m "$M" --ids 1,2 --lora-scaled "$L/all" x > "$tmp/out" 2>&1
check "a bad scale is a usage error" "[ $? -eq 1 ]"

# the MTP block's guesses (tools/gen_qwen35_mtp_fixtures.py: a block trained on the model's own
# continuations): bench --draft-mtp checks them in its greedy decode, most of them right
T=${TS_FIXTURES:-tests/fixtures}/qwen35_mtp/tiny_mtp
"$BIN" bench -m "$T" -p 8 -n 64 -r 1 --no-bandwidth --draft-mtp 2 --json > "$tmp/out" 2>&1
check "bench --draft-mtp: most guesses taken" \
  "python3 -c 'import json; d=json.load(open(\"$tmp/out\"))[\"draft_mtp\"]; assert d[\"accepted\"] > 0.6 * d[\"drafted\"] > 0, d'"
"$BIN" bench -m "$M" -p 8 -n 8 -r 1 --no-bandwidth --draft-mtp 1 > "$tmp/out" 2>&1
check "bench --draft-mtp without the block: exit 2 and the reason" \
  "[ $? -eq 2 ] && grep -q 'no multi-token-prediction block' '$tmp/out'"
"$BIN" serve -m "$T" --draft-mtp 9 --draft-max 8 > "$tmp/out" 2>&1
check "serve --draft-mtp above --draft-max is a usage error" "[ $? -eq 1 ]"

# greedy continuation equals the transformers reference
prompt=$(sed -n 1p "$M/ref/greedy_0.txt" | tr ' ' ',')
want=$(sed -n 2p "$M/ref/greedy_0.txt")
nw=$(echo "$want" | wc -w)
got=$("$BIN" run -m "$M" --ids "$prompt" -n "$nw" --print-ids --threads 2 2>/dev/null)
check "run --print-ids matches the reference" "[ '$got' = '$want' ]"

# sampling is reproducible with a seed and changes with it
a=$("$BIN" run -m "$M" --ids 1,2,3 -n 12 --temp 1.0 --top-k 40 --seed 7 --print-ids 2>/dev/null)
b=$("$BIN" run -m "$M" --ids 1,2,3 -n 12 --temp 1.0 --top-k 40 --seed 7 --print-ids 2>/dev/null)
c=$("$BIN" run -m "$M" --ids 1,2,3 -n 12 --temp 1.0 --top-k 40 --seed 8 --print-ids 2>/dev/null)
check "same seed, same tokens" "[ -n '$a' ] && [ '$a' = '$b' ]"
check "other seed, other tokens" "[ '$a' != '$c' ]"

"$BIN" bench -m "$M" -p 16 -n 4 -r 2 --json --no-bandwidth > "$tmp/bench.json" 2>&1
check "bench --json exit 0" "[ $? -eq 0 ]"
check "bench --json is JSON with pp and tg" \
  "python3 -c 'import json,sys; d=json.load(open(\"$tmp/bench.json\")); assert d[\"pp\"][\"tokens_per_s\"] > 0 and d[\"tg\"][\"tokens_per_s\"] > 0'"
# the state a decoded token reads and writes, from the fixture's config: each linear layer's
# conv state ((K - 1) x conv channels) and delta-rule state (Hv x dk x dv) read and written, each
# full layer's K and V rows read up to the token (positions 0..3: 1.5 on average) plus its own
check "bench --json counts the sequence's state a token" \
  "python3 -c '
import json
d = json.load(open(\"$tmp/bench.json\"))
c = json.load(open(\"$M/config.json\")); c = c.get(\"text_config\", c)
lin = sum(t == \"linear_attention\" for t in c[\"layer_types\"])
full = len(c[\"layer_types\"]) - lin
hk, hv = c[\"linear_num_key_heads\"], c[\"linear_num_value_heads\"]
dk, dv = c[\"linear_key_head_dim\"], c[\"linear_value_head_dim\"]
conv = (c[\"linear_conv_kernel_dim\"] - 1) * (2 * hk * dk + hv * dv)
rec = lin * 4 * (conv + hv * dk * dv)
kv = full * 4 * 2 * c[\"num_key_value_heads\"] * c[\"head_dim\"]
want = 2 * rec + (1.5 + 2) * kv
assert abs(d[\"state_bytes_per_token\"] - want) < 1, (d[\"state_bytes_per_token\"], want)
'"
"$BIN" bench -m "$M" -p 8 -n 4 -r 1 --depth 40 --json --no-bandwidth > "$tmp/bench_d.json" 2>&1
check "bench --depth runs after that much context" \
  "python3 -c 'import json,sys; d=json.load(open(\"$tmp/bench_d.json\")); assert d[\"depth\"] == 40 and d[\"tg\"][\"tokens_per_s\"] > 0'"
# sampled decode: the draws a request names, one sampler a sequence, in the report
"$BIN" bench -m "$M" -p 4 -n 6 -r 1 --parallel 1,3 --temp 1 --top-k 40 --seed 9 --json --no-bandwidth > "$tmp/bench_s.json" 2>&1
check "bench --temp draws and says so" \
  "python3 -c 'import json,sys; d=json.load(open(\"$tmp/bench_s.json\")); s=d[\"sampling\"]; assert s[\"temperature\"] == 1 and s[\"top_k\"] == 40 and s[\"seed\"] == 9 and d[\"tg\"][\"tokens_per_s\"] > 0 and d[\"batched\"][1][\"tokens_per_s\"] > 0'"
check "bench without sampling options is greedy" \
  "python3 -c 'import json,sys; assert json.load(open(\"$tmp/bench.json\"))[\"sampling\"] is None'"
"$BIN" bench -m "$M" -p 4 -n 4 -r 1 --temp -1 > /dev/null 2>&1
check "bench --temp -1 is a usage error" "[ $? -eq 1 ]"

# errors: exit 2 and a single line naming the problem
"$BIN" logits -m "$tmp/nonexistent" --ids 1 > /dev/null 2> "$tmp/err"
check "missing model exits 2" "[ $? -eq 2 ]"
check "one error line" '[ "$(wc -l < "$tmp/err")" -eq 1 ]'
mkdir "$tmp/bad" && cp "$M/config.json" "$tmp/bad/" && head -c 5000 "$M/model.safetensors" > "$tmp/bad/model.safetensors"
"$BIN" run -m "$tmp/bad" --ids 1 -n 1 > /dev/null 2> "$tmp/err"
check "truncated checkpoint exits 2" "[ $? -eq 2 ]"
check "error names the file" "grep -q 'model.safetensors' '$tmp/err'"
"$BIN" logits -m "$M" --ids 1,99999 > /dev/null 2> "$tmp/err"
check "token id beyond the vocabulary exits 2" "[ $? -eq 2 ] && grep -q 'out of range' '$tmp/err'"
"$BIN" logits -m "$M" --ids 1,x > /dev/null 2>&1
check "malformed --ids is a usage error" "[ $? -eq 1 ]"

# synth writes a loadable checkpoint with the real 0.8B shapes
if [ "${TS_SKIP_SYNTH:-0}" != 1 ]; then
  "$BIN" synth --arch qwen35 --preset 0.8b -o "$tmp/synth" --dtype bf16 > /dev/null
  check "synth exit 0" "[ $? -eq 0 ]"
  "$BIN" logits -m "$tmp/synth" --ids 1,2,3 > "$tmp/out" 2>&1
  check "synthetic 0.8B loads and runs" "[ $? -eq 0 ] && grep -q 'vocab 248320' '$tmp/out'"
  rm -rf "$tmp/synth"
fi

echo "$fail failed"
[ "$fail" -eq 0 ]
