#!/usr/bin/env bash
# `tessera chat --think`: the thinking is shown between <think> and </think>; --think-budget N
# ends it after N tokens (</think> put in for the model, as the server's thinking_token_budget
# does), 0 at once, -1 never. The tiny random model thinks without end, so the answer without
# a budget is the reference: with one, the thinking shown is the reference's first part.
set -u
BIN=$(readlink -f "${TS_BIN:-build/tessera}")
FX=$(readlink -f "${TS_FIXTURES:-tests/fixtures}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { echo "ok: $1"; pass=$((pass + 1)); }
bad() { echo "FAIL: $1"; fail=$((fail + 1)); }

"$BIN" synth --preset tiny -o "$tmp/m" > /dev/null && cp "$FX/tokenizer/small/tokenizer.json" "$tmp/m/"

# the first answer of a one-turn chat: the text between "> " and "\n[N tokens"
answer() {
  printf 'Tell me a story.\n/exit\n' |
    "$BIN" chat -m "$tmp/m" -n 24 --temp 0 --threads 2 "$@" 2> /dev/null |
    python3 -c '
import re, sys
m = re.search(r"> (.*?)\n\[(\d+) tokens", sys.stdin.read(), re.S)
print(m.group(1) if m else "NO ANSWER", end="")'
}

free=$(answer --think)
case "$free" in
  "<think>"*) ok "the thinking starts with <think>" ;;
  *) bad "thinking: '$free'" ;;
esac
[[ "$free" != *"</think>"* ]] && ok "without a budget the tiny model thinks to the end" ||
  bad "the reference closed its thinking: '$free'"
[ "$(answer --think --think-budget -1)" = "$free" ] && ok "--think-budget -1 bounds nothing" ||
  bad "--think-budget -1"
[ "$(answer --think --think-budget 100)" = "$free" ] && ok "a budget past the answer changes nothing" ||
  bad "--think-budget 100"
zero=$(answer --think --think-budget 0)
case "$zero" in
  "<think></think>"?*) ok "--think-budget 0: </think> first, then the answer" ;;
  *) bad "--think-budget 0: '$zero'" ;;
esac
five=$(answer --think --think-budget 5)
thought=${five%%</think>*}
if [[ "$five" == *"</think>"?* && "$free" == "$thought"* && "$thought" != "$free" ]]; then
  ok "--think-budget 5: the reference's first thinking, </think>, then the answer"
else
  bad "--think-budget 5: '$five' against '$free'"
fi
off=$(answer)
[[ "$off" != *"<think>"* ]] && ok "thinking off: no <think> shown" || bad "thinking off: '$off'"
"$BIN" chat -m "$tmp/m" --think-budget x < /dev/null > /dev/null 2> "$tmp/err"
[ $? -ne 0 ] && grep -q "think-budget" "$tmp/err" && ok "a bad --think-budget is refused" ||
  bad "bad --think-budget: $(cat "$tmp/err")"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
