#!/usr/bin/env bash
# `tessera run --image` / `--video`: a multimodal prompt of the Hugging Face fixtures (its ids,
# with the image's tokens) and the PNG it was made from continue greedily as HF's generate()
# did; with -p the prompt is one user turn of a chat (the images and videos, then the text) and
# their tokens are counted in; bad files and a model without a vision tower are clear errors.
set -u
BIN=$(readlink -f "${TS_BIN:-build/tessera}")
FX=$(readlink -f "${TS_FIXTURES:-tests/fixtures}")
M="$FX/qwen35_vision/tiny_v_f32"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { echo "ok: $1"; pass=$((pass + 1)); }
bad() { echo "FAIL: $1"; fail=$((fail + 1)); }

for i in 0 1; do
  ids=$(sed -n 1p "$M/ref/mm_greedy_$i.txt" | tr ' ' ',')
  want=$(sed -n 2p "$M/ref/mm_greedy_$i.txt")
  imgs=""
  for k in $(cat "$M/ref/mm_prompt_$i.images"); do imgs="$imgs --image $FX/qwen35_vision/images/image_$k.png"; done
  got=$("$BIN" run -m "$M" --ids "$ids" $imgs -n 20 --print-ids --ignore-eos --threads 2 2> "$tmp/err")
  [ "$got" = "$want" ] && ok "prompt $i greedy = HF" || { bad "prompt $i: got '$got' want '$want'"; cat "$tmp/err"; }
done

# a chat turn: a model directory with the small test tokenizer and the tiny-vl tower
"$BIN" synth --preset tiny-vl -o "$tmp/vl" > /dev/null && cp "$FX/tokenizer/small/tokenizer.json" "$tmp/vl/"
"$BIN" run -m "$tmp/vl" --image "$FX/image/png_rgb.png" -p "What is this?" -n 4 --threads 2 > "$tmp/out" 2> "$tmp/err"
rc=$?
n=$(grep -o 'prompt [0-9]* tokens' "$tmp/err" | grep -o '[0-9]*')
"$BIN" run -m "$tmp/vl" -p "x" -n 1 --threads 2 > /dev/null 2> "$tmp/err0"
[ "$rc" -eq 0 ] && [ -n "$n" ] && [ "$n" -gt 60 ] && ok "chat turn with an image: $n prompt tokens" || { bad "chat turn with an image (rc $rc)"; cat "$tmp/err"; }

# a video: 12 frames at 10 a second, 4 sampled, two steps of 35 tokens (test_server_video.py)
"$BIN" run -m "$tmp/vl" --video "$FX/video/h264_bframes.mp4" -p "x" -n 4 --threads 2 > "$tmp/out" 2> "$tmp/err"
rc=$?
if grep -q "this build reads no video" "$tmp/err"; then # configured with -DTESSERA_VIDEO=OFF
  echo "skipped: the video cases (this build reads no video)"
else
nv=$(grep -o 'prompt [0-9]* tokens' "$tmp/err" | grep -o '[0-9]*')
n0=$(grep -o 'prompt [0-9]* tokens' "$tmp/err0" | grep -o '[0-9]*')
# 70 video tokens, two vision_start / vision_end pairs and the steps' times over the text alone
[ "$rc" -eq 0 ] && [ -n "$nv" ] && [ -n "$n0" ] && grep -q "1 image(s) and video(s), 70 tokens" "$tmp/err" &&
  [ "$nv" -gt $((n0 + 74)) ] && ok "chat turn with a video: $nv prompt tokens" || { bad "chat turn with a video (rc $rc, $nv vs $n0)"; cat "$tmp/err"; }
"$BIN" run -m "$tmp/vl" --image "$FX/image/png_rgb.png" --video "$FX/video/vp9.webm" -p "x" -n 2 --threads 2 > /dev/null 2> "$tmp/err"
rc=$?
[ "$rc" -eq 0 ] && grep -q "2 image(s) and video(s)" "$tmp/err" && ok "an image and a video in one turn" || { bad "image + video (rc $rc)"; cat "$tmp/err"; }
printf 'not a video' > "$tmp/junk.mp4"
"$BIN" run -m "$tmp/vl" --video "$tmp/junk.mp4" -p "x" -n 1 > /dev/null 2> "$tmp/err"
rc=$?
[ "$rc" -eq 2 ] && grep -q "junk.mp4" "$tmp/err" && ok "an unreadable video is exit 2 naming it" || { bad "junk video (rc $rc)"; cat "$tmp/err"; }
fi

printf 'not an image' > "$tmp/junk.png"
"$BIN" run -m "$tmp/vl" --image "$tmp/junk.png" -p "x" -n 1 > /dev/null 2> "$tmp/err"
rc=$?
[ "$rc" -eq 2 ] && grep -q "junk.png" "$tmp/err" && ok "an unreadable image is exit 2 naming it" || { bad "junk image (rc $rc)"; cat "$tmp/err"; }

"$BIN" synth --preset tiny -o "$tmp/text" > /dev/null && cp "$FX/tokenizer/small/tokenizer.json" "$tmp/text/"
"$BIN" run -m "$tmp/text" --image "$FX/image/png_rgb.png" -p "x" -n 1 > /dev/null 2> "$tmp/err"
rc=$?
[ "$rc" -eq 1 ] && grep -q "takes no images" "$tmp/err" && ok "a text-only model refuses --image" || { bad "text model (rc $rc)"; cat "$tmp/err"; }
"$BIN" run -m "$tmp/text" --video "$FX/video/vp9.webm" -p "x" -n 1 > /dev/null 2> "$tmp/err"
rc=$?
[ "$rc" -eq 1 ] && grep -q "takes no videos" "$tmp/err" && ok "a text-only model refuses --video" || { bad "text model, video (rc $rc)"; cat "$tmp/err"; }

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
