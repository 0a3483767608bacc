#!/usr/bin/env python3
"""Several answers to one prompt through `tessera serve`: one request with n choices against n
requests of the same prompt sent at once, and against one request alone. Reports each case's
wall time, the prompt tokens the server prefilled (tessera_prefill_tokens_total) and the
answers' tokens per second.

    python3 bench/serve_choices.py [--bin build/tessera] [--model M] [--n 4] [--prompt-tokens
        1500] [--max-tokens 64] [-- extra serve flags]

Without --model a tiny random model is built (see bench/serve_bench.py). The prompt is a
completion of --prompt-tokens token ids (no tokenizer involved); answers are sampled
(temperature 1, each choice or request its own seed) and never stop early (ignore_eos)."""
import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py"))
import server_util  # noqa: E402


def run_case(srv, bodies):
    """Sends the bodies at once; (seconds, prefilled tokens, answers' tokens)."""
    m0 = srv.metrics()["tessera_prefill_tokens_total"]
    out = [None] * len(bodies)

    def go(i):
        status, _, r = srv.post("/v1/completions", bodies[i])
        assert status == 200, r
        out[i] = r

    t0 = time.perf_counter()
    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    tokens = sum(r["usage"]["completion_tokens"] for r in out)
    return dt, srv.metrics()["tessera_prefill_tokens_total"] - m0, tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin")
    ap.add_argument("--model")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=1500)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("serve_args", nargs="*")
    a = ap.parse_args()
    if a.bin:
        os.environ["TS_SERVER_BIN"] = a.bin
    args = ["--parallel", str(max(a.n, 1)), *a.serve_args]
    with server_util.Server(*args, model=a.model) as srv:
        base = {"max_tokens": a.max_tokens, "temperature": 1.0, "ignore_eos": True}
        for rep in range(a.reps):
            # a new prompt each case and repetition, so that no snapshot serves it
            def prompt(k):
                return [(7 * i + 1000 * rep + 100 * k) % 3000 + 10
                        for i in range(a.prompt_tokens)]

            cases = [("one request, n=1", [dict(base, prompt=prompt(0), seed=1)]),
                     (f"one request, n={a.n}", [dict(base, prompt=prompt(1), seed=1, n=a.n)]),
                     (f"{a.n} requests at once", [dict(base, prompt=prompt(2), seed=1 + c)
                                                  for c in range(a.n)])]
            for name, bodies in cases:
                dt, pre, tok = run_case(srv, bodies)
                print(f"rep {rep} {name:24s} {dt * 1000:8.1f} ms  prefilled {int(pre):6d}  "
                      f"answers {tok:5d} tokens  {tok / dt:8.1f} t/s", flush=True)


if __name__ == "__main__":
    main()
