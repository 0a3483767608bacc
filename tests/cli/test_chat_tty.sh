#!/usr/bin/env bash
# `tessera chat` driven through a real terminal (tmux): it prompts, streams an answer, shows
# tokens/s, keeps the conversation between turns (the second identical question prefills only
# its own turn plus the newline that closes the previous answer), and quits on /exit.
set -u
BIN=$(readlink -f "${TS_BIN:-build/tessera}")
FX=$(readlink -f "${TS_FIXTURES:-tests/fixtures}")
command -v tmux > /dev/null || { echo "tmux is not installed"; exit 1; }
tmp=$(mktemp -d)
sock="$tmp/tmux.sock"
trap 'tmux -S "$sock" kill-server 2> /dev/null; rm -rf "$tmp"' EXIT
"$BIN" synth --preset tiny -o "$tmp/m" > /dev/null || exit 1
cp "$FX/tokenizer/small/tokenizer.json" "$tmp/m/"

tmux -S "$sock" new-session -d -x 200 -y 50 "$BIN chat -m $tmp/m -n 6 --seed 1 --threads 2; echo CHAT-EXITED \$?; sleep 30"
wait_for() { # pattern, count
  for _ in $(seq 1 100); do
    [ "$(tmux -S "$sock" capture-pane -p -S -200 | grep -c -- "$1")" -ge "$2" ] && return 0
    sleep 0.1
  done
  echo "timed out waiting for '$1' x$2"; tmux -S "$sock" capture-pane -p -S -200; return 1
}
fail=0
wait_for '^>' 1 || fail=1
tmux -S "$sock" send-keys "What is the capital of France?" Enter
wait_for 'tokens/s' 1 || fail=1
tmux -S "$sock" send-keys "What is the capital of France?" Enter
wait_for 'tokens/s' 2 || fail=1
tmux -S "$sock" send-keys "/exit" Enter
wait_for 'CHAT-EXITED 0' 1 || fail=1
screen=$(tmux -S "$sock" capture-pane -p -S -200)
echo "$screen"
p1=$(echo "$screen" | grep -o 'prompt [0-9]* tokens' | sed -n 1p | grep -o '[0-9]*')
p2=$(echo "$screen" | grep -o 'prompt [0-9]* tokens' | sed -n 2p | grep -o '[0-9]*')
echo "first turn prefilled $p1 tokens, second $p2"
[ -n "$p1" ] && [ -n "$p2" ] && [ "$p2" -eq $((p1 + 1)) ] || { echo "FAIL: the second turn did not reuse the conversation state"; fail=1; }
[ "$fail" -eq 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit "$fail"
