/* The tokenizer of a Hugging Face checkpoint as GGUF metadata (llama.cpp's "gpt2" byte-level BPE
 * form, or its "llama" SentencePiece form for Gemma's converted tokenizer.json), for
 * ts_quantize_model. */
#ifndef TS_MODEL_QUANTIZE_VOCAB_H
#define TS_MODEL_QUANTIZE_VOCAB_H

#include "format/gguf.h"

/* Writes tokenizer.ggml.* (model "gpt2", pre, tokens padded to n_vocab, token_type, merges,
 * bos/eos/padding ids, add_bos_token false; or model "llama" with scores instead of merges and
 * add_bos_token / add_eos_token from the post-processor) and tokenizer.chat_template from
 * dir/tokenizer.json, tokenizer_config.json (or chat_template.jinja) and config.json. No
 * tokenizer.json: writes nothing. A SentencePiece tokenizer.json the "llama" form cannot
 * reproduce is TS_ERR_UNSUPPORTED. */
ts_status qz_write_vocab(ts_gguf_writer *w, const char *dir, const char *pre, int n_vocab);

#endif
