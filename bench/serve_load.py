#!/usr/bin/env python3
"""Load benchmark for `tessera serve`: C clients at once, each sending requests back to back;
the aggregate generated tokens/s, each request's own decode rate and its time to first token.

    python3 bench/serve_load.py --model DIR [--bin build/tessera] [--clients 1,4,16]
        [--parallel 1,16] [--max-tokens 128] [--requests 3] [--device cpu|cuda]
        [--temperature 0] [--json]

For each --parallel value a server is started (`tessera serve --parallel P`) and driven with
each number of clients in turn. Every request is a chat with a prompt of its own (a few dozen
tokens, so that no prefix is reused) and `ignore_eos`, so each generates exactly --max-tokens
tokens. Streaming, to see the first token. Without --model a tiny random model is built
(server overhead, not the model)."""
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


def one_request(port, body):
    """(seconds to the first token, seconds in all, completion tokens)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions",
              json.dumps(dict(body, stream=True, stream_options={"include_usage": True})),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    first, tokens = None, 0
    for line in r:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        ch = ev.get("choices") or []
        if first is None and ch and (ch[0]["delta"].get("content") or
                                     ch[0]["delta"].get("reasoning_content")):
            first = time.perf_counter() - t0
    c.close()
    return first or 0.0, time.perf_counter() - t0, tokens


def drive(port, clients, requests, body, tag):
    results = []
    lock = threading.Lock()

    def client(i):
        for k in range(requests):
            b = dict(body, messages=[{"role": "user", "content":
                                      f"Request {tag}-{i}-{k}: write about the number {i * 97 + k}."
                                      " " * (i % 3)}])
            res = one_request(port, b)
            with lock:
                results.append(res)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r[2] for r in results)
    ttft = sorted(r[0] for r in results)
    per_req = [r[2] / (r[1] - r[0]) for r in results if r[1] > r[0] and r[2] > 1]
    return {"clients": clients, "requests": len(results), "tokens": tokens,
            "wall_s": round(wall, 3), "aggregate_tps": round(tokens / wall, 1),
            "per_request_tps": round(statistics.median(per_req), 1) if per_req else 0,
            "ttft_p50_ms": round(1000 * ttft[len(ttft) // 2], 1),
            "ttft_max_ms": round(1000 * ttft[-1], 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin")
    ap.add_argument("--model")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--parallel", default="1,16")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--requests", type=int, default=3, help="per client")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--threads", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.bin:
        os.environ["TS_BIN"] = a.bin
    body = {"max_tokens": a.max_tokens, "temperature": a.temperature, "ignore_eos": True,
            "seed": 1}
    rows = []
    for p in [int(x) for x in a.parallel.split(",")]:
        args = ["--parallel", str(p), "--device", a.device, "--max-pending", "512"]
        if a.threads:
            args += ["--threads", a.threads]
        srv = server_util.Server(*args, model=a.model)
        try:
            # warm: one request through before timing
            one_request(srv.port, dict(body, max_tokens=4,
                                       messages=[{"role": "user", "content": "warm up"}]))
            for c in [int(x) for x in a.clients.split(",")]:
                r = drive(srv.port, c, a.requests, body, f"p{p}c{c}")
                r["parallel"] = p
                rows.append(r)
                if not a.json:
                    print(f"parallel {p:3d} clients {c:3d}: {r['aggregate_tps']:9.1f} t/s "
                          f"aggregate, {r['per_request_tps']:8.1f} t/s a request, TTFT p50 "
                          f"{r['ttft_p50_ms']:.1f} ms max {r['ttft_max_ms']:.1f} ms "
                          f"({r['requests']} requests, {r['wall_s']} s)", flush=True)
        finally:
            srv.stop()
    if a.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
