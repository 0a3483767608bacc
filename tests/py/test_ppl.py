"""`tessera ppl`: the sliding-window perplexity equals exp(mean NLL) computed independently from
`tessera logits`, every token after the first is scored once whatever the stride, and the
result does not depend on the thread count."""
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

BIN = os.environ.get("TS_BIN", "build/tessera")
FX = os.environ.get("TS_FIXTURES", "tests/fixtures")
SHARED = os.environ.get("TS_SHARED", "../shared")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("ppl") / "tiny"
    subprocess.run([BIN, "synth", "--preset", "tiny", "-o", str(d)], check=True,
                   capture_output=True)
    shutil.copy(os.path.join(FX, "tokenizer", "small", "tokenizer.json"), d)
    return str(d)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    raw = open(os.path.join(SHARED, "data", "wikitext-2", "wiki.test.raw"), "rb").read()
    p = tmp_path_factory.mktemp("ppl") / "text.txt"
    p.write_bytes(raw[:6000])
    return str(p)


def ppl(model, path, *args):
    out = subprocess.run([BIN, "ppl", "-m", model, "-f", path, *args], check=True,
                         capture_output=True, text=True).stdout
    m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+) \((\d+) tokens scored", out)
    assert m, out
    return float(m.group(1)), float(m.group(2)), int(m.group(3))


def test_matches_logits(model, text_file, tmp_path):
    text = open(text_file, encoding="utf-8").read()
    ids = subprocess.run([BIN, "tokenize", "-m", model, text], check=True, capture_output=True,
                         text=True).stdout.split()
    n = len(ids)
    assert n > 100
    out = tmp_path / "l.bin"
    subprocess.run([BIN, "logits", "-m", model, "--ids", ",".join(ids), "-o", str(out)],
                   check=True, capture_output=True)
    logits = np.fromfile(out, dtype=np.float32).reshape(n, -1).astype(np.float64)
    m = logits.max(axis=1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    nll = -logp[np.arange(n - 1), np.array(ids[1:], dtype=int)]
    want = float(np.exp(nll.mean()))
    got, se, scored = ppl(model, text_file, "--ctx", str(n + 10), "--stride", str(n + 9))
    assert scored == n - 1
    assert abs(got - want) / want < 1e-4, (got, want)
    assert se > 0


def test_each_token_scored_once(model, text_file):
    counts = {ppl(model, text_file, "--ctx", c, "--stride", s)[2]
              for c, s in [("64", "63"), ("64", "16"), ("128", "50"), ("200", "199")]}
    assert len(counts) == 1
    r = subprocess.run([BIN, "ppl", "-m", model, "-f", text_file, "--ctx", "64", "--stride", "64"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "smaller than --ctx" in r.stderr


def test_threads_do_not_change_the_result(model, text_file):
    a = ppl(model, text_file, "--ctx", "96", "--stride", "48", "--threads", "1")
    b = ppl(model, text_file, "--ctx", "96", "--stride", "48", "--threads", "2")
    assert a == b


def test_max_tokens(model, text_file):
    assert ppl(model, text_file, "--max-tokens", "300", "--ctx", "64", "--stride", "32")[2] == 299
