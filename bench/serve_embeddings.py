#!/usr/bin/env python3
"""Embeddings through `tessera serve` (POST /v1/embeddings): inputs and tokens a second.

    python3 bench/serve_embeddings.py --model MODEL [--bin build/tessera] [--device cpu|cuda]
        [--inputs 64] [--tokens 128] [--per-request 1,16] [--pooling last|mean|cls] [--threads N]
        [--json]

The inputs are token-id lists of --tokens ids each (fixed pseudo-random ids under 1000, so any
vocabulary takes them and no tokenizer time is counted). For each --per-request k the same
inputs are sent k to a request, the requests one after another; with k > 1 a request's inputs
are shared out over the server's lanes and run side by side in each forward call, so k = 1
against k = 16 shows what the lanes give. A warm-up request runs first. Figures go to
bench/RESULTS.md with the machine, the commit and this command."""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py"))
import server_util  # noqa: E402


def inputs_of(n, length):
    x, out = 12345, []
    for _ in range(n):
        ids = []
        for _ in range(length):
            x = (x * 1103515245 + 12345) % 2**31
            ids.append(100 + x % 900)
        out.append(ids)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(server_util.REPO, "build", "tessera"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--per-request", default="1,16")
    ap.add_argument("--pooling", choices=["last", "mean", "cls"],
                    help="the server's --pooling (default: none, the model's own or last)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    os.environ["TS_SERVER_BIN"] = a.bin
    inputs = inputs_of(a.inputs, a.tokens)
    rows = []
    pooling = ["--pooling", a.pooling] if a.pooling else []
    with server_util.Server("--device", a.device, *pooling, "--threads", str(a.threads), "--ctx",
                            str(max(a.tokens, 256)), model=a.model) as srv:
        srv.post_ok("/v1/embeddings", {"input": inputs[:2]})  # warm-up
        for k in (int(x) for x in a.per_request.split(",")):
            t0 = time.perf_counter()
            for i in range(0, len(inputs), k):
                r = srv.post_ok("/v1/embeddings", {"input": inputs[i:i + k],
                                                   "encoding_format": "base64"})
                assert len(r["data"]) == len(inputs[i:i + k])
            dt = time.perf_counter() - t0
            rows.append({"per_request": k, "inputs": len(inputs), "tokens": a.tokens,
                         "seconds": round(dt, 3), "inputs_per_s": round(len(inputs) / dt, 1),
                         "tokens_per_s": round(len(inputs) * a.tokens / dt, 1)})
    if a.json:
        print(json.dumps(rows))
        return
    pool = a.pooling or "the model's"
    print(f"{a.model} on {a.device}, {a.inputs} inputs of {a.tokens} tokens, pooling {pool}")
    print("inputs/request   seconds   inputs/s   tokens/s")
    for r in rows:
        print(f"{r['per_request']:>14}   {r['seconds']:>7.2f}   {r['inputs_per_s']:>8.1f}   "
              f"{r['tokens_per_s']:>8.1f}")


if __name__ == "__main__":
    main()
