#!/usr/bin/env bash
# `tessera chat` with images (/image FILE, --image FILE): a turn with an image answers as
# `tessera run --image -p` does; an image in a later turn answers as the whole conversation
# run from the start does (its tokens' rotary positions continue the conversation's, and the
# decode steps after it carry the image's shift); a bad file or a model without a vision tower
# is a message and the chat goes on.
set -u
BIN=$(readlink -f "${TS_BIN:-build/tessera}")
FX=$(readlink -f "${TS_FIXTURES:-tests/fixtures}")
IMG="$FX/image/png_rgb.png"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { echo "ok: $1"; pass=$((pass + 1)); }
bad() { echo "FAIL: $1"; fail=$((fail + 1)); }

"$BIN" synth --preset tiny-vl -o "$tmp/vl" > /dev/null && cp "$FX/tokenizer/small/tokenizer.json" "$tmp/vl/"
"$BIN" synth --preset tiny -o "$tmp/text" > /dev/null && cp "$FX/tokenizer/small/tokenizer.json" "$tmp/text/"

# the answers of a chat transcript (stdout), one a line: the text between "> " and "\n[N tokens"
answers() {
  python3 -c '
import re, sys
out = sys.stdin.read()
for m in re.finditer(r"> ((?:(?!> ).)*?)\n\[(\d+) tokens", out, re.S):
    print(m.group(2), m.group(1).replace("\n", "\\n"))'
}

# 1. the first turn: the image, then the text, as `run --image -p` lays out its prompt
printf '/image %s\nWhat is this?\n/exit\n' "$IMG" |
  "$BIN" chat -m "$tmp/vl" -n 6 --temp 0 --threads 2 > "$tmp/c1" 2> "$tmp/e1"
got=$(answers < "$tmp/c1" | sed -n 1p | cut -d' ' -f2-)
want=$("$BIN" run -m "$tmp/vl" --image "$IMG" -p "What is this?" -n 6 --temp 0 --threads 2 2> /dev/null)
[ -n "$got" ] && [ "$got" = "$want" ] && ok "a first turn with an image answers as run --image: '$got'" ||
  { bad "first turn: chat '$got', run '$want'"; cat "$tmp/c1" "$tmp/e1"; }

# the same through --image on the command line
printf 'What is this?\n/exit\n' |
  "$BIN" chat -m "$tmp/vl" --image "$IMG" -n 6 --temp 0 --threads 2 > "$tmp/c1b" 2> /dev/null
got=$(answers < "$tmp/c1b" | sed -n 1p | cut -d' ' -f2-)
[ "$got" = "$want" ] && ok "--image attaches to the first message" || { bad "--image: '$got'"; cat "$tmp/c1b"; }

# 2. later turns, against the whole conversation run from position 0 by `run --ids`: an image
# in the second turn (its rotary positions continue the conversation's), and a text turn after
# an image (its positions shifted by the image's)
tk() { "$BIN" tokenize -m "$tmp/vl" --special "$1"; }
user() { # a user turn as the template writes it: $1 images of $2 tokens, then the text $3
  local pads=""
  for _ in $(seq 1 "$1"); do pads="$pads<|vision_start|>$(printf '<|image_pad|>%.0s' $(seq 1 "$2"))<|vision_end|>"; done
  tk $'<|im_start|>user\n'"$pads$3"$'<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n'
}
# the text of ids that the tokenizer knows (the tiny model's vocabulary is larger; the chat's
# stream shows nothing for the others)
text_of() {
  local known
  known=$(for id in $1; do "$BIN" detokenize -m "$tmp/vl" "$id" > /dev/null 2>&1 && echo "$id"; done)
  "$BIN" detokenize -m "$tmp/vl" --skip-special $known
}
ntok=$(grep -o '[0-9]* tokens; it goes' "$tmp/c1" | grep -o '^[0-9]*') # the image's
im_end=$(tk '<|im_end|>')
nl=$("$BIN" tokenize -m "$tmp/vl" $'\n')
# second_turn NAME INPUT T1 T2 N: the chat's second answer to INPUT (/image lines take $IMG)
# against `run --ids` over T1 (the first turn's ids), its answer, and T2, with N images in all;
# the first answer comes from `run --ids` over T1 (with the image when T1 has one)
second_turn() {
  local name=$1 t1=$3 t2=$4 imgs="" img1="" a1 ref want got p2 n2
  printf "$2" "$IMG" | "$BIN" chat -m "$tmp/vl" -n 40 --temp 0 --threads 2 > "$tmp/c2" 2> "$tmp/e2"
  answers < "$tmp/c2" > "$tmp/a2"
  for _ in $(seq 1 "$5"); do imgs="$imgs --image $IMG"; done
  case " $t1 " in *" $(tk '<|image_pad|>') "*) img1="--image $IMG" ;; esac
  a1=$("$BIN" run -m "$tmp/vl" --ids "$(echo $t1 | tr ' ' ',')" $img1 -n 40 --temp 0 --print-ids \
    --threads 2 2> /dev/null)
  ref=$("$BIN" run -m "$tmp/vl" --ids "$(echo $t1 $a1 $im_end $nl $t2 | tr ' ' ',')" $imgs -n 40 \
    --temp 0 --print-ids --threads 2 2> "$tmp/er")
  want=$(text_of "$ref")
  got=$(sed -n 2p "$tmp/a2" | cut -d' ' -f2-)
  p2=$(grep -o 'prompt [0-9]* tokens' "$tmp/c2" | sed -n 2p | grep -o '[0-9]*')
  n2=$(echo $nl $t2 | wc -w)
  if [ "$(sed -n 1p "$tmp/a2" | cut -d' ' -f1)" != 40 ] || [ "$(echo $a1 | wc -w)" != 40 ]; then
    bad "$name: the first answer was not 40 tokens (the test needs it whole): $(cat "$tmp/a2") / $a1"
  elif [ "$p2" != "$n2" ]; then
    bad "$name: the second turn prefilled $p2 tokens, the reference's layout has $n2"; cat "$tmp/c2"
  elif [ -n "$got" ] && [ "$got" = "$want" ]; then
    ok "$name answers as the conversation from the start: '$got'"
  else
    bad "$name: chat '$got', the conversation from the start '$want' ($ref)"
    cat "$tmp/c2" "$tmp/e2" "$tmp/er"
  fi
}
second_turn "an image in the second turn" 'Hi\n/image %s\nWhat is this?\n/exit\n' \
  "$(user 0 0 Hi)" "$(user 1 "$ntok" 'What is this?')" 1
second_turn "a text turn after an image" '/image %s\nWhat is this?\nAnd now?\n/exit\n' \
  "$(user 1 "$ntok" 'What is this?')" "$(user 0 0 'And now?')" 1

# 4. bad input: a missing file and a non-image are messages, the chat goes on
printf 'not an image' > "$tmp/junk.png"
printf '/image %s\n/image %s\n/image\nHi\n/exit\n' "$tmp/missing.png" "$tmp/junk.png" |
  "$BIN" chat -m "$tmp/vl" -n 2 --temp 0 --threads 2 > "$tmp/c4" 2> "$tmp/e4"
rc=$?
[ "$rc" -eq 0 ] && grep -q "missing.png" "$tmp/e4" && grep -q "junk.png" "$tmp/e4" &&
  grep -q "usage: /image FILE" "$tmp/c4" && [ "$(answers < "$tmp/c4" | wc -l)" = 1 ] &&
  ok "a missing file and a non-image are reported, the chat goes on" || { bad "bad images (rc $rc)"; cat "$tmp/c4" "$tmp/e4"; }

"$BIN" chat -m "$tmp/vl" --image "$tmp/junk.png" < /dev/null > "$tmp/c5" 2> "$tmp/e5"
rc=$?
[ "$rc" -ne 0 ] && grep -q "junk.png" "$tmp/e5" && ok "--image with a bad file exits non-zero ($rc)" ||
  { bad "--image junk (rc $rc)"; cat "$tmp/c5" "$tmp/e5"; }

printf '/image %s\nHi\n/exit\n' "$IMG" |
  "$BIN" chat -m "$tmp/text" -n 2 --temp 0 --threads 2 > "$tmp/c6" 2> /dev/null
grep -q "takes no images" "$tmp/c6" && [ "$(answers < "$tmp/c6" | wc -l)" = 1 ] &&
  ok "a text-only model says it takes no images and goes on" || { bad "text-only model"; cat "$tmp/c6"; }

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
