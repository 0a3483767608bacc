/* The public tokenizer: the byte-level BPE of tokenizer.json or of a GGUF ("gpt2" model), or
 * the SentencePiece-style BPE of a GGUF ("llama" model); their streaming detokenizer; and chat
 * rendering turned into ids (control segments -> special ids, text -> plain encoding).
 *
 * BOS: ts_tokenize prepends the BOS id when a GGUF says tokenizer.ggml.add_bos_token (Gemma),
 * and appends the EOS id when it says tokenizer.ggml.add_eos_token (EmbeddingGemma: an
 * embedding model's input ends with it); a tokenizer.json says the same by its post-processor's
 * template ("<bos> $A", "<bos> $A <eos>"; Qwen's adds nothing) - transformers (5.x) ignores
 * tokenizer_config.json's add_bos_token / add_eos_token where a tokenizer.json exists. Chat
 * formats write their own `<bos>`, so ts_chat_tokenize never adds another. */
#include "base/mmapfile.h"
#include "format/gguf.h"
#include "text/bpe.h"
#include "text/chat.h"
#include "text/spm.h"
#include "text/utf8.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TOK_MAX_EOG 8

typedef enum { TOK_CHAT_NONE, TOK_CHAT_QWEN, TOK_CHAT_GEMMA } tok_chat;

struct ts_tokenizer {
    ts_bpe *bpe; /* exactly one of bpe, spm */
    ts_spm *spm;
    int32_t eog[TOK_MAX_EOG];
    int n_eog;
    int32_t bos; /* -1 = none */
    bool add_bos;
    int32_t eos; /* appended by ts_tokenize where add_eos */
    bool add_eos;
    tok_chat chat;
    bool thinking_default; /* the chat template's default for enable_thinking */
    ts_fim_tokens fim;
};

struct ts_detokenizer {
    ts_detok *d;
};

/* The 0.8B/2B templates open a thinking block only when enable_thinking is true; the larger
 * ones unless it is false. Read that from the template text when the file is there. */
static bool read_thinking_default(const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/tokenizer_config.json", dir) >= (int)sizeof path)
        return false; /* ts_tokenizer_open refuses such paths first */
    char *buf;
    size_t len;
    if (ts_read_file(path, 16u << 20, &buf, &len) != TS_OK) return false;
    bool on = strstr(buf, "enable_thinking is false") && !strstr(buf, "enable_thinking is true");
    free(buf);
    return on;
}

static bool thinking_default_in(const char *template_text) {
    return strstr(template_text, "enable_thinking is false") &&
           !strstr(template_text, "enable_thinking is true");
}

static int32_t tok_id(const ts_tokenizer *t, const char *text) {
    return t->spm ? ts_spm_token_id(t->spm, text) : ts_bpe_token_id(t->bpe, text);
}

static void add_eog(ts_tokenizer *t, int32_t id) {
    if (id < 0 || id >= ts_tokenizer_vocab_size(t) || t->n_eog == TOK_MAX_EOG) return;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return;
    t->eog[t->n_eog++] = id;
}

/* The end-of-generation ids a Hugging Face directory names: generation_config.json's
 * eos_token_id (an id or a list: Gemma 3 gives [1, 106]). */
static void add_eog_from_generation_config(ts_tokenizer *t, const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/generation_config.json", dir) >= (int)sizeof path) return;
    json_t *root = json_load_file(path, 0, NULL); /* optional */
    json_t *eos = json_object_get(root, "eos_token_id");
    size_t i;
    json_t *v;
    if (json_is_integer(eos)) add_eog(t, (int32_t)json_integer_value(eos));
    json_array_foreach(eos, i, v) {
        if (json_is_integer(v)) add_eog(t, (int32_t)json_integer_value(v));
    }
    json_decref(root);
}

/* The fill-in-the-middle tokens: each one's GGUF key and Qwen spelling, in ts_fim_tokens'
 * order (FIM_SLOTS of them). */
#define FIM_SLOTS 6
static const struct {
    const char *key, *name;
} fim_tokens[FIM_SLOTS] = {{"tokenizer.ggml.fim_pre_token_id", "<|fim_prefix|>"},
                           {"tokenizer.ggml.fim_suf_token_id", "<|fim_suffix|>"},
                           {"tokenizer.ggml.fim_mid_token_id", "<|fim_middle|>"},
                           {"tokenizer.ggml.fim_pad_token_id", "<|fim_pad|>"},
                           {"tokenizer.ggml.fim_rep_token_id", "<|repo_name|>"},
                           {"tokenizer.ggml.fim_sep_token_id", "<|file_sep|>"}};

static void fim_slots(ts_tokenizer *t, int32_t *slot[FIM_SLOTS]) {
    int32_t *all[FIM_SLOTS] = {&t->fim.prefix, &t->fim.suffix, &t->fim.middle,
                               &t->fim.pad,    &t->fim.repo,   &t->fim.file_sep};
    memcpy(slot, all, sizeof all);
}

/* A GGUF's fill-in-the-middle ids; the spelled ones (fim_by_content) fill the rest. */
static ts_status gguf_fim(ts_tokenizer *t, const ts_gguf *g) {
    int32_t *slot[FIM_SLOTS];
    fim_slots(t, slot);
    for (int i = 0; i < FIM_SLOTS; i++) {
        uint32_t id;
        TS_TRY(ts_gguf_get_u32_opt(g, fim_tokens[i].key, UINT32_MAX, &id));
        if (id < (uint32_t)ts_tokenizer_vocab_size(t)) *slot[i] = (int32_t)id;
    }
    return TS_OK;
}

static void fim_by_content(ts_tokenizer *t) {
    int32_t *slot[FIM_SLOTS];
    fim_slots(t, slot);
    for (int i = 0; i < FIM_SLOTS; i++)
        if (*slot[i] < 0) *slot[i] = tok_id(t, fim_tokens[i].name);
}

/* The end-of-generation tokens the chat formats know, by content. */
static void add_eog_by_content(ts_tokenizer *t) {
    static const char *const names[] = {"<|im_end|>", "<|endoftext|>", "<end_of_turn>"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        add_eog(t, tok_id(t, names[i]));
}

static bool has_gguf_magic(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[4] = {0};
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    return got == 4 && memcmp(magic, "GGUF", 4) == 0;
}

/* A directory without tokenizer.json but with exactly one .gguf file means that file. */
static bool find_single_gguf(const char *dir, char *file, size_t cap) {
    DIR *d = opendir(dir);
    if (!d) return false;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n > 5 && strcmp(e->d_name + n - 5, ".gguf") == 0) {
            if (found++ == 0) snprintf(file, cap, "%s/%s", dir, e->d_name);
        }
    }
    closedir(d);
    return found == 1;
}

/* llama.cpp's pre-tokenizer names for byte-level BPE vocabularies, as the split regexes of the
 * tokenizer.json they come from. qwen2/qwen35 keep the (?i:...) contractions and the NFC
 * normalizer of the Qwen tokenizer.json files (llama.cpp spells the contractions out and skips
 * NFC; the two differ only on non-NFC text and on "'ſ"-like case folds). */
static const char tok_re_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char tok_re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char tok_re_qwen35[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}"
    "\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT: four splits one after another. */
static const char *const tok_re_default[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "\\p{N}+",
    "[0-9][0-9][0-9]",
};

/* Reads tokenizer.ggml.{tokens,scores,token_type,unknown_token_id,add_space_prefix}. */
static ts_status spm_from_gguf(const ts_gguf *g, ts_spm **out) {
    *out = NULL;
    const char *path = ts_gguf_path(g);
    static const char key[] = "tokenizer.ggml.tokens";
    int64_t ki = ts_gguf_find_key(g, key);
    ts_gguf_value v;
    if (ki < 0) return ts_error(TS_ERR_FORMAT, "%s: key '%s': missing", path, key);
    TS_TRY(ts_gguf_kv_value(g, ki, &v));
    if (v.type != TS_GGUF_ARR || v.elem != TS_GGUF_STR || v.n == 0 || v.n >= (1u << 30))
        return ts_error(TS_ERR_FORMAT, "%s: key '%s': expected a non-empty string array", path,
                        key);
    size_t n = (size_t)v.n;
    const char **text = malloc(n * sizeof *text);
    size_t *len = malloc(n * sizeof *len);
    float *scores = calloc(n, sizeof *scores);
    int32_t *types = malloc(n * sizeof *types);
    ts_status st =
        text && len && scores && types ? TS_OK : ts_error(TS_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; st == TS_OK && i < n; i++)
        st = ts_gguf_kv_str_item(g, ki, i, &text[i], &len[i]);
    uint64_t m = 0;
    if (st == TS_OK && ts_gguf_has(g, "tokenizer.ggml.scores")) {
        st = ts_gguf_get_arr_f32(g, "tokenizer.ggml.scores", scores, n, &m);
        if (st == TS_OK && m != n)
            st = ts_error(TS_ERR_FORMAT, "%s: tokenizer.ggml.scores: %llu entries for %zu tokens",
                          path, (unsigned long long)m, n);
    }
    if (st == TS_OK && ts_gguf_has(g, "tokenizer.ggml.token_type")) {
        st = ts_gguf_get_arr_i32(g, "tokenizer.ggml.token_type", types, n, &m);
        if (st == TS_OK && m != n)
            st = ts_error(TS_ERR_FORMAT,
                          "%s: tokenizer.ggml.token_type: %llu entries for %zu tokens", path,
                          (unsigned long long)m, n);
    } else {
        for (size_t i = 0; i < n; i++)
            types[i] = TS_SPM_NORMAL;
    }
    uint32_t unk = UINT32_MAX;
    bool prefix = true; /* llama.cpp's default for "llama" vocabularies */
    if (st == TS_OK) st = ts_gguf_get_u32_opt(g, "tokenizer.ggml.unknown_token_id", unk, &unk);
    if (st == TS_OK) st = ts_gguf_get_bool_opt(g, "tokenizer.ggml.add_space_prefix", true, &prefix);
    if (st == TS_OK) {
        ts_spm_spec spec = {.name = path,
                            .n_tokens = (int32_t)n,
                            .text = text,
                            .len = len,
                            .scores = scores,
                            .types = types,
                            .unk_id = unk < n ? (int32_t)unk : -1,
                            .add_space_prefix = prefix};
        st = ts_spm_build(&spec, out);
    }
    free(text);
    free(len);
    free(scores);
    free(types);
    return st;
}

static ts_status bpe_from_gguf(const ts_gguf *g, ts_bpe **out) {
    const char *path = ts_gguf_path(g);
    const char *pre;
    TS_TRY(ts_gguf_get_str_opt(g, "tokenizer.ggml.pre", "default", &pre));
    ts_bpe_spec spec = {.name = path};
    const char *one[1];
    if (strcmp(pre, "qwen2") == 0 || strcmp(pre, "qwen35") == 0) {
        one[0] = strcmp(pre, "qwen2") == 0 ? tok_re_qwen2 : tok_re_qwen35;
        spec.split_regex = one;
        spec.n_split = 1;
        spec.nfc = true;
    } else if (strcmp(pre, "gpt2") == 0) {
        one[0] = tok_re_gpt2;
        spec.split_regex = one;
        spec.n_split = 1;
    } else if (strcmp(pre, "default") == 0) {
        spec.split_regex = tok_re_default;
        spec.n_split = 4;
    } else {
        return ts_error(TS_ERR_UNSUPPORTED,
                        "%s: tokenizer.ggml.pre '%s': only qwen2, qwen35, gpt2 and default are "
                        "supported",
                        path, pre);
    }
    int64_t ki = ts_gguf_find_key(g, "tokenizer.ggml.tokens");
    int64_t mi = ts_gguf_find_key(g, "tokenizer.ggml.merges");
    ts_gguf_value tv = {0}, mv = {0};
    if (ki >= 0) TS_TRY(ts_gguf_kv_value(g, ki, &tv));
    if (mi >= 0) TS_TRY(ts_gguf_kv_value(g, mi, &mv));
    if (ki < 0 || tv.type != TS_GGUF_ARR || tv.elem != TS_GGUF_STR || tv.n == 0 ||
        tv.n >= (1u << 24))
        return ts_error(TS_ERR_FORMAT, "%s: tokenizer.ggml.tokens: expected a string array", path);
    if (mi >= 0 && (mv.type != TS_GGUF_ARR || mv.elem != TS_GGUF_STR || mv.n >= (1u << 26)))
        return ts_error(TS_ERR_FORMAT, "%s: tokenizer.ggml.merges: expected a string array", path);
    size_t n = (size_t)tv.n, nm = mi >= 0 ? (size_t)mv.n : 0;
    const char **text = malloc(n * sizeof *text), **merges = malloc((nm + 1) * sizeof *merges);
    size_t *len = malloc(n * sizeof *len), *mlen = malloc((nm + 1) * sizeof *mlen);
    int32_t *types = malloc(n * sizeof *types);
    ts_status st = text && merges && len && mlen && types
                       ? TS_OK
                       : ts_error(TS_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; st == TS_OK && i < n; i++)
        st = ts_gguf_kv_str_item(g, ki, i, &text[i], &len[i]);
    for (size_t i = 0; st == TS_OK && i < nm; i++)
        st = ts_gguf_kv_str_item(g, mi, i, &merges[i], &mlen[i]);
    uint64_t m = n;
    if (st == TS_OK && ts_gguf_has(g, "tokenizer.ggml.token_type"))
        st = ts_gguf_get_arr_i32(g, "tokenizer.ggml.token_type", types, n, &m);
    else
        for (size_t i = 0; i < n; i++)
            types[i] = 1;
    if (st == TS_OK && m != n)
        st = ts_error(TS_ERR_FORMAT, "%s: tokenizer.ggml.token_type: %llu entries for %zu tokens",
                      path, (unsigned long long)m, n);
    if (st == TS_OK) {
        spec.n_tokens = (int32_t)n;
        spec.text = text;
        spec.len = len;
        spec.types = types;
        spec.merges = merges;
        spec.merge_len = mlen;
        spec.n_merges = nm;
        st = ts_bpe_build(&spec, out);
    }
    free(text);
    free(merges);
    free(len);
    free(mlen);
    free(types);
    return st;
}

static ts_status open_gguf(ts_tokenizer *t, const char *file) {
    ts_gguf *g;
    TS_TRY(ts_gguf_open(file, &g));
    const char *model, *tmpl;
    ts_status st = ts_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL);
    if (st == TS_OK) {
        if (strcmp(model, "llama") == 0)
            st = spm_from_gguf(g, &t->spm);
        else if (strcmp(model, "gpt2") == 0)
            st = bpe_from_gguf(g, &t->bpe);
        else
            st = ts_error(TS_ERR_UNSUPPORTED,
                          "%s: tokenizer.ggml.model '%s': only llama (SentencePiece BPE) and gpt2 "
                          "(byte-level BPE) are supported",
                          file, model);
    }
    uint32_t bos = UINT32_MAX, eos = UINT32_MAX, eot = UINT32_MAX;
    bool add_bos = t->spm != NULL, add_eos = false; /* llama.cpp's defaults when absent */
    if (st == TS_OK) st = ts_gguf_get_u32_opt(g, "tokenizer.ggml.bos_token_id", bos, &bos);
    if (st == TS_OK) st = ts_gguf_get_u32_opt(g, "tokenizer.ggml.eos_token_id", eos, &eos);
    if (st == TS_OK) st = ts_gguf_get_u32_opt(g, "tokenizer.ggml.eot_token_id", eot, &eot);
    if (st == TS_OK)
        st = ts_gguf_get_bool_opt(g, "tokenizer.ggml.add_bos_token", add_bos, &add_bos);
    if (st == TS_OK)
        st = ts_gguf_get_bool_opt(g, "tokenizer.ggml.add_eos_token", add_eos, &add_eos);
    if (st == TS_OK) st = ts_gguf_get_str_opt(g, "tokenizer.chat_template", "", &tmpl);
    if (st == TS_OK) {
        int nv = ts_tokenizer_vocab_size(t);
        t->bos = bos < (uint32_t)nv ? (int32_t)bos : -1;
        t->add_bos = add_bos && t->bos >= 0;
        t->eos = eos < (uint32_t)nv ? (int32_t)eos : -1;
        t->add_eos = add_eos && t->eos >= 0;
        add_eog(t, eos < (uint32_t)nv ? (int32_t)eos : -1);
        add_eog(t, eot < (uint32_t)nv ? (int32_t)eot : -1);
        st = gguf_fim(t, g);
        /* The family's chat format: Gemma's when its turn token exists, else ChatML's. */
        if (strstr(tmpl, "<start_of_turn>") || tok_id(t, "<start_of_turn>") >= 0)
            t->chat = TOK_CHAT_GEMMA;
        else if (tok_id(t, "<|im_start|>") >= 0)
            t->chat = TOK_CHAT_QWEN;
        t->thinking_default = thinking_default_in(tmpl);
    }
    ts_gguf_close(g);
    return st;
}

ts_status ts_tokenizer_open(const char *path, ts_tokenizer **out) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return ts_error(TS_ERR_IO, "%s: no such file or directory", path);
    char file[4096], dir[4096];
    /* room for the longest name joined to it (/generation_config.json): nothing cut short */
    if (strlen(path) + 32 > sizeof file)
        return ts_error(TS_ERR_INVALID, "%.64s...: a path of %zu bytes is too long", path,
                        strlen(path));
    bool gguf = false;
    if (S_ISDIR(sb.st_mode)) {
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
        snprintf(dir, sizeof dir, "%s", path);
        struct stat fb;
        if (stat(file, &fb) != 0 && find_single_gguf(path, file, sizeof file)) gguf = true;
    } else {
        snprintf(file, sizeof file, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            strcpy(dir, ".");
        gguf = has_gguf_magic(file);
    }
    ts_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return ts_error(TS_ERR_NOMEM, "out of memory");
    t->bos = -1;
    t->fim = (ts_fim_tokens){-1, -1, -1, -1, -1, -1};
    ts_status st;
    if (gguf) {
        st = open_gguf(t, file);
    } else {
        st = ts_bpe_load(file, &t->bpe);
        if (st == TS_OK) {
            int32_t bos, eos;
            ts_bpe_post_tokens(t->bpe, &bos, &eos);
            t->bos = bos;
            t->add_bos = bos >= 0;
            t->eos = eos;
            t->add_eos = eos >= 0;
            /* Gemma's turns when its turn token exists; ChatML (Qwen3.5) otherwise. */
            t->chat = tok_id(t, "<start_of_turn>") >= 0 ? TOK_CHAT_GEMMA : TOK_CHAT_QWEN;
            t->thinking_default = read_thinking_default(dir);
            add_eog_from_generation_config(t, dir);
        }
    }
    if (st != TS_OK) {
        ts_tokenizer_free(t);
        return st;
    }
    add_eog_by_content(t);
    fim_by_content(t);
    *out = t;
    return TS_OK;
}

void ts_tokenizer_free(ts_tokenizer *t) {
    if (!t) return;
    ts_bpe_free(t->bpe);
    ts_spm_free(t->spm);
    free(t);
}

int ts_tokenizer_vocab_size(const ts_tokenizer *t) {
    return t->spm ? ts_spm_vocab_size(t->spm) : ts_bpe_vocab_size(t->bpe);
}

void ts_tokenizer_token_source(const ts_tokenizer *t, ts_token_source *src) {
    if (t->spm)
        ts_spm_token_source(t->spm, src);
    else
        ts_bpe_token_source(t->bpe, src);
}

const char *ts_tokenizer_token_bytes(const ts_tokenizer *t, int32_t id, size_t *len) {
    *len = 0;
    return t->spm ? ts_spm_token_bytes(t->spm, id, len) : ts_bpe_token_bytes(t->bpe, id, len);
}

bool ts_tokenizer_chat_tools(const ts_tokenizer *t) { return t->chat == TOK_CHAT_QWEN; }

bool ts_tokenizer_is_eog(const ts_tokenizer *t, int32_t id) {
    for (int i = 0; id >= 0 && i < t->n_eog; i++)
        if (t->eog[i] == id) return true;
    return false;
}

static ts_status tok_encode(const ts_tokenizer *t, const char *text, size_t len, bool parse_special,
                            ts_ids *out) {
    return t->spm ? ts_spm_encode(t->spm, text, len, parse_special, out)
                  : ts_bpe_encode(t->bpe, text, len, parse_special, out);
}

static ts_status tokenize(const ts_tokenizer *t, const char *text, size_t len, bool parse_special,
                          bool add_special, int32_t **ids, size_t *n_ids) {
    ts_ids v = {0};
    *ids = NULL;
    *n_ids = 0;
    ts_status st = add_special && t->add_bos ? ts_ids_push(&v, t->bos) : TS_OK;
    if (st == TS_OK) st = tok_encode(t, text, len, parse_special, &v);
    if (st == TS_OK && add_special && t->add_eos) st = ts_ids_push(&v, t->eos);
    if (st != TS_OK) {
        ts_ids_free(&v);
        return st;
    }
    *ids = v.data ? v.data : calloc(1, sizeof(int32_t));
    *n_ids = v.len;
    return *ids ? TS_OK : ts_error(TS_ERR_NOMEM, "out of memory");
}

ts_status ts_tokenize(const ts_tokenizer *t, const char *text, size_t len, bool parse_special,
                      int32_t **ids, size_t *n_ids) {
    return tokenize(t, text, len, parse_special, true, ids, n_ids);
}

ts_status ts_tokenize_bare(const ts_tokenizer *t, const char *text, size_t len, bool parse_special,
                           int32_t **ids, size_t *n_ids) {
    return tokenize(t, text, len, parse_special, false, ids, n_ids);
}

bool ts_tokenizer_fim(const ts_tokenizer *t, ts_fim_tokens *out) {
    *out = t->fim;
    return t->fim.prefix >= 0 && t->fim.suffix >= 0 && t->fim.middle >= 0;
}

/* Appends text to v, encoded without special parsing (NULL: nothing). */
static ts_status encode_text(const ts_tokenizer *t, const char *s, size_t n, ts_ids *v) {
    return s && n ? tok_encode(t, s, n, false, v) : TS_OK;
}

/* Appends a line of the repo-level pattern: the token tok, then name (NULL: none) and a
 * newline, encoded as one text. */
static ts_status name_line(const ts_tokenizer *t, int32_t tok, const char *name, size_t n,
                           ts_ids *v) {
    TS_TRY(ts_ids_push(v, tok));
    char *s = malloc(n + 2);
    if (!s) return ts_error(TS_ERR_NOMEM, "out of memory");
    if (n) memcpy(s, name, n);
    s[n] = '\n';
    ts_status st = encode_text(t, s, n + 1, v);
    free(s);
    return st;
}

/* The fill-in-the-middle frame of f (ts_tokenize_fim_frame), the prefix as ids where
 * prefix_ids is not NULL. */
static ts_status fim_frame(const ts_tokenizer *t, const ts_fim_frame *f, const int32_t *prefix_ids,
                           size_t n_prefix_ids, ts_ids *v, size_t *n_context) {
    ts_fim_tokens k;
    if (!ts_tokenizer_fim(t, &k))
        return ts_error(TS_ERR_UNSUPPORTED, "this model's vocabulary has no fill-in-the-middle "
                                            "tokens");
    ts_status st = t->add_bos ? ts_ids_push(v, t->bos) : TS_OK;
    bool repo = k.repo >= 0 && k.file_sep >= 0, files = f->n_files > 0;
    if (st == TS_OK && repo && files)
        st = name_line(t, k.repo, f->repo, f->repo ? strlen(f->repo) : 0, v);
    static const char snippet[] = "\n\n--- snippet ---\n\n";
    for (int i = 0; i < f->n_files && st == TS_OK; i++) {
        const ts_fim_file *x = &f->files[i];
        st = repo ? name_line(t, k.file_sep, x->name, x->name_len, v)
                  : encode_text(t, snippet, sizeof snippet - 1, v);
        if (st == TS_OK) st = encode_text(t, x->text, x->text_len, v);
    }
    if (st == TS_OK && repo && files)
        st = name_line(t, k.file_sep, f->file, f->file ? strlen(f->file) : 0, v);
    if (n_context) *n_context = v->len;
    if (st == TS_OK) st = ts_ids_push(v, k.prefix);
    if (prefix_ids)
        for (size_t i = 0; i < n_prefix_ids && st == TS_OK; i++)
            st = ts_ids_push(v, prefix_ids[i]);
    else if (st == TS_OK)
        st = encode_text(t, f->prefix, f->prefix_len, v);
    if (st == TS_OK) st = ts_ids_push(v, k.suffix);
    if (st == TS_OK) st = encode_text(t, f->suffix, f->suffix_len, v);
    if (st == TS_OK) st = ts_ids_push(v, k.middle);
    if (st == TS_OK) st = encode_text(t, f->middle, f->middle_len, v);
    return st;
}

static ts_status fim_done(ts_status st, ts_ids *v, int32_t **ids, size_t *n_ids) {
    if (st != TS_OK) {
        ts_ids_free(v);
        return st;
    }
    *ids = v->data;
    *n_ids = v->len;
    return TS_OK;
}

ts_status ts_tokenize_fim(const ts_tokenizer *t, const char *prefix, size_t prefix_len,
                          const int32_t *prefix_ids, size_t n_prefix_ids, const char *suffix,
                          size_t suffix_len, int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    ts_fim_frame f = {
        .prefix = prefix, .prefix_len = prefix_len, .suffix = suffix, .suffix_len = suffix_len};
    ts_ids v = {0};
    return fim_done(fim_frame(t, &f, prefix_ids, n_prefix_ids, &v, NULL), &v, ids, n_ids);
}

ts_status ts_tokenize_fim_frame(const ts_tokenizer *t, const ts_fim_frame *f, int32_t **ids,
                                size_t *n_ids, size_t *n_context) {
    *ids = NULL;
    *n_ids = 0;
    ts_ids v = {0};
    return fim_done(fim_frame(t, f, NULL, 0, &v, n_context), &v, ids, n_ids);
}

ts_status ts_detokenize(const ts_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                        char **text, size_t *len) {
    return t->spm ? ts_spm_decode(t->spm, ids, n, skip_special, text, len)
                  : ts_bpe_decode(t->bpe, ids, n, skip_special, text, len);
}

ts_status ts_detokenizer_create(const ts_tokenizer *t, bool skip_special, ts_detokenizer **out) {
    *out = NULL;
    ts_detokenizer *d = calloc(1, sizeof *d);
    if (!d) return ts_error(TS_ERR_NOMEM, "out of memory");
    ts_token_source src;
    if (t->spm)
        ts_spm_token_source(t->spm, &src);
    else
        ts_bpe_token_source(t->bpe, &src);
    ts_status st = ts_detok_create(&src, skip_special, &d->d);
    if (st != TS_OK) {
        free(d);
        return st;
    }
    *out = d;
    return TS_OK;
}

void ts_detokenizer_free(ts_detokenizer *d) {
    if (!d) return;
    ts_detok_free(d->d);
    free(d);
}

ts_status ts_detokenizer_push(ts_detokenizer *d, int32_t id, const char **text, size_t *len) {
    return ts_detok_push(d->d, id, text, len);
}

ts_status ts_detokenizer_flush(ts_detokenizer *d, const char **text, size_t *len) {
    return ts_detok_flush(d->d, text, len);
}

bool ts_detokenizer_mid_char(const ts_detokenizer *d) { return ts_detok_mid_char(d->d); }

static ts_status role_of(const char *name, int i, ts_chat_role *out) {
    static const struct {
        const char *name;
        ts_chat_role role;
    } roles[] = {{"system", TS_ROLE_SYSTEM},
                 {"user", TS_ROLE_USER},
                 {"assistant", TS_ROLE_ASSISTANT},
                 {"tool", TS_ROLE_TOOL}};
    for (size_t k = 0; name && k < sizeof roles / sizeof roles[0]; k++)
        if (strcmp(name, roles[k].name) == 0) {
            *out = roles[k].role;
            return TS_OK;
        }
    return ts_error(TS_ERR_INVALID, "message %d: unknown role '%s'", i, name ? name : "(null)");
}

/* Whether segments k, k + 1, k + 2 are the template's wrapper of a video */
static bool video_wrapper(const ts_chat_out *out, int k) {
    static const char *w[3] = {"<|vision_start|>", "<|video_pad|>", "<|vision_end|>"};
    if (k + 2 >= out->n_segs) return false;
    for (int j = 0; j < 3; j++) {
        const ts_chat_seg *g = &out->segs[k + j];
        if (g->kind != TS_CHAT_SEG_CONTROL || g->len != strlen(w[j]) ||
            memcmp(out->text + g->off, w[j], g->len) != 0)
            return false;
    }
    return true;
}

/* A video's wrapper as the Qwen3-VL processor rewrites it: each step "<S seconds>" (joined to
 * the text before the wrapper, pre bytes of it, for the first: the processor's prompt is one
 * string), vision_start, its video tokens, vision_end */
static ts_status put_video(const ts_tokenizer *t, const ts_chat_video *vd, const char *pre,
                           size_t n_pre, ts_ids *v) {
    int32_t vs = tok_id(t, "<|vision_start|>"), vp = tok_id(t, "<|video_pad|>"),
            ve = tok_id(t, "<|vision_end|>");
    if (vs < 0 || vp < 0 || ve < 0)
        return ts_error(TS_ERR_UNSUPPORTED, "the tokenizer has no video tokens");
    if (vd->n_steps < 1 || vd->step_tokens < 1 || !vd->seconds)
        return ts_error(TS_ERR_INVALID, "a video of %d steps of %d tokens", vd->n_steps,
                        vd->step_tokens);
    for (int s = 0; s < vd->n_steps; s++) {
        char stamp[64];
        int l = snprintf(stamp, sizeof stamp, "<%.1f seconds>", vd->seconds[s]);
        if (l < 0 || (size_t)l >= sizeof stamp || !isfinite(vd->seconds[s]))
            return ts_error(TS_ERR_INVALID, "a video step at %g seconds", vd->seconds[s]);
        size_t n = (s == 0 ? n_pre : 0) + (size_t)l;
        char *txt = malloc(n);
        if (!txt) return ts_error(TS_ERR_NOMEM, "out of memory");
        if (s == 0 && n_pre) memcpy(txt, pre, n_pre);
        memcpy(txt + n - l, stamp, (size_t)l);
        ts_status st = tok_encode(t, txt, n, false, v);
        free(txt);
        TS_TRY(st);
        TS_TRY(ts_ids_push(v, vs));
        for (int k = 0; k < vd->step_tokens; k++)
            TS_TRY(ts_ids_push(v, vp));
        TS_TRY(ts_ids_push(v, ve));
    }
    return TS_OK;
}

ts_status ts_chat_tokenize(const ts_tokenizer *t, const ts_chat_message *msgs, int n,
                           const ts_chat_params *p, int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (n < 0 || (n > 0 && !msgs)) return ts_error(TS_ERR_INVALID, "no messages");
    ts_chat_msg *cm = calloc((size_t)(n > 0 ? n : 1), sizeof *cm);
    if (!cm) return ts_error(TS_ERR_NOMEM, "out of memory");
    /* the public tool call and the renderer's have the same fields; copied, not cast */
    int n_calls = 0, n_parts = 0;
    for (int i = 0; i < n; i++) {
        if (msgs[i].n_tool_calls > 0) n_calls += msgs[i].n_tool_calls;
        if (!msgs[i].content && msgs[i].n_parts > 0) n_parts += msgs[i].n_parts;
    }
    ts_chat_tool_call *calls = calloc((size_t)(n_calls > 0 ? n_calls : 1), sizeof *calls);
    ts_chat_part *parts = calloc((size_t)(n_parts > 0 ? n_parts : 1), sizeof *parts);
    if (!calls || !parts) {
        free(calls);
        free(parts);
        free(cm);
        return ts_error(TS_ERR_NOMEM, "out of memory");
    }
    ts_status st = TS_OK;
    for (int i = 0, c = 0; i < n && st == TS_OK; i++) { /* content as a list of parts */
        if (msgs[i].content || msgs[i].n_parts <= 0) continue;
        if (!msgs[i].parts) {
            st = ts_error(TS_ERR_INVALID, "message %d: bad content part list", i);
            break;
        }
        cm[i].parts = parts + c;
        cm[i].n_parts = msgs[i].n_parts;
        for (int k = 0; k < msgs[i].n_parts; k++, c++)
            parts[c] = msgs[i].parts[k].text ? (ts_chat_part){TS_PART_TEXT, msgs[i].parts[k].text}
                       : msgs[i].parts[k].video ? (ts_chat_part){TS_PART_VIDEO, NULL}
                                                : (ts_chat_part){TS_PART_IMAGE, NULL};
    }
    for (int i = 0, c = 0; i < n && st == TS_OK; i++) {
        st = role_of(msgs[i].role, i, &cm[i].role);
        cm[i].content = msgs[i].content ? msgs[i].content : cm[i].parts ? NULL : "";
        cm[i].reasoning_content = msgs[i].reasoning_content;
        if (msgs[i].n_tool_calls < 0 || (msgs[i].n_tool_calls > 0 && !msgs[i].tool_calls)) {
            st = ts_error(TS_ERR_INVALID, "message %d: bad tool call list", i);
            break;
        }
        cm[i].tool_calls = calls + c;
        cm[i].n_tool_calls = msgs[i].n_tool_calls;
        for (int k = 0; k < msgs[i].n_tool_calls; k++, c++)
            calls[c] = (ts_chat_tool_call){msgs[i].tool_calls[k].name,
                                           msgs[i].tool_calls[k].arguments_json};
    }
    ts_chat_opts o;
    ts_chat_opts_default(&o);
    o.add_generation_prompt = p ? p->add_generation_prompt : true;
    o.enable_thinking = p ? p->enable_thinking : -1;
    o.tools_json = p ? p->tools_json : NULL;
    o.thinking_default = t->thinking_default;
    o.continue_final = p && p->continue_final;
    ts_chat_out out = {0};
    if (st == TS_OK && t->chat == TOK_CHAT_NONE)
        st = ts_error(TS_ERR_UNSUPPORTED, "this tokenizer's chat format is not known (neither "
                                          "ChatML nor Gemma tokens)");
    if (st == TS_OK)
        st = t->chat == TOK_CHAT_GEMMA ? ts_chat_render_gemma(cm, n, &o, &out)
                                       : ts_chat_render(cm, n, &o, &out);
    ts_ids v = {0};
    int n_images = p ? p->n_images : 0, image = 0;
    int n_videos = p ? p->n_videos : 0, video = 0;
    if (n_images < 0 || (n_images > 0 && !p->image_tokens))
        st = ts_error(TS_ERR_INVALID, "bad image token counts");
    if (n_videos < 0 || (n_videos > 0 && !p->videos))
        st = ts_error(TS_ERR_INVALID, "bad video list");
    const char *pre = NULL; /* text held back to join a video's first step */
    size_t n_pre = 0;
    for (int s = 0; st == TS_OK && s < out.n_segs; s++) {
        const ts_chat_seg *seg = &out.segs[s];
        if (seg->kind == TS_CHAT_SEG_TEXT && video_wrapper(&out, s + 1)) {
            pre = out.text + seg->off, n_pre = seg->len;
            continue;
        }
        if (video_wrapper(&out, s)) {
            if (video >= n_videos) {
                st = ts_error(TS_ERR_INVALID, "video %d of the conversation: no steps given for it",
                              video);
                break;
            }
            st = put_video(t, &p->videos[video++], pre, n_pre, &v);
            pre = NULL, n_pre = 0, s += 2;
            continue;
        }
        if (seg->kind == TS_CHAT_SEG_CONTROL) {
            char tok[64];
            size_t l = seg->len < sizeof tok - 1 ? seg->len : sizeof tok - 1;
            memcpy(tok, out.text + seg->off, l);
            tok[l] = 0;
            int32_t id = tok_id(t, tok);
            /* an image's one token of the template becomes the tokens its plan takes */
            int copies = 1;
            if (!strcmp(tok, "<|image_pad|>") || !strcmp(tok, "<start_of_image>")) {
                if (image >= n_images || p->image_tokens[image] < 1) {
                    st = ts_error(TS_ERR_INVALID,
                                  "image %d of the conversation: no token count "
                                  "given for it",
                                  image);
                    break;
                }
                if (!strcmp(tok, "<start_of_image>")) {
                    st = ts_error(TS_ERR_UNSUPPORTED, "images in the Gemma chat format are not "
                                                      "supported");
                    break;
                }
                copies = p->image_tokens[image++];
            }
            if (id < 0)
                st = ts_error(TS_ERR_UNSUPPORTED,
                              "the tokenizer has no token '%s' that the chat "
                              "format needs",
                              tok);
            for (int k = 0; st == TS_OK && k < copies; k++)
                st = ts_ids_push(&v, id);
        } else {
            st = tok_encode(t, out.text + seg->off, seg->len, false, &v);
        }
    }
    if (st == TS_OK && image != n_images)
        st = ts_error(TS_ERR_INVALID, "%d image token counts given for %d image(s)", n_images,
                      image);
    if (st == TS_OK && video != n_videos)
        st =
            ts_error(TS_ERR_INVALID, "%d videos given for %d in the conversation", n_videos, video);
    ts_chat_out_free(&out);
    free(calls);
    free(parts);
    free(cm);
    if (st != TS_OK) {
        ts_ids_free(&v);
        return st;
    }
    *ids = v.data ? v.data : calloc(1, sizeof(int32_t));
    *n_ids = v.len;
    return TS_OK;
}
