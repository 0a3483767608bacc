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
# chat takes run's sampling options: top-k 1 is greedy whatever the seed; without it the seed
# shows (the answer's text, the speed lines left out)
chat() { printf 'What is the capital of France?\n' | "$BIN" chat -m "$tmp/m" -n 16 --threads 2 "$@" 2> /dev/null | grep -v 'tokens/s'; }
g1=$(chat --temp 1.5 --top-k 1 --seed 1); g2=$(chat --temp 1.5 --top-k 1 --seed 2)
check "chat --top-k 1 is greedy whatever the seed" "[ -n \"\$g1\" ] && [ \"\$g1\" = \"\$g2\" ]"
s1=$(chat --temp 1.5 --top-k 0 --top-p 1 --min-p 0 --seed 1)
s2=$(chat --temp 1.5 --top-k 0 --top-p 1 --min-p 0 --seed 2)
s3=$(chat --temp 1.5 --top-k 0 --top-p 1 --min-p 0 --seed 3)
check "chat samples by the seed with top-k off" "[ \"\$s1\" != \"\$s2\" ] || [ \"\$s1\" != \"\$s3\" ]"
for cmd in run chat; do
  "$BIN" $cmd -m "$tmp/m" --top-p 2 < /dev/null > /dev/null 2> "$tmp/err"
  check "$cmd --top-p 2 is a usage error" "[ $? -eq 1 ] && grep -q \"bad --top-p '2'\" '$tmp/err'"
done
"$BIN" detokenize -m "$tmp/m" 99999 > /dev/null 2> "$tmp/err"
check "unknown id is an error" "[ $? -eq 2 ] && grep -q 'tessera: detokenize' '$tmp/err'"
"$BIN" tokenize -m "$FX/qwen35/tiny_a_f32_tied_explicit" "x" > /dev/null 2> "$tmp/err"
check "model without tokenizer.json: exit 2 naming the file" "[ $? -eq 2 ] && grep -q 'tokenizer.json' '$tmp/err'"
echo "$fail failed"
[ "$fail" -eq 0 ]
