#!/usr/bin/env bash
# tokenize / detokenize / run -p through the model directory's tokenizer.json: round trip,
# special tokens only with --special, streaming text output, and clear errors.
set -u
BIN=${TS_BIN:-build/tessera}
FX=${TS_FIXTURES:-tests/fixtures}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=$((fail + 1)); else echo "ok: $1"; fi; }
"$BIN" synth --preset tiny -o "$tmp/m" > /dev/null
cp "$FX/tokenizer/small/tokenizer.json" "$tmp/m/"

text='The tower is 324 metres (1,063 ft) tall — héhé 日本'
ids=$("$BIN" tokenize -m "$tmp/m" "$text")
check "tokenize prints ids" "[ -n '$ids' ]"
back=$("$BIN" detokenize -m "$tmp/m" $ids)
check "detokenize(tokenize(x)) == x" '[ "$back" = "$text" ]'
plain=$("$BIN" tokenize -m "$tmp/m" "<|im_start|>")
special=$("$BIN" tokenize -m "$tmp/m" --special "<|im_start|>")
check "special tokens are text unless --special" "[ \$(echo $plain | wc -w) -gt 1 ] && [ '$special' = '1001' ]"
check "skip-special drops control tokens" "[ \"\$($BIN detokenize -m $tmp/m --skip-special 1001 $ids)\" = \"$text\" ]"
out=$("$BIN" run -m "$tmp/m" -p "Hello" -n 8 --seed 1 --temp 0.8 --ignore-eos 2> "$tmp/err")
check "run -p exits 0" "[ $? -eq 0 ]"
check "run -p reports speed" "grep -q 'generated in' '$tmp/err'"
"$BIN" detokenize -m "$tmp/m" 99999 > /dev/null 2> "$tmp/err"
check "unknown id is an error" "[ $? -eq 2 ] && grep -q 'tessera: detokenize' '$tmp/err'"
"$BIN" tokenize -m "$FX/qwen35/tiny_a_f32_tied_explicit" "x" > /dev/null 2> "$tmp/err"
check "model without tokenizer.json: exit 2 naming the file" "[ $? -eq 2 ] && grep -q 'tokenizer.json' '$tmp/err'"
echo "$fail failed"
[ "$fail" -eq 0 ]
