/* The tokenizer of a Hugging Face checkpoint as GGUF metadata (llama.cpp's "gpt2" byte-level BPE
 * form), for ts_quantize_model. */
#ifndef TS_MODEL_QUANTIZE_VOCAB_H
#define TS_MODEL_QUANTIZE_VOCAB_H

#include "format/gguf.h"

/* Writes tokenizer.ggml.* (model "gpt2", pre, tokens padded to n_vocab, token_type, merges,
 * bos/eos/padding ids, add_bos_token false) and tokenizer.chat_template from dir/tokenizer.json,
 * tokenizer_config.json (or chat_template.jinja) and config.json. No tokenizer.json: writes
 * nothing. */
ts_status qz_write_vocab(ts_gguf_writer *w, const char *dir, const char *pre, int n_vocab);

#endif
