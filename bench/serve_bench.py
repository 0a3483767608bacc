#!/usr/bin/env python3
"""Serving benchmark for `tessera serve`: time to first token (short prompt, multi-turn
follow-up, reasoning prompt) with and without prefix reuse, server overhead per request, and
the time to admit or refuse a request.

    python3 bench/serve_bench.py [--bin build/tessera] [--model DIR] [--reps 5] [--json]
        [--conversations N] [--server-args "--ctx 32768"]

Without --model a tiny random model is built (tessera synth --preset tiny + the fixture
tokenizer): that measures the server, not the model. `--model 0.8b` builds a random model with
the real Qwen3.5-0.8B shapes and tokenizer under /tmp (tessera synth --preset 0.8b, ~1.5 GB;
never in the repository), where prefill is expensive enough to show what prefix reuse saves.
Goals (issue 4): the follow-up's TTFT within 10% of the short prompt's; admission/refusal under
1 ms.

Every short prompt is a new question; "repeat" sends the first one again (with reuse it is
restored whole, its first token sampled from the stored logits, no prefill). The follow-up is
sent once the worker has prepared the next turn (/metrics), as a person reading the answer
would allow; the history is a system prompt of --history tokens plus the first answer."""
import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py"))
import server_util  # noqa: E402


def stream_ttft(port, path, body):
    """Seconds to the first content or reasoning delta, and the whole request."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t0 = time.perf_counter()
    c.request("POST", path, json.dumps(dict(body, stream=True)),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    first = None
    while True:
        line = r.fp.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        ch = ev.get("choices") or [{}]
        d = ch[0].get("delta", {})
        if first is None and (d.get("content") or d.get("reasoning_content") or ch[0].get("text")):
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    c.close()
    return first if first is not None else total, total


def median_ms(xs):
    return statistics.median(xs) * 1e3


SYSTEM_LINE = "You are a careful assistant. Answer briefly and precisely. "


def conversation(turns, system):
    msgs = [{"role": "system", "content": system}]
    for q, a in turns:
        msgs.append({"role": "user", "content": q})
        if a is not None:
            msgs.append({"role": "assistant", "content": a})
    return msgs


def next_turns(srv):
    m = srv.metrics()
    return m.get("tessera_next_turn_ready_total", 0) + m.get("tessera_next_turn_abandoned_total", 0)


def wait_next_turn(srv, before, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and next_turns(srv) <= before:
        time.sleep(0.02)


def system_prompt(srv, tokens):
    """A system prompt of about `tokens` tokens with this server's tokenizer."""
    one = srv.post("/tokenize", {"content": SYSTEM_LINE})[2]["count"]
    return SYSTEM_LINE * max(1, round(tokens / one))


def bench_ttft(srv, reps, max_tokens, history, reuse, conversations=1):
    out = {}
    system = system_prompt(srv, history)
    out["history_tokens"] = srv.post("/tokenize", {"messages": conversation(
        [("Tell me about topic 0.", None)], system)})[2]["count"]
    srv.post("/v1/completions", {"prompt": "warm up", "max_tokens": 1})  # page the weights in
    short = [stream_ttft(srv.port, "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": f"What is 2 + {i}?"}],
                          "temperature": 0, "max_tokens": max_tokens})[0] for i in range(reps)]
    out["short"] = median_ms(short)
    # the first short prompt again: with reuse it is restored whole (snapshot + stored logits)
    repeat = [stream_ttft(srv.port, "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "What is 2 + 0?"}],
                           "temperature": 0, "max_tokens": max_tokens})[0] for _ in range(reps)]
    out["repeat"] = median_ms(repeat)
    # multi-turn: the first turn is answered, then the follow-up is timed (a fresh conversation
    # each repetition, so only its own history can be reused)
    follow = []
    for i in range(reps):
        first_q = f"Tell me about topic {i}."
        if reuse:
            srv.settle()  # the previous follow-up's idle work must not count for this one
        before = next_turns(srv)
        _, _, r = srv.post("/v1/chat/completions",
                           {"messages": conversation([(first_q, None)], system),
                            "temperature": 0, "max_tokens": max_tokens})
        answer = r["choices"][0]["message"]["content"]
        if reuse:
            wait_next_turn(srv, before)
        body = {"messages": conversation([(first_q, answer), ("And why?", None)], system),
                "temperature": 0, "max_tokens": max_tokens}
        follow.append(stream_ttft(srv.port, "/v1/chat/completions", body)[0])
    out["follow_up"] = median_ms(follow)
    if conversations > 1:
        out["follow_up_interleaved"] = median_ms(interleaved(srv, conversations, system,
                                                             max_tokens, reuse))
    think = [stream_ttft(srv.port, "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": f"Think about 17 * {i}."}],
                          "temperature": 0, "max_tokens": max_tokens,
                          "chat_template_kwargs": {"enable_thinking": True}})[0]
             for i in range(reps)]
    out["reasoning"] = median_ms(think)
    return out


def interleaved(srv, n, system, max_tokens, reuse):
    """n conversations at once, as n people chatting: each one's first turn is answered (and
    its next turn prepared), then each one's follow-up is timed. Only a cache that holds all n
    conversations' states serves every follow-up from its own."""
    answers = []
    for k in range(n):
        before = next_turns(srv)
        q = f"Person {k} asks about subject {k * 7}."
        _, _, r = srv.post("/v1/chat/completions", {"messages": conversation([(q, None)], system),
                                                    "temperature": 0, "max_tokens": max_tokens})
        answers.append((q, r["choices"][0]["message"]["content"]))
        if reuse:
            wait_next_turn(srv, before)
    return [stream_ttft(srv.port, "/v1/chat/completions",
                        {"messages": conversation([(q, a), ("And why?", None)], system),
                         "temperature": 0, "max_tokens": max_tokens})[0] for q, a in answers]


def model_0_8b(binary):
    """A random Qwen3.5-0.8B-shaped model with the real tokenizer, under /tmp."""
    import subprocess
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "tessera-bench-0.8b")
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        subprocess.run([binary, "synth", "--preset", "0.8b", "-o", path], check=True)
    tok = os.path.join(path, "tokenizer.json")
    if not os.path.exists(tok):
        repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        subprocess.run([sys.executable, os.path.join(repo, "tools", "make_qwen35_tokenizer.py"),
                        "qwen", tok], check=True)
    return path


def bench_overhead(srv, reps):
    """Client latency of a 1-token request minus the worker's own time (from /metrics)."""
    lat, work = [], []
    body = {"prompt": "Hi", "max_tokens": 1, "temperature": 0}
    for i in range(reps * 4):
        m0 = srv.metrics()
        t0 = time.perf_counter()
        srv.post("/v1/completions", body)
        lat.append(time.perf_counter() - t0)
        m1 = srv.metrics()
        work.append(m1["tessera_ttft_seconds_sum"] - m0["tessera_ttft_seconds_sum"])
    health = []
    for _ in range(reps * 4):
        t0 = time.perf_counter()
        srv.request("GET", "/health")
        health.append(time.perf_counter() - t0)
    return {"request_ms": median_ms(lat), "worker_ms": median_ms(work),
            "overhead_ms": median_ms([a - b for a, b in zip(lat, work)]),
            "health_ms": median_ms(health)}


def bench_admission(bin_args, reps):
    """Time to refuse (503) with the cap reached, and to admit (until the job is queued:
    measured as the 1-token request on an idle server minus its worker time, above)."""
    with server_util.Server("--max-pending", "1", "--debug-step-delay-ms", "100", *bin_args) as s:
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        c.request("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 200,
                                                         "stream": True}),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        r.fp.readline()
        refuse = []
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
        body = json.dumps({"prompt": "x", "max_tokens": 1})
        for _ in range(reps * 10):
            t0 = time.perf_counter()
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            refuse.append(time.perf_counter() - t0)
            assert resp.status == 503
        c.close()
    return {"refuse_ms": median_ms(refuse)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin")
    ap.add_argument("--model")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--history", type=int, default=300, help="system prompt tokens")
    ap.add_argument("--threads", default=None)
    ap.add_argument("--skip-overhead", action="store_true",
                    help="only the TTFT table (the overhead numbers need a tiny model)")
    ap.add_argument("--conversations", type=int, default=1,
                    help="also time follow-ups of this many conversations held at once")
    ap.add_argument("--server-args", default="", help="more `tessera serve` options, e.g. --ctx")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.bin:
        os.environ["TS_SERVER_BIN"] = os.path.abspath(a.bin)
    extra = (["--threads", a.threads] if a.threads else []) + a.server_args.split()
    model = (model_0_8b(server_util.binary()) if a.model == "0.8b"
             else a.model or server_util.tiny_model())
    res = {"model": model}
    for name, args in (("cache", []), ("no_cache", ["--cache-mb", "0"])):
        with server_util.Server(*args, *extra, model=model) as srv:
            res[name] = bench_ttft(srv, a.reps, a.max_tokens, a.history, name == "cache",
                                   a.conversations)
            if name == "cache" and not a.skip_overhead:
                res["overhead"] = bench_overhead(srv, a.reps)
    if not a.skip_overhead:
        res["admission"] = bench_admission(extra, a.reps)
    c = res["cache"]
    res["goals"] = {"follow_up_within_10pct_of_short": c["follow_up"] <= 1.10 * c["short"]}
    if "admission" in res:
        res["goals"]["refusal_under_1ms"] = res["admission"]["refuse_ms"] < 1.0
    if a.json:
        print(json.dumps(res, indent=2))
        return
    print(f"model: {model}; history {c['history_tokens']} tokens before the follow-up")
    print(f"{'TTFT (median ms)':24} {'prefix reuse':>14} {'no reuse':>10}")
    for k in ("short", "repeat", "follow_up", "follow_up_interleaved", "reasoning"):
        if k in res["cache"]:
            print(f"{k:24} {res['cache'][k]:14.2f} {res['no_cache'][k]:10.2f}")
    if "overhead" in res:
        o = res["overhead"]
        print(f"1-token request {o['request_ms']:.2f} ms = worker {o['worker_ms']:.2f} ms + "
              f"server overhead {o['overhead_ms']:.2f} ms; GET /health {o['health_ms']:.2f} ms")
        print(f"refusal (503 server_busy) round trip: {res['admission']['refuse_ms']:.3f} ms")
    print("goals:", ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in res["goals"].items()))


if __name__ == "__main__":
    main()
