#!/usr/bin/env python3
"""Speculative decoding in `tessera serve`: decode speed of one chat answer with and without
guesses, on text the answer copies (where guesses pay) and on text it does not (what wrong
guesses cost).

    python3 bench/serve_speculate.py --model MODEL [--bin build/tessera] [--reps 3]
        [--data ../shared/data/wikitext-2/wiki.test.raw] [--device cpu|cuda] [--json]
        [--max-tokens 256] [--temperature 0]

Three servers: `plain` (--draft-max 0), `pred` (the default: guesses from a request's
prediction only) and `lookup` (--draft-lookup). Four tasks, each a greedy chat answer of up
to 256 tokens: `edit` - a paragraph to repeat with one word changed, the paragraph sent as
the prediction (OpenAI's Predicted Outputs: an editor sending the file it asks to have edited);
`quote` - the same paragraph to repeat, no prediction (only prompt lookup guesses); `story` - a
story about a robot (nothing to copy: lookup's guesses are wrong); `own` - that story with the
plain server's own answer as the prediction (right as far as its text tokenizes back the same:
with a random model this is the one task where guesses are right); `wrong` - the story with an
unrelated paragraph as the prediction (guesses made and refused: their cost). Decode speed is the answer's
tokens after the first over the time after the first (streamed); the paragraphs are the first
of WikiText-2's test set long enough. The answers of every server are compared with `plain`'s:
at temperature 0 they are the same tokens (up to float rounding where the batched check of
the guesses and a single step differ: quantized models' activations are quantized per token,
so a tiny difference can move a near tie)."""
import argparse
import http.client
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py"))
import server_util  # noqa: E402


def paragraphs(path, n, min_chars=700, max_chars=1100):
    out = []
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if min_chars <= len(line) <= max_chars and not line.startswith("="):
            out.append(line)
            if len(out) == n:
                break
    return out


def stream(port, body):
    """(seconds to the first token, seconds after it, the text, the final usage)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = dict(body, stream=True, stream_options={"include_usage": True})
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", json.dumps(body),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    first, text, usage = None, [], None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: {"):
            continue
        ch = json.loads(line[6:])
        if ch.get("usage"):
            usage = ch["usage"]
        for choice in ch.get("choices", []):
            piece = choice.get("delta", {}).get("content")
            if piece:
                if first is None:
                    first = time.perf_counter()
                text.append(piece)
    end = time.perf_counter()
    c.close()
    return first - t0, end - first, "".join(text), usage


def tasks(par, own=None):
    edit = par.replace(" the ", " a ", 1)
    story = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]
    return {
        "own": (story, own),
        "edit": ([{"role": "user", "content":
                   "Repeat the following text exactly, but with the first ' the ' changed to "
                   "' a '. Write nothing else.\n\n" + par}], edit),
        "quote": ([{"role": "user", "content":
                    "Repeat the following text exactly. Write nothing else.\n\n" + par}], None),
        "story": (story, None),
        "wrong": (story, par),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join("build", "tessera"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", default=os.path.join("..", "shared", "data", "wikitext-2",
                                                   "wiki.test.raw"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sampled answers (seeded: the same draws on every server)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    os.environ["TS_SERVER_BIN"] = a.bin
    pars = paragraphs(a.data, a.reps)
    configs = {"plain": ["--draft-max", "0"], "pred": [], "lookup": ["--draft-lookup"]}
    # the three servers run side by side, idle but for the one answering: the requests take
    # turns (in a rotating order), so that a drift in the machine's speed falls on all alike
    servers = {name: server_util.Server("--cache-mb", "0", "--threads", str(os.cpu_count()),
                                        "--device", a.device, *flags, model=a.model)
               for name, flags in configs.items()}
    names = ("edit", "quote", "story", "own", "wrong")
    rates = {(n, t): [] for n in configs for t in names}
    counts = {k: [0, 0] for k in rates}
    answers = {}
    try:
        # "own": the story with the plain server's own answer as the prediction - the right
        # answer, as far as its text tokenizes back the same: what the check of guesses costs
        msgs = tasks("")["story"][0]
        own = stream(servers["plain"].port, {"messages": msgs, "temperature": a.temperature,
                                              "max_tokens": a.max_tokens, "seed": 1000})[2]
        for i, par in enumerate(pars):
            for task, (msgs, pred) in tasks(par, own).items():
                order = list(servers.items())
                for name, srv in order[i % 3:] + order[:i % 3]:  # each goes first in turn
                    time.sleep(0.3)  # the last one's threads gone to sleep
                    body = {"messages": msgs, "temperature": a.temperature,
                            "max_tokens": a.max_tokens, "seed": 1000 + i}
                    if pred and name != "plain":
                        body["prediction"] = {"type": "content", "content": pred}
                    _, after, text, usage = stream(srv.port, body)
                    rates[(name, task)].append((usage["completion_tokens"] - 1) / after)
                    d = usage.get("completion_tokens_details", {})
                    c = counts[(name, task)]
                    c[0] += d.get("accepted_prediction_tokens", 0)
                    c[1] += d.get("rejected_prediction_tokens", 0)
                    answers[(name, task, i)] = text
    finally:
        for srv in servers.values():
            srv.stop()
    same = {(n, t): sum(answers[(n, t, i)] == answers[("plain", t, i)] for i in range(len(pars)))
            for (n, t) in rates}
    results = {k: {"tok_s": statistics.median(v), "accepted": counts[k][0],
                   "rejected": counts[k][1], "same_as_plain": f"{same[k]}/{len(pars)}"}
               for k, v in rates.items()}
    if a.json:
        print(json.dumps({f"{k[0]}/{k[1]}": v for k, v in results.items()}, indent=1))
        return
    print(f"{'task':6} {'server':7} {'decode t/s':>10} {'x plain':>8} {'accepted':>9} "
          f"{'rejected':>9}  answers as plain's")
    for task in names:
        base = results[("plain", task)]["tok_s"]
        for name in configs:
            r = results[(name, task)]
            print(f"{task:6} {name:7} {r['tok_s']:10.1f} {r['tok_s'] / base:8.2f} "
                  f"{r['accepted']:9d} {r['rejected']:9d}  {r['same_as_plain']}")


if __name__ == "__main__":
    main()
