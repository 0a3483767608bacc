/* tokenizer.json -> GGUF tokenizer metadata, as llama.cpp's converter writes it.
 *
 * Byte-level BPE (Qwen) -> "gpt2": the tokens in id order (the byte-level spellings of
 * tokenizer.json), padded up to the model's vocab_size with "[PAD<i>]" entries of type UNUSED;
 * added tokens typed CONTROL when special, USER_DEFINED otherwise; merges as "left right"
 * strings.
 *
 * SentencePiece converted (Gemma: decoder Replace + ByteFallback) -> "llama": the same tokens
 * and types (<0xXX> pieces BYTE), and scores instead of merges. llama.cpp's SentencePiece
 * tokenizer (and ts_spm) merges the adjacent pair whose concatenation has the highest score;
 * Hugging Face's BPE the pair of lowest merge rank. A piece's score is minus the rank of the
 * first merge that makes it, so the two agree wherever every split of a piece into two pieces
 * is a merge - what a conversion from tokenizer.model lists (transformers' generate_merges).
 * That is checked, as is the rest of what the "llama" form cannot say (another normalizer, a
 * real split, added tokens matched after normalization, missing byte pieces): refused, not
 * written as a vocabulary that tokenizes differently. */
#include "model/quantize_vocab.h"

#include "base/byte_piece.h"
#include "format/hfconfig.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { TOK_NORMAL = 1, TOK_CONTROL = 3, TOK_USER_DEFINED = 4, TOK_UNUSED = 5, TOK_BYTE = 6 };

typedef struct {
    const char *path;
    json_t *root, *vocab, *added;
    int n;
    const char **text;
    size_t *len;
    int32_t *type;
    char *pads; /* storage for the "[PAD<i>]" spellings */
} vocab;

static void vocab_free(vocab *v) {
    free(v->text);
    free(v->len);
    free(v->type);
    free(v->pads);
    json_decref(v->root);
}

static ts_status fill_tokens(vocab *v) {
    size_t n = (size_t)v->n;
    v->text = calloc(n, sizeof *v->text);
    v->len = calloc(n, sizeof *v->len);
    v->type = calloc(n, sizeof *v->type);
    v->pads = malloc(n * 16);
    if (!v->text || !v->len || !v->type || !v->pads)
        return ts_error(TS_ERR_NOMEM, "out of memory");
    const char *key;
    json_t *val;
    json_object_foreach(v->vocab, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= v->n)
            return ts_error(TS_ERR_FORMAT, "%s: token '%s': id %lld outside the model's "
                            "vocab_size %d", v->path, key, (long long)id, v->n);
        v->text[id] = key;
        v->len[id] = strlen(key);
        v->type[id] = TOK_NORMAL;
    }
    size_t i;
    json_array_foreach(v->added, i, val) {
        json_t *id = json_object_get(val, "id"), *content = json_object_get(val, "content");
        if (!json_is_integer(id) || !json_is_string(content) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= v->n)
            return ts_error(TS_ERR_FORMAT, "%s: added_tokens[%zu]: bad id or content (vocab_size "
                            "%d)", v->path, i, v->n);
        json_int_t k = json_integer_value(id);
        v->text[k] = json_string_value(content);
        v->len[k] = json_string_length(content);
        v->type[k] = json_is_true(json_object_get(val, "special")) ? TOK_CONTROL
                                                                    : TOK_USER_DEFINED;
    }
    for (int k = 0; k < v->n; k++)
        if (!v->text[k]) {
            char *s = v->pads + (size_t)k * 16;
            snprintf(s, 16, "[PAD%u]", (unsigned)k); /* at most 10 digits */
            v->text[k] = s;
            v->len[k] = strlen(s);
            v->type[k] = TOK_UNUSED;
        }
    return TS_OK;
}

/* model.merges as "left right" strings (the file's own, or a [left, right] pair joined), with
 * where each left piece ends. */
typedef struct {
    size_t n;
    const char **joined;
    size_t *left; /* joined[i][left[i]] is the space between the two pieces (a string without
                   * one: its length) */
    char **owned; /* the joined pairs' storage */
} merge_list;

static void merges_free(merge_list *ml) {
    for (size_t k = 0; ml->owned && k < ml->n; k++)
        free(ml->owned[k]);
    free(ml->owned);
    free(ml->joined);
    free(ml->left);
    memset(ml, 0, sizeof *ml);
}

static ts_status merges_read(const vocab *v, merge_list *ml) {
    memset(ml, 0, sizeof *ml);
    json_t *merges = json_object_get(json_object_get(v->root, "model"), "merges");
    if (!json_is_array(merges)) return TS_OK;
    size_t n = json_array_size(merges), i;
    ml->n = n;
    ml->joined = malloc((n ? n : 1) * sizeof *ml->joined);
    ml->left = malloc((n ? n : 1) * sizeof *ml->left);
    ml->owned = calloc(n ? n : 1, sizeof *ml->owned);
    ts_status st =
        ml->joined && ml->left && ml->owned ? TS_OK : ts_error(TS_ERR_NOMEM, "out of memory");
    json_t *m;
    json_array_foreach(merges, i, m) {
        if (st != TS_OK) break;
        if (json_is_string(m)) {
            const char *sp = strchr(json_string_value(m), ' ');
            ml->joined[i] = json_string_value(m);
            ml->left[i] = sp ? (size_t)(sp - ml->joined[i]) : strlen(ml->joined[i]);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            const char *a = json_string_value(json_array_get(m, 0));
            const char *b = json_string_value(json_array_get(m, 1));
            size_t la = strlen(a), lb = strlen(b);
            ml->owned[i] = malloc(la + lb + 2);
            if (!ml->owned[i]) {
                st = ts_error(TS_ERR_NOMEM, "out of memory");
                break;
            }
            memcpy(ml->owned[i], a, la);
            ml->owned[i][la] = ' ';
            memcpy(ml->owned[i] + la + 1, b, lb + 1);
            ml->joined[i] = ml->owned[i];
            ml->left[i] = la;
        } else {
            st = ts_error(TS_ERR_FORMAT, "%s: model.merges[%zu]: expected \"a b\" or [a, b]",
                          v->path, i);
        }
    }
    if (st != TS_OK) merges_free(ml);
    return st;
}

static ts_status write_merges(const vocab *v, ts_gguf_writer *w) {
    merge_list ml;
    TS_TRY(merges_read(v, &ml));
    ts_status st =
        ml.joined ? ts_gguf_writer_kv_str_arr(w, "tokenizer.ggml.merges", ml.joined, NULL, ml.n)
                  : TS_OK;
    merges_free(&ml);
    return st;
}

/* The id of a token spelled s; -1 when unknown. */
static int token_id(const vocab *v, const char *s) {
    size_t i;
    json_t *a;
    json_array_foreach(v->added, i, a) {
        json_t *c = json_object_get(a, "content");
        if (json_is_string(c) && strcmp(json_string_value(c), s) == 0)
            return (int)json_integer_value(json_object_get(a, "id"));
    }
    json_t *id = json_object_get(v->vocab, s);
    return json_is_integer(id) ? (int)json_integer_value(id) : -1;
}

/* tokenizer_config.json's bos_token / eos_token / pad_token (a string or {"content": ...}),
 * else config.json's *_token_id; -1 when neither says. */
static int special_id(const vocab *v, json_t *tcfg, const ts_hfconfig *cfg, const char *which) {
    char key[32];
    snprintf(key, sizeof key, "%s_token", which);
    json_t *t = json_object_get(tcfg, key);
    if (json_is_object(t)) t = json_object_get(t, "content");
    if (json_is_string(t)) {
        int id = token_id(v, json_string_value(t));
        if (id >= 0) return id;
    }
    snprintf(key, sizeof key, "%s_token_id", which);
    int64_t ids[1];
    int n;
    if (cfg && ts_hfconfig_has(cfg, key) && ts_hfconfig_int_array(cfg, key, ids, 1, &n) == TS_OK &&
        n >= 1 && ids[0] >= 0 && ids[0] < v->n)
        return (int)ids[0];
    return -1;
}

static ts_status write_specials(const vocab *v, const char *dir, bool add_bos, bool add_eos,
                                ts_gguf_writer *w) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *tcfg = json_load_file(path, 0, NULL); /* optional */
    ts_hfconfig *cfg = NULL;
    if (ts_hfconfig_load(dir, &cfg) != TS_OK) cfg = NULL;
    static const struct {
        const char *which, *key;
    } ids[] = {{"bos", "tokenizer.ggml.bos_token_id"},
               {"eos", "tokenizer.ggml.eos_token_id"},
               {"pad", "tokenizer.ggml.padding_token_id"}};
    ts_status st = TS_OK;
    for (size_t i = 0; st == TS_OK && i < sizeof ids / sizeof ids[0]; i++) {
        int id = special_id(v, tcfg, cfg, ids[i].which);
        if (id >= 0) st = ts_gguf_writer_kv_u32(w, ids[i].key, (uint32_t)id);
    }
    if (st == TS_OK) st = ts_gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    if (st == TS_OK && add_eos)
        st = ts_gguf_writer_kv_bool(w, "tokenizer.ggml.add_eos_token", true);
    /* the chat template: tokenizer_config.json's, else chat_template.jinja */
    json_t *tmpl = json_object_get(tcfg, "chat_template");
    if (st == TS_OK && json_is_string(tmpl)) {
        st = ts_gguf_writer_kv_str(w, "tokenizer.chat_template", json_string_value(tmpl));
    } else if (st == TS_OK) {
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        FILE *f = fopen(path, "rb");
        if (f) {
            char *text = NULL;
            long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
            if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1)) &&
                fread(text, 1, (size_t)n, f) == (size_t)n)
                st = ts_gguf_writer_kv_strn(w, "tokenizer.chat_template", text, (size_t)n);
            else
                st = ts_error(TS_ERR_IO, "%s: cannot read", path);
            free(text);
            fclose(f);
        }
    }
    ts_hfconfig_free(cfg);
    json_decref(tcfg);
    return st;
}

/* ---- SentencePiece converted -> "llama" ------------------------------------------------------ */

static bool json_str_is(const json_t *v, const char *s) {
    return json_is_string(v) && strcmp(json_string_value(v), s) == 0;
}

static const char *obj_type(const json_t *obj) {
    const json_t *t = json_object_get(obj, "type");
    return json_is_string(t) ? json_string_value(t) : "";
}

/* The one-step form a Sequence may wrap: the Sequence's only item, or obj itself. */
static const json_t *only_step(const json_t *obj, const char *list) {
    const json_t *items = json_object_get(obj, list);
    if (strcmp(obj_type(obj), "Sequence") == 0)
        return json_array_size(items) == 1 ? json_array_get(items, 0) : NULL;
    return obj;
}

/* What the "llama" form can say: Gemma's normalizer (spaces -> U+2581, nothing else), no split
 * (or the converter's Split on " " that finds none), byte fallback over all 256 bytes, no
 * added token matched after normalization. */
static ts_status spm_check(const vocab *v) {
    static const char sp[] = "\xE2\x96\x81";
    const json_t *model = json_object_get(v->root, "model");
    const json_t *norm = only_step(json_object_get(v->root, "normalizer"), "normalizers");
    const json_t *pre = json_object_get(v->root, "pre_tokenizer");
    const char *why = NULL;
    if (!norm || strcmp(obj_type(norm), "Replace") != 0 ||
        !json_str_is(json_object_get(json_object_get(norm, "pattern"), "String"), " ") ||
        !json_str_is(json_object_get(norm, "content"), sp))
        why = "normalizer: only Replace(' ' -> U+2581)";
    else if (!json_is_null(pre) && pre &&
             !(strcmp(obj_type(pre), "Split") == 0 &&
               json_str_is(json_object_get(json_object_get(pre, "pattern"), "String"), " ") &&
               json_str_is(json_object_get(pre, "behavior"), "MergedWithPrevious")))
        why = "pre_tokenizer: only none, or the Split on ' ' that the normalizer leaves nothing "
              "to find";
    else if (!json_is_true(json_object_get(model, "byte_fallback")) ||
             json_is_true(json_object_get(model, "ignore_merges")))
        why = "model: byte_fallback true and ignore_merges false";
    for (int b = 0; !why && b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        if (!json_object_get(v->vocab, name)) why = "model.vocab: a <0xXX> piece for every byte";
    }
    size_t i;
    json_t *a;
    json_array_foreach(v->added, i, a) {
        if (!why && json_is_true(json_object_get(a, "normalized")))
            why = "added_tokens: none matched after normalization (normalized: true)";
    }
    return why ? ts_error(TS_ERR_UNSUPPORTED,
                          "%s: a SentencePiece tokenizer is written as llama.cpp's 'llama' "
                          "vocabulary, which needs %s",
                          v->path, why)
               : TS_OK;
}

/* buf grown to hold need bytes. */
static ts_status grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return TS_OK;
    free(*buf);
    *cap = 2 * need;
    *buf = malloc(*cap);
    return *buf ? TS_OK : ts_error(TS_ERR_NOMEM, "out of memory");
}

/* Each piece's score: minus the rank of the first merge that makes it; pieces no merge makes
 * (characters, bytes, added tokens) -1e9, which no merge ever compares. Every split of a
 * piece into two vocabulary pieces must be a merge (else llama.cpp would merge a pair that
 * Hugging Face does not). */
static ts_status spm_scores(const vocab *v, float *score) {
    for (int k = 0; k < v->n; k++)
        score[k] = -1e9f;
    merge_list ml;
    TS_TRY(merges_read(v, &ml));
    json_t *pairs = json_object(); /* "left right" -> true, to check the splits */
    ts_status st = pairs ? TS_OK : ts_error(TS_ERR_NOMEM, "out of memory");
    char *buf = NULL;
    size_t cap = 0;
    for (size_t i = 0; st == TS_OK && i < ml.n; i++) {
        const char *j = ml.joined[i];
        size_t la = ml.left[i], n = strlen(j);
        if (la == n) {
            st = ts_error(TS_ERR_FORMAT, "%s: model.merges[%zu]: expected \"a b\" or [a, b]",
                          v->path, i);
            break;
        }
        json_object_set_new(pairs, j, json_true());
        if ((st = grow(&buf, &cap, n)) != TS_OK) break;
        memcpy(buf, j, la); /* the merged piece: the two without the space */
        memcpy(buf + la, j + la + 1, n - la);
        json_t *id = json_object_get(v->vocab, buf);
        json_int_t k = json_is_integer(id) ? json_integer_value(id) : -1;
        if (k >= 0 && k < v->n && score[k] == -1e9f) score[k] = -(float)i;
    }
    const char *key;
    json_t *val;
    json_object_foreach(v->vocab, key, val) {
        size_t n = strlen(key);
        if (st != TS_OK || (st = grow(&buf, &cap, n + 2)) != TS_OK) break;
        for (size_t cut = 1; cut < n && st == TS_OK; cut++) {
            if (((unsigned char)key[cut] & 0xC0) == 0x80) continue; /* inside a character */
            memcpy(buf, key, cut);
            buf[cut] = 0;
            if (!json_object_get(v->vocab, buf) || !json_object_get(v->vocab, key + cut)) continue;
            buf[cut] = ' ';
            memcpy(buf + cut + 1, key + cut, n - cut + 1);
            if (!json_object_get(pairs, buf))
                st = ts_error(TS_ERR_UNSUPPORTED,
                              "%s: piece '%.48s' splits into two pieces at byte %zu with no merge "
                              "for them: llama.cpp's scores cannot say which pairs never merge "
                              "(a conversion from tokenizer.model lists every split)",
                              v->path, key, cut);
        }
    }
    free(buf);
    json_decref(pairs);
    merges_free(&ml);
    return st;
}

/* The post-processor's tokens around one sequence: TemplateProcessing's "single" starting or
 * ending with a SpecialToken (the tokenizer's reading of it is text/bpe_load.c's). */
static void post_tokens(const vocab *v, bool *bos, bool *eos) {
    const json_t *post = json_object_get(v->root, "post_processor");
    const json_t *single = json_object_get(post, "single");
    size_t n = json_array_size(single);
    *bos = n > 1 && json_object_get(json_array_get(single, 0), "SpecialToken");
    *eos = n > 1 && json_object_get(json_array_get(single, n - 1), "SpecialToken");
}

static ts_status write_spm(vocab *v, const char *dir, ts_gguf_writer *w) {
    TS_TRY(spm_check(v));
    float *score = malloc((size_t)v->n * sizeof *score);
    if (!score) return ts_error(TS_ERR_NOMEM, "out of memory");
    ts_status st = spm_scores(v, score);
    for (int k = 0; st == TS_OK && k < v->n; k++)
        if (v->type[k] == TOK_NORMAL && ts_byte_piece(v->text[k], v->len[k], false) >= 0)
            v->type[k] = TOK_BYTE;
    const json_t *unk = json_object_get(json_object_get(v->root, "model"), "unk_token");
    int unk_id = json_is_string(unk) ? token_id(v, json_string_value(unk)) : -1;
    bool add_bos, add_eos;
    post_tokens(v, &add_bos, &add_eos);
    if (st == TS_OK) st = ts_gguf_writer_kv_str(w, "tokenizer.ggml.model", "llama");
    if (st == TS_OK) st = ts_gguf_writer_kv_str(w, "tokenizer.ggml.pre", "default");
    if (st == TS_OK)
        st = ts_gguf_writer_kv_str_arr(w, "tokenizer.ggml.tokens", v->text, v->len, (uint64_t)v->n);
    if (st == TS_OK)
        st = ts_gguf_writer_kv_arr(w, "tokenizer.ggml.scores", TS_GGUF_F32, score, (uint64_t)v->n);
    if (st == TS_OK)
        st = ts_gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", TS_GGUF_I32, v->type,
                                   (uint64_t)v->n);
    if (st == TS_OK && unk_id >= 0)
        st = ts_gguf_writer_kv_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)unk_id);
    if (st == TS_OK) st = ts_gguf_writer_kv_bool(w, "tokenizer.ggml.add_space_prefix", false);
    if (st == TS_OK) st = write_specials(v, dir, add_bos, add_eos, w);
    free(score);
    return st;
}

ts_status qz_write_vocab(ts_gguf_writer *w, const char *dir, const char *pre, int n_vocab) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) return TS_OK;
    json_error_t err;
    vocab v = {.path = path, .n = n_vocab};
    v.root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!v.root)
        return ts_error(TS_ERR_FORMAT, "%s: line %d: %s", path, err.line, err.text);
    json_t *model = json_object_get(v.root, "model");
    json_t *type = json_object_get(model, "type");
    v.vocab = json_object_get(model, "vocab");
    v.added = json_object_get(v.root, "added_tokens");
    bool byte_level = strcmp(obj_type(json_object_get(v.root, "decoder")), "ByteLevel") == 0;
    ts_status st = TS_OK;
    if (!json_is_string(type) || strcmp(json_string_value(type), "BPE") != 0 ||
        !json_is_object(v.vocab))
        st = ts_error(TS_ERR_UNSUPPORTED, "%s: only BPE tokenizers are converted", path);
    if (st == TS_OK && v.added && !json_is_array(v.added))
        st = ts_error(TS_ERR_FORMAT, "%s: added_tokens: expected an array", path);
    if (st == TS_OK) st = fill_tokens(&v);
    if (st == TS_OK && !byte_level) {
        st = write_spm(&v, dir, w);
        vocab_free(&v);
        return st;
    }
    if (st == TS_OK) st = ts_gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2");
    if (st == TS_OK) st = ts_gguf_writer_kv_str(w, "tokenizer.ggml.pre", pre);
    if (st == TS_OK)
        st = ts_gguf_writer_kv_str_arr(w, "tokenizer.ggml.tokens", v.text, v.len,
                                       (uint64_t)v.n);
    if (st == TS_OK)
        st = ts_gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", TS_GGUF_I32, v.type,
                                   (uint64_t)v.n);
    if (st == TS_OK) st = write_merges(&v, w);
    if (st == TS_OK) st = write_specials(&v, dir, false, false, w);
    vocab_free(&v);
    return st;
}
