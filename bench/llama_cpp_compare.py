"""The same work as `tessera bench -p N -n M` done by llama.cpp through llama-cpp-python, for a
side-by-side on one machine and one GGUF file: prefill N tokens on a fresh context, then M
single-token greedy decode steps; best and median of the repetitions.

    pip install llama-cpp-python
    python3 bench/llama_cpp_compare.py MODEL.gguf [-p 512] [-n 128] [-r 3] [--threads 2]

Decode steps include Python's per-step call and the copy of the logits row, which tessera
bench's figure also includes (its greedy step takes the argmax of the logits)."""
import argparse
import statistics
import time

import llama_cpp
import numpy as np
from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    llm = Llama(model_path=a.model, n_ctx=a.p + a.n + 8, n_batch=max(a.p, 1), n_threads=a.threads,
                n_threads_batch=a.threads, logits_all=False, verbose=False)
    vocab = llm.n_vocab()
    ids = [(12345 * 6364136223846793005 * (i + 1) >> 33) % vocab for i in range(a.p)]
    pp, tg = [], []
    for _ in range(a.r + 1):  # the first round warms up
        llm.reset()
        llm._ctx.kv_cache_clear()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        for _ in range(a.n):
            row = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)  # the last evaluated token
            tok = int(np.ctypeslib.as_array(row, shape=(vocab,)).argmax())
            llm.eval([tok])
        t2 = time.perf_counter()
        pp.append(a.p / (t1 - t0))
        tg.append(a.n / (t2 - t1))
    pp, tg = pp[1:], tg[1:]
    print(f"llama.cpp (llama-cpp-python) {a.model}: pp{a.p} {statistics.median(pp):.2f} t/s "
          f"(best {max(pp):.2f}), tg{a.n} {statistics.median(tg):.2f} t/s (best {max(tg):.2f}), "
          f"threads {a.threads}")


if __name__ == "__main__":
    main()
