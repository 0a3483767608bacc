/* The public tokenizer: the byte-level BPE of tokenizer.json, its streaming detokenizer, and
 * chat rendering turned into ids (control segments -> special ids, text -> plain encoding). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/mmapfile.h"
#include "text/bpe.h"
#include "text/chat.h"
#include "text/utf8.h"

struct ts_tokenizer {
    ts_bpe *bpe;
    int32_t eog[2];
    bool thinking_default; /* the chat template's default for enable_thinking */
};

struct ts_detokenizer {
    ts_detok *d;
};

/* The 0.8B/2B templates open a thinking block only when enable_thinking is true; the larger
 * ones unless it is false. Read that from the template text when the file is there. */
static bool read_thinking_default(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    char *buf;
    size_t len;
    if (ts_read_file(path, 16u << 20, &buf, &len) != TS_OK) return false;
    bool on = strstr(buf, "enable_thinking is false") && !strstr(buf, "enable_thinking is true");
    free(buf);
    return on;
}

ts_status ts_tokenizer_open(const char *path, ts_tokenizer **out) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return ts_error(TS_ERR_IO, "%s: no such file or directory", path);
    char file[4096], dir[4096];
    if (S_ISDIR(sb.st_mode)) {
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
        snprintf(dir, sizeof dir, "%s", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            strcpy(dir, ".");
    }
    ts_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return ts_error(TS_ERR_NOMEM, "out of memory");
    ts_status st = ts_bpe_load(file, &t->bpe);
    if (st != TS_OK) {
        free(t);
        return st;
    }
    t->eog[0] = ts_bpe_token_id(t->bpe, "<|im_end|>");
    t->eog[1] = ts_bpe_token_id(t->bpe, "<|endoftext|>");
    t->thinking_default = read_thinking_default(dir);
    *out = t;
    return TS_OK;
}

void ts_tokenizer_free(ts_tokenizer *t) {
    if (!t) return;
    ts_bpe_free(t->bpe);
    free(t);
}

int ts_tokenizer_vocab_size(const ts_tokenizer *t) { return ts_bpe_vocab_size(t->bpe); }

bool ts_tokenizer_is_eog(const ts_tokenizer *t, int32_t id) {
    return id >= 0 && (id == t->eog[0] || id == t->eog[1]);
}

ts_status ts_tokenize(const ts_tokenizer *t, const char *text, size_t len, bool parse_special,
                      int32_t **ids, size_t *n_ids) {
    ts_ids v = {0};
    *ids = NULL;
    *n_ids = 0;
    ts_status st = ts_bpe_encode(t->bpe, text, len, parse_special, &v);
    if (st != TS_OK) {
        ts_ids_free(&v);
        return st;
    }
    *ids = v.data ? v.data : calloc(1, sizeof(int32_t));
    *n_ids = v.len;
    return *ids ? TS_OK : ts_error(TS_ERR_NOMEM, "out of memory");
}

ts_status ts_detokenize(const ts_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                        char **text, size_t *len) {
    return ts_bpe_decode(t->bpe, ids, n, skip_special, text, len);
}

ts_status ts_detokenizer_create(const ts_tokenizer *t, bool skip_special, ts_detokenizer **out) {
    *out = NULL;
    ts_detokenizer *d = calloc(1, sizeof *d);
    if (!d) return ts_error(TS_ERR_NOMEM, "out of memory");
    ts_token_source src;
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

ts_status ts_chat_tokenize(const ts_tokenizer *t, const ts_chat_message *msgs, int n,
                           const ts_chat_params *p, int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (n < 0 || (n > 0 && !msgs)) return ts_error(TS_ERR_INVALID, "no messages");
    ts_chat_msg *cm = calloc((size_t)(n > 0 ? n : 1), sizeof *cm);
    if (!cm) return ts_error(TS_ERR_NOMEM, "out of memory");
    ts_status st = TS_OK;
    for (int i = 0; i < n && st == TS_OK; i++) {
        st = role_of(msgs[i].role, i, &cm[i].role);
        cm[i].content = msgs[i].content ? msgs[i].content : "";
        cm[i].reasoning_content = msgs[i].reasoning_content;
    }
    ts_chat_opts o;
    ts_chat_opts_default(&o);
    o.add_generation_prompt = p ? p->add_generation_prompt : true;
    o.enable_thinking = p ? p->enable_thinking : -1;
    o.thinking_default = t->thinking_default;
    ts_chat_out out = {0};
    if (st == TS_OK) st = ts_chat_render(cm, n, &o, &out);
    ts_ids v = {0};
    for (int s = 0; st == TS_OK && s < out.n_segs; s++) {
        const ts_chat_seg *seg = &out.segs[s];
        if (seg->kind == TS_CHAT_SEG_CONTROL) {
            char tok[64];
            size_t l = seg->len < sizeof tok - 1 ? seg->len : sizeof tok - 1;
            memcpy(tok, out.text + seg->off, l);
            tok[l] = 0;
            int32_t id = ts_bpe_token_id(t->bpe, tok);
            if (id < 0)
                st = ts_error(TS_ERR_UNSUPPORTED, "the tokenizer has no token '%s' that the chat "
                              "format needs", tok);
            else
                st = ts_ids_push(&v, id);
        } else {
            st = ts_bpe_encode(t->bpe, out.text + seg->off, seg->len, false, &v);
        }
    }
    ts_chat_out_free(&out);
    free(cm);
    if (st != TS_OK) {
        ts_ids_free(&v);
        return st;
    }
    *ids = v.data ? v.data : calloc(1, sizeof(int32_t));
    *n_ids = v.len;
    return TS_OK;
}
