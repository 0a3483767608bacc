/* Loading and validating tokenizer.json for the BPE tokenizer (see bpe.h): byte-level files
 * (GPT-2, Qwen) and SentencePiece conversions (Gemma: characters with byte fallback).
 *
 * Everything that HF's tokenizer would treat differently from what bpe.c implements is
 * refused here with TS_ERR_UNSUPPORTED naming the JSON field; malformed or inconsistent files
 * (a merge naming an unknown token, an id used twice) give TS_ERR_FORMAT.
 *
 * Regex fidelity: HF compiles the pre-tokenizer pattern with Oniguruma, we with PCRE2 (UTF +
 * UCP). Oniguruma's \s is Unicode White_Space; PCRE2's also matches U+180E, so \s and \S are
 * rewritten to \p{White_Space} and \P{White_Space}. Escapes whose meaning differs more (\w,
 * \b, \h, ...) are refused. Categories follow PCRE2's Unicode tables, which may be older than
 * HF's (code points assigned later count as unassigned here). */
#include "base/status.h"
#include "text/bpe_int.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

/* ---- byte-level alphabet ------------------------------------------------------------------- */

static int bpe_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return bpe_byte_to_cp((uint8_t)cp) == cp ? (int)cp : -1;
    if (cp <= 0x120) return (int)(cp - 0x100);
    if (cp <= 0x142) return (int)(0x7F + cp - 0x121);
    if (cp == 0x143) return 0xAD;
    return -1;
}

bool bpe_spelling_to_bytes(const char *s, size_t n, char *out, size_t *out_len) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        size_t len;
        if (ts_utf8_next(s + i, n - i, &cp, &len) != TS_UTF8_CHAR) return false;
        int b = bpe_cp_to_byte(cp);
        if (b < 0) return false;
        out[o++] = (char)b;
        i += len;
    }
    *out_len = o;
    return true;
}

size_t bpe_bytes_to_spelling(const uint8_t *p, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += ts_utf8_encode(bpe_byte_to_cp(p[i]), out + o);
    return o;
}

/* ---- hashing -------------------------------------------------------------------------------- */

static size_t bpe_table_size(size_t n) {
    size_t size = 16;
    while (size < 2 * n)
        size *= 2;
    return size;
}

int32_t bpe_vocab_find(const ts_bpe *t, const char *key, size_t n) {
    if (!t->vocab_slots) return -1;
    size_t i = bpe_hash(key, n) & t->vocab_mask;
    for (;;) {
        int32_t id = t->vocab_slots[i];
        if (id < 0) return -1;
        if (t->key_len[id] == n && memcmp(t->keys + t->key_off[id], key, n) == 0) return id;
        i = (i + 1) & t->vocab_mask;
    }
}

/* ---- loading: file and JSON helpers -------------------------------------------------------- */

static ts_status bpe_read_file(const char *path, char **buf, size_t *n) {
    *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return ts_error(TS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return ts_error(TS_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size > TS_BPE_MAX_FILE_BYTES) {
        fclose(f);
        return ts_error(TS_ERR_RANGE, "%s: %lld bytes, more than the %u accepted for a tokenizer",
                        path, (long long)sb.st_size, TS_BPE_MAX_FILE_BYTES);
    }
    size_t size = (size_t)sb.st_size;
    char *p = malloc(size + 1);
    if (!p) {
        fclose(f);
        return ts_error(TS_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t got = fread(p, 1, size, f);
    fclose(f);
    if (got != size) {
        free(p);
        return ts_error(TS_ERR_IO, "%s: short read (%zu of %zu bytes)", path, got, size);
    }
    *buf = p;
    *n = size;
    return TS_OK;
}

static bool bpe_null(const json_t *v) { return !v || json_is_null(v); }

/* Reads an optional boolean field; absent or null gives dflt. */
static ts_status bpe_bool(const ts_bpe *t, const json_t *obj, const char *where, const char *name,
                          bool dflt, bool *out) {
    const json_t *v = json_object_get(obj, name);
    if (bpe_null(v)) {
        *out = dflt;
        return TS_OK;
    }
    if (!json_is_boolean(v))
        return ts_error(TS_ERR_FORMAT, "%s: %s.%s: expected true or false", t->path, where, name);
    *out = json_is_true(v);
    return TS_OK;
}

static const char *bpe_type(const json_t *obj) {
    const json_t *v = json_object_get(obj, "type");
    return json_is_string(v) ? json_string_value(v) : "";
}

/* An optional string field that must be absent, null or "". */
static ts_status bpe_empty_string(const ts_bpe *t, const json_t *obj, const char *where,
                                  const char *name) {
    const json_t *v = json_object_get(obj, name);
    if (bpe_null(v) || (json_is_string(v) && json_string_length(v) == 0)) return TS_OK;
    return ts_error(TS_ERR_UNSUPPORTED, "%s: %s.%s: only null or \"\" is supported", t->path, where,
                    name);
}

/* ---- loading: model.vocab and model.merges ------------------------------------------------- */

static ts_status bpe_id_value(const ts_bpe *t, const json_t *v, const char *where, int32_t *id) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= BPE_MAX_ID)
        return ts_error(TS_ERR_FORMAT, "%s: %s: id must be an integer in [0, %d)", t->path, where,
                        BPE_MAX_ID);
    *id = (int32_t)json_integer_value(v);
    return TS_OK;
}

/* Sizes the per-id tables: the highest id in model.vocab and added_tokens. */
static ts_status bpe_count_ids(ts_bpe *t, const json_t *vocab, const json_t *added) {
    int32_t max_id = -1, id;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v) {
        char where[96];
        snprintf(where, sizeof where, "model.vocab['%.48s']", key);
        TS_TRY(bpe_id_value(t, v, where, &id));
        if (id > max_id) max_id = id;
    }
    size_t i;
    json_array_foreach(added, i, v) {
        TS_TRY(bpe_id_value(t, json_object_get(v, "id"), "added_tokens[].id", &id));
        if (id > max_id) max_id = id;
    }
    if (max_id < 0) return ts_error(TS_ERR_FORMAT, "%s: model.vocab: empty", t->path);
    t->n_ids = max_id + 1;
    size_t n = (size_t)t->n_ids;
    t->tok_off = calloc(n, sizeof *t->tok_off);
    t->tok_len = calloc(n, sizeof *t->tok_len);
    t->key_off = calloc(n, sizeof *t->key_off);
    t->key_len = calloc(n, sizeof *t->key_len);
    t->tok_flags = calloc(n, sizeof *t->tok_flags);
    if (!t->tok_off || !t->tok_len || !t->key_off || !t->key_len || !t->tok_flags)
        return ts_error(TS_ERR_NOMEM, "%s: out of memory for %zu ids", t->path, n);
    return TS_OK;
}

/* The bytes a token decodes to, appended to blob; *flags gains BPE_TOK_BYTES (byte-level: the
 * spelling is in the alphabet, so merging bytes can produce it) or BPE_TOK_BYTE (a ByteFallback
 * <0xXX> piece). Byte-level: the alphabet undone when the whole spelling is in it, else the
 * spelling itself (HF's ByteLevel decoder). Otherwise the decoder's Replace, then a <0xXX>
 * piece is its byte. */
static ts_status bpe_token_decoded(const ts_bpe *t, const char *text, size_t len, ts_strbuf *blob,
                                   uint8_t *flags) {
    if (t->byte_level) {
        TS_TRY(ts_strbuf_reserve(blob, len));
        size_t blen;
        if (bpe_spelling_to_bytes(text, len, blob->data + blob->len, &blen)) {
            *flags |= BPE_TOK_BYTES;
            blob->len += blen;
            blob->data[blob->len] = 0;
            return TS_OK;
        }
        return ts_strbuf_append(blob, text, len);
    }
    size_t start = blob->len;
    if (t->dec_from_len)
        TS_TRY(bpe_replace_append(text, len, t->dec_from, t->dec_from_len, t->dec_to, t->dec_to_len,
                                  blob));
    else
        TS_TRY(ts_strbuf_append(blob, text, len));
    int b = t->dec_byte_fallback ? ts_byte_piece(blob->data + start, blob->len - start, true) : -1;
    if (b >= 0) {
        blob->data[start] = (char)b;
        blob->len = start + 1;
        blob->data[blob->len] = 0;
        *flags |= BPE_TOK_BYTE;
    }
    return TS_OK;
}

static ts_status bpe_load_vocab(ts_bpe *t, const json_t *vocab, ts_strbuf *blob, ts_strbuf *keys) {
    size_t n = json_object_size(vocab);
    size_t slots = bpe_table_size(n);
    t->vocab_slots = malloc(slots * sizeof *t->vocab_slots);
    if (!t->vocab_slots) return ts_error(TS_ERR_NOMEM, "%s: out of memory", t->path);
    memset(t->vocab_slots, 0xff, slots * sizeof *t->vocab_slots);
    t->vocab_mask = slots - 1;
    for (int b = 0; b < 256; b++)
        t->byte_id[b] = t->fallback_id[b] = -1;

    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v) {
        int32_t id = (int32_t)json_integer_value(v);
        size_t klen = strlen(key);
        if (t->tok_flags[id] & BPE_TOK_PRESENT)
            return ts_error(TS_ERR_FORMAT, "%s: model.vocab: id %d is given to two tokens", t->path,
                            (int)id);
        if (klen == 0) return ts_error(TS_ERR_FORMAT, "%s: model.vocab: empty token", t->path);
        t->key_off[id] = (uint32_t)keys->len;
        t->key_len[id] = (uint32_t)klen;
        TS_TRY(ts_strbuf_append(keys, key, klen));
        uint8_t flags = BPE_TOK_PRESENT;
        t->tok_off[id] = (uint32_t)blob->len;
        TS_TRY(bpe_token_decoded(t, key, klen, blob, &flags));
        t->tok_len[id] = (uint32_t)(blob->len - t->tok_off[id]);
        if ((flags & BPE_TOK_BYTES) && t->tok_len[id] == 1)
            t->byte_id[(uint8_t)blob->data[t->tok_off[id]]] = id;
        t->tok_flags[id] = flags;
    }
    /* keys is complete only now, so the hash table is filled afterwards. */
    t->keys = keys->data;
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!(t->tok_flags[id] & BPE_TOK_PRESENT)) continue;
        size_t i = bpe_hash(t->keys + t->key_off[id], t->key_len[id]) & t->vocab_mask;
        while (t->vocab_slots[i] >= 0)
            i = (i + 1) & t->vocab_mask;
        t->vocab_slots[i] = id;
    }
    if (!t->byte_level) {
        /* What byte fallback looks up: "<0x" uppercase hex ">" (HF's format!("<{:#04X}>")). */
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->fallback_id[b] = bpe_vocab_find(t, name, 6);
        }
        return TS_OK;
    }
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] < 0)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: model.vocab: no token for byte 0x%02x (byte-level BPE needs all "
                            "256 bytes)",
                            t->path, b);
    return TS_OK;
}

static ts_status bpe_merge_part(const ts_bpe *t, size_t index, const char *s, size_t n,
                                int32_t *id) {
    *id = bpe_vocab_find(t, s, n);
    if (*id < 0)
        return ts_error(TS_ERR_FORMAT, "%s: model.merges[%zu]: '%.*s' is not in model.vocab",
                        t->path, index, (int)(n > 64 ? 64 : n), s);
    return TS_OK;
}

static ts_status bpe_load_merges(ts_bpe *t, const json_t *merges) {
    size_t n = json_array_size(merges);
    if (n > (size_t)INT32_MAX / 4)
        return ts_error(TS_ERR_RANGE, "%s: model.merges: too many merges", t->path);
    size_t slots = bpe_table_size(n);
    t->merges = malloc(slots * sizeof *t->merges);
    if (!t->merges) return ts_error(TS_ERR_NOMEM, "%s: out of memory for merges", t->path);
    for (size_t i = 0; i < slots; i++)
        t->merges[i].key = BPE_EMPTY_KEY;
    t->merge_mask = slots - 1;

    char *joined = NULL;
    size_t joined_cap = 0;
    ts_status st = TS_OK;
    size_t index;
    const json_t *m;
    json_array_foreach(merges, index, m) {
        const char *a, *b;
        size_t alen, blen;
        /* Two forms: "left right" (split at the only space; spellings never contain one) or
         * ["left", "right"]. */
        if (json_is_string(m)) {
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ') || json_string_length(m) != strlen(a)) {
                st = ts_error(TS_ERR_FORMAT, "%s: model.merges[%zu]: expected \"left right\"",
                              t->path, index);
                break;
            }
            alen = (size_t)(sp - a);
            b = sp + 1;
            blen = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            alen = json_string_length(json_array_get(m, 0));
            blen = json_string_length(json_array_get(m, 1));
        } else {
            st = ts_error(TS_ERR_FORMAT, "%s: model.merges[%zu]: expected a string or a pair",
                          t->path, index);
            break;
        }
        int32_t left, right, merged;
        if ((st = bpe_merge_part(t, index, a, alen, &left)) != TS_OK) break;
        if ((st = bpe_merge_part(t, index, b, blen, &right)) != TS_OK) break;
        if (alen + blen > joined_cap) {
            joined_cap = 2 * (alen + blen);
            free(joined);
            joined = malloc(joined_cap);
            if (!joined) {
                st = ts_error(TS_ERR_NOMEM, "%s: out of memory", t->path);
                break;
            }
        }
        memcpy(joined, a, alen);
        memcpy(joined + alen, b, blen);
        if ((st = bpe_merge_part(t, index, joined, alen + blen, &merged)) != TS_OK) break;
        /* A pair listed twice keeps its later rank, as in HF (a map built in list order). */
        uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
        size_t i = bpe_mix(key) & t->merge_mask;
        while (t->merges[i].key != BPE_EMPTY_KEY && t->merges[i].key != key)
            i = (i + 1) & t->merge_mask;
        t->merges[i].key = key;
        t->merges[i].rank = (int32_t)index;
        t->merges[i].new_id = merged;
    }
    free(joined);
    return st;
}

/* ---- loading: added tokens ----------------------------------------------------------------- */

ts_status bpe_nfc(const char *s, size_t n, char **out, size_t *out_len) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) {
        free(dst);
        return ts_error(r == UTF8PROC_ERROR_NOMEM ? TS_ERR_NOMEM : TS_ERR_INVALID,
                        "NFC normalization failed: %s", utf8proc_errmsg(r));
    }
    *out = (char *)dst;
    *out_len = (size_t)r;
    return TS_OK;
}

static int bpe_len_desc(const void *x, const void *y) {
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return a < b ? 1 : a > b ? -1 : 0;
}

/* The matcher of the added tokens whose "normalized" flag is normalized. A pattern listed twice
 * (two tokens normalizing alike) keeps its first token, which a scan in list order finds
 * first. */
static ts_status bpe_build_matcher(ts_bpe *t, bpe_matcher *m, bool normalized) {
    m->n = 0;
    for (int i = 0; i < t->n_added; i++)
        m->n += t->added[i].normalized == normalized;
    size_t slots = bpe_table_size((size_t)m->n);
    m->slots = malloc(slots * sizeof *m->slots);
    m->lens = malloc((size_t)(m->n ? m->n : 1) * sizeof *m->lens);
    if (!m->slots || !m->lens) return ts_error(TS_ERR_NOMEM, "%s: out of memory", t->path);
    memset(m->slots, 0xff, slots * sizeof *m->slots);
    m->mask = slots - 1;
    /* Lengths by first byte: counted, placed, then each run sorted longest first, deduped. */
    uint32_t count[257] = {0};
    memset(m->second, 0, sizeof m->second);
    memset(m->single, 0, sizeof m->single);
    for (int i = 0; i < t->n_added; i++) {
        const bpe_added *a = &t->added[i];
        if (a->normalized != normalized) continue;
        uint8_t b0 = (uint8_t)a->pattern[0];
        count[b0 + 1]++;
        if (a->pattern_len == 1)
            m->single[b0] = true;
        else
            m->second[b0][(uint8_t)a->pattern[1] >> 6] |= 1ull << ((uint8_t)a->pattern[1] & 63);
        size_t k = bpe_hash(a->pattern, a->pattern_len) & m->mask;
        bool dup = false;
        for (; m->slots[k] >= 0; k = (k + 1) & m->mask) {
            const bpe_added *o = &t->added[m->slots[k]];
            dup |= o->pattern_len == a->pattern_len &&
                   memcmp(o->pattern, a->pattern, a->pattern_len) == 0;
        }
        if (!dup) m->slots[k] = i;
    }
    uint32_t fill[257];
    for (int b = 0; b < 256; b++)
        count[b + 1] += count[b];
    memcpy(fill, count, sizeof fill);
    for (int i = 0; i < t->n_added; i++) {
        const bpe_added *a = &t->added[i];
        if (a->normalized == normalized)
            m->lens[fill[(uint8_t)a->pattern[0]]++] = (uint32_t)a->pattern_len;
    }
    int32_t out = 0;
    for (int b = 0; b < 256; b++) {
        uint32_t *run = m->lens + count[b];
        size_t n = count[b + 1] - count[b];
        qsort(run, n, sizeof *run, bpe_len_desc);
        m->first[b] = out; /* runs move down in place: out never passes count[b] */
        for (size_t i = 0; i < n; i++)
            if (i == 0 || run[i] != run[i - 1]) m->lens[out++] = run[i];
    }
    m->first[256] = out;
    return TS_OK;
}

static int bpe_added_by_content(const void *x, const void *y) {
    return strcmp((*(const bpe_added *const *)x)->content, (*(const bpe_added *const *)y)->content);
}

/* No content twice (HF would give both the first one's id). */
static ts_status bpe_added_unique(const ts_bpe *t) {
    if (t->n_added < 2) return TS_OK;
    const bpe_added **by = malloc((size_t)t->n_added * sizeof *by);
    if (!by) return ts_error(TS_ERR_NOMEM, "%s: out of memory", t->path);
    for (int i = 0; i < t->n_added; i++)
        by[i] = &t->added[i];
    qsort(by, (size_t)t->n_added, sizeof *by, bpe_added_by_content);
    ts_status st = TS_OK;
    for (int i = 1; i < t->n_added && st == TS_OK; i++)
        if (strcmp(by[i - 1]->content, by[i]->content) == 0)
            st = ts_error(TS_ERR_FORMAT, "%s: added_tokens: content '%s' is listed twice", t->path,
                          by[i]->content);
    free(by);
    return st;
}

/* HF does not take an added token's id from the file: a token spelled like a vocab entry gets
 * that entry's id, the others get ids in list order after the vocabulary (model.vocab's entry
 * count). A file whose ids disagree would tokenize differently in HF and here; refuse it. */
static ts_status bpe_load_added(ts_bpe *t, const json_t *added, size_t vocab_len, ts_strbuf *blob) {
    int64_t max_assigned = -1;
    size_t n = json_array_size(added);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return ts_error(TS_ERR_NOMEM, "%s: out of memory", t->path);
    size_t i;
    const json_t *a;
    json_array_foreach(added, i, a) {
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if (!json_is_object(a))
            return ts_error(TS_ERR_FORMAT, "%s: %s: expected an object", t->path, where);
        const json_t *content = json_object_get(a, "content");
        if (!json_is_string(content) || json_string_length(content) == 0 ||
            json_string_length(content) != strlen(json_string_value(content)))
            return ts_error(TS_ERR_FORMAT, "%s: %s.content: expected a non-empty string", t->path,
                            where);
        const char *text = json_string_value(content);
        size_t len = strlen(text);
        bpe_added *tok = &t->added[t->n_added];
        TS_TRY(bpe_id_value(t, json_object_get(a, "id"), where, &tok->id));
        /* HF requires both flags; the others may be left out here (false). */
        if (!json_is_boolean(json_object_get(a, "special")) ||
            !json_is_boolean(json_object_get(a, "normalized")))
            return ts_error(TS_ERR_FORMAT,
                            "%s: %s: needs \"special\" and \"normalized\" (true or "
                            "false)",
                            t->path, where);
        TS_TRY(bpe_bool(t, a, where, "special", false, &tok->special));
        TS_TRY(bpe_bool(t, a, where, "normalized", false, &tok->normalized));
        static const char *const refused[] = {"single_word", "lstrip", "rstrip"};
        for (int r = 0; r < 3; r++) {
            bool on;
            TS_TRY(bpe_bool(t, a, where, refused[r], false, &on));
            if (on)
                return ts_error(TS_ERR_UNSUPPORTED, "%s: %s.%s: only false is supported", t->path,
                                where, refused[r]);
        }
        if (t->tok_flags[tok->id] & BPE_TOK_ADDED)
            return ts_error(TS_ERR_FORMAT, "%s: %s: id %d is listed twice", t->path, where,
                            (int)tok->id);
        int64_t expect = bpe_vocab_find(t, text, len);
        if (expect < 0)
            expect = max_assigned >= (int64_t)vocab_len ? max_assigned + 1 : (int64_t)vocab_len;
        if (tok->id != expect)
            return ts_error(TS_ERR_FORMAT,
                            "%s: %s: id %d, but Hugging Face gives '%s' id %lld (added tokens "
                            "take a vocab entry's id, or the next id after the vocabulary)",
                            t->path, where, (int)tok->id, text, (long long)expect);
        if (expect > max_assigned) max_assigned = expect;
        tok->content = strdup(text);
        if (!tok->content) return ts_error(TS_ERR_NOMEM, "%s: out of memory", t->path);
        t->n_added++;
        if (tok->normalized && t->n_norm) {
            /* Matched after normalization, so spelled as the normalizer would leave it. */
            ts_strbuf norm = {0}, work = {0};
            ts_status st = bpe_normalize(t, text, len, &norm, &work);
            ts_strbuf_free(&work);
            if (st == TS_OK && norm.len == 0)
                st = ts_error(TS_ERR_FORMAT, "%s: %s: normalizes to nothing", t->path, where);
            if (st != TS_OK) {
                ts_strbuf_free(&norm);
                return st;
            }
            tok->pattern = norm.data;
            tok->pattern_len = norm.len;
        } else {
            tok->pattern = strdup(text);
            if (!tok->pattern) return ts_error(TS_ERR_NOMEM, "%s: out of memory", t->path);
            tok->pattern_len = len;
        }
        uint8_t *flags = &t->tok_flags[tok->id];
        if (*flags & BPE_TOK_PRESENT) {
            /* Also a vocab entry: only consistent when it is the same token. */
            if (t->key_len[tok->id] != len || memcmp(t->keys + t->key_off[tok->id], text, len))
                return ts_error(TS_ERR_FORMAT, "%s: %s: id %d is also model.vocab token '%.*s'",
                                t->path, where, (int)tok->id, (int)t->key_len[tok->id],
                                t->keys + t->key_off[tok->id]);
        } else {
            /* The decoder treats an added token like any other. */
            *flags = BPE_TOK_PRESENT;
            t->tok_off[tok->id] = (uint32_t)blob->len;
            TS_TRY(bpe_token_decoded(t, text, len, blob, flags));
            t->tok_len[tok->id] = (uint32_t)(blob->len - t->tok_off[tok->id]);
            *flags &= (uint8_t)~BPE_TOK_BYTES; /* never the product of merging */
        }
        *flags |= BPE_TOK_ADDED | (tok->special ? BPE_TOK_SPECIAL : 0);
    }
    TS_TRY(bpe_added_unique(t));
    TS_TRY(bpe_build_matcher(t, &t->raw_match, false));
    return bpe_build_matcher(t, &t->norm_match, true);
}

/* ---- loading: normalizer, pre-tokenizer, decoder ------------------------------------------ */

/* A String pattern's text ({"String": "..."}); NULL for a Regex or anything else. */
static const char *bpe_string_pattern(const json_t *obj, size_t *len) {
    const json_t *lit = json_object_get(json_object_get(obj, "pattern"), "String");
    if (!json_is_string(lit)) return NULL;
    *len = json_string_length(lit);
    return json_string_value(lit);
}

static ts_status bpe_load_norm_step(ts_bpe *t, const json_t *n, const char *where) {
    const char *type = bpe_type(n);
    if (t->n_norm == BPE_MAX_NORM)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: %s: more than %d normalizer steps", t->path, where,
                        BPE_MAX_NORM);
    bpe_norm_step *step = &t->norm[t->n_norm];
    if (strcmp(type, "NFC") == 0) {
        step->nfc = true;
        t->n_norm++;
        return TS_OK;
    }
    if (strcmp(type, "Replace") == 0) {
        size_t from_len;
        const char *from = bpe_string_pattern(n, &from_len);
        const json_t *to = json_object_get(n, "content");
        if (!from)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: %s.pattern: only a String pattern is supported", t->path, where);
        if (from_len == 0 || !json_is_string(to) || memchr(from, 0, from_len))
            return ts_error(TS_ERR_FORMAT, "%s: %s: expected a non-empty pattern and a content",
                            t->path, where);
        step->from = malloc(from_len);
        step->to = malloc(json_string_length(to) + 1);
        if (!step->from || !step->to) {
            free(step->from);
            free(step->to);
            return ts_error(TS_ERR_NOMEM, "%s: out of memory", t->path);
        }
        memcpy(step->from, from, from_len);
        step->from_len = from_len;
        step->to_len = json_string_length(to);
        memcpy(step->to, json_string_value(to), step->to_len + 1);
        t->n_norm++;
        return TS_OK;
    }
    return ts_error(TS_ERR_UNSUPPORTED,
                    "%s: %s.type '%s': only NFC and Replace (a String pattern) are supported",
                    t->path, where, type);
}

static ts_status bpe_load_normalizer(ts_bpe *t, const json_t *norm) {
    if (bpe_null(norm)) return TS_OK;
    if (strcmp(bpe_type(norm), "Sequence") != 0) return bpe_load_norm_step(t, norm, "normalizer");
    const json_t *list = json_object_get(norm, "normalizers");
    size_t i;
    const json_t *n;
    if (!json_is_array(list))
        return ts_error(TS_ERR_FORMAT, "%s: normalizer.normalizers: expected an array", t->path);
    json_array_foreach(list, i, n) {
        char where[64];
        snprintf(where, sizeof where, "normalizer.normalizers[%zu]", i);
        TS_TRY(bpe_load_norm_step(t, n, where));
    }
    return TS_OK;
}

/* Rewrites the escapes whose meaning differs between Oniguruma (HF) and PCRE2. */
static ts_status bpe_translate_regex(const ts_bpe *t, const char *where, const char *re,
                                     ts_strbuf *out) {
    for (size_t i = 0; re[i]; i++) {
        if (re[i] != '\\' || !re[i + 1]) {
            TS_TRY(ts_strbuf_append(out, re + i, 1));
            continue;
        }
        char c = re[++i];
        if (c == 's')
            TS_TRY(ts_strbuf_append(out, "\\p{White_Space}", 15));
        else if (c == 'S')
            TS_TRY(ts_strbuf_append(out, "\\P{White_Space}", 15));
        else if (c == 'v')
            TS_TRY(ts_strbuf_append(out, "\\x{0B}", 6));
        else if (strchr("wWbBhHRXKNQ", c))
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: %s: escape \\%c means different things in HF's regex engine and "
                            "ours",
                            t->path, where, c);
        else {
            char two[2] = {'\\', c};
            TS_TRY(ts_strbuf_append(out, two, 2));
        }
    }
    return TS_OK;
}

static ts_status bpe_add_split(ts_bpe *t, const char *where, const char *pattern, bool literal) {
    if (t->n_split == BPE_MAX_SPLITS)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: %s: more than %d splitting steps", t->path, where,
                        BPE_MAX_SPLITS);
    ts_strbuf re = {0};
    ts_status st = literal ? ts_strbuf_append(&re, pattern, strlen(pattern))
                           : bpe_translate_regex(t, where, pattern, &re);
    if (st != TS_OK) {
        ts_strbuf_free(&re);
        return st;
    }
    int err;
    PCRE2_SIZE off;
    uint32_t opts = literal ? PCRE2_UTF | PCRE2_LITERAL /* the only options LITERAL allows */
                            : PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)re.data, re.len, opts, &err, &off, NULL);
    ts_strbuf_free(&re);
    if (!code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ts_error(TS_ERR_FORMAT, "%s: %s: regex does not compile: %s (near offset %zu)",
                        t->path, where, (const char *)msg, (size_t)off);
    }
    t->split_jit[t->n_split] = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    uint32_t caps = 0;
    pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &caps);
    if (caps > t->max_captures) t->max_captures = caps;
    t->split[t->n_split++] = code;
    return TS_OK;
}

/* The pattern HF's ByteLevel pre-tokenizer applies itself when use_regex is true (GPT-2's). */
static const char bpe_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* True when no text the normalizer leaves can hold pat, one character: a Replace step removes
 * every pat and no later step can bring one back (NFC could: it maps some characters to ASCII
 * ones). With a single character, no replacement can form one across its neighbours. */
static bool bpe_norm_removes(const ts_bpe *t, const char *pat, size_t n) {
    uint32_t cp;
    size_t len;
    if (ts_utf8_next(pat, n, &cp, &len) != TS_UTF8_CHAR || len != n) return false;
    int k = -1;
    for (int i = 0; i < t->n_norm; i++) {
        const bpe_norm_step *st = &t->norm[i];
        bool brings = st->nfc || (st->to_len && memmem(st->to, st->to_len, pat, n));
        if (brings)
            k = -1;
        else if (st->from_len == n && memcmp(st->from, pat, n) == 0)
            k = i;
    }
    return k >= 0;
}

static ts_status bpe_load_pretok_step(ts_bpe *t, const json_t *p, const char *where,
                                      bool *byte_level) {
    const char *type = bpe_type(p);
    if (*byte_level)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: %s: nothing may follow ByteLevel", t->path, where);
    char field[96];
    if (strcmp(type, "Split") == 0) {
        const json_t *pat = json_object_get(p, "pattern");
        const json_t *re = json_object_get(pat, "Regex");
        const json_t *lit = json_object_get(pat, "String");
        const json_t *behavior = json_object_get(p, "behavior");
        const char *bh = json_is_string(behavior) ? json_string_value(behavior) : "";
        bool invert;
        TS_TRY(bpe_bool(t, p, where, "invert", false, &invert));
        if (invert)
            return ts_error(TS_ERR_UNSUPPORTED, "%s: %s.invert: only false is supported", t->path,
                            where);
        /* Gemma's converted tokenizer splits on " " after the normalizer has turned every
         * " " into U+2581: a split that never finds anything. */
        if (strcmp(bh, "MergedWithPrevious") == 0 && json_is_string(lit) &&
            json_string_length(lit) > 0 &&
            bpe_norm_removes(t, json_string_value(lit), json_string_length(lit)))
            return TS_OK;
        if (strcmp(bh, "Isolated") != 0)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: %s.behavior: only Isolated is supported (or a String split "
                            "that the normalizer leaves nothing to find)",
                            t->path, where);
        snprintf(field, sizeof field, "%s.pattern", where);
        if (json_is_string(re)) return bpe_add_split(t, field, json_string_value(re), false);
        if (json_is_string(lit) && json_string_length(lit) > 0)
            return bpe_add_split(t, field, json_string_value(lit), true);
        return ts_error(TS_ERR_FORMAT, "%s: %s: expected {\"Regex\": ...} or {\"String\": ...}",
                        t->path, field);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        bool prefix, use_regex;
        if (!t->byte_level)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: %s: a ByteLevel pre-tokenizer needs the ByteLevel decoder",
                            t->path, where);
        TS_TRY(bpe_bool(t, p, where, "add_prefix_space", true, &prefix));
        TS_TRY(bpe_bool(t, p, where, "use_regex", true, &use_regex));
        if (prefix)
            return ts_error(TS_ERR_UNSUPPORTED, "%s: %s.add_prefix_space: only false is supported",
                            t->path, where);
        *byte_level = true;
        snprintf(field, sizeof field, "%s (use_regex)", where);
        return use_regex ? bpe_add_split(t, field, bpe_gpt2_pattern, false) : TS_OK;
    }
    return ts_error(TS_ERR_UNSUPPORTED, "%s: %s.type '%s': only Split and ByteLevel are supported",
                    t->path, where, type);
}

static ts_status bpe_load_pretok(ts_bpe *t, const json_t *pre) {
    bool byte_level = false;
    if (bpe_null(pre)) {
        if (t->byte_level)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: pre_tokenizer: null (the ByteLevel decoder "
                            "needs a ByteLevel pre-tokenizer)",
                            t->path);
        return TS_OK;
    }
    if (strcmp(bpe_type(pre), "Sequence") == 0) {
        const json_t *list = json_object_get(pre, "pretokenizers");
        if (!json_is_array(list))
            return ts_error(TS_ERR_FORMAT, "%s: pre_tokenizer.pretokenizers: expected an array",
                            t->path);
        size_t i;
        const json_t *p;
        json_array_foreach(list, i, p) {
            char where[64];
            snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%zu]", i);
            TS_TRY(bpe_load_pretok_step(t, p, where, &byte_level));
        }
    } else {
        TS_TRY(bpe_load_pretok_step(t, pre, "pre_tokenizer", &byte_level));
    }
    if (t->byte_level && !byte_level)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: pre_tokenizer: no ByteLevel step", t->path);
    return TS_OK;
}

/* The decoder: ByteLevel, or a Sequence of Replace (a String pattern), ByteFallback and Fuse
 * in that order, each at most once (what SentencePiece conversions write; Fuse only joins the
 * strings, which decoding does anyway). */
static ts_status bpe_load_decoder(ts_bpe *t, const json_t *dec) {
    const char *type = bpe_type(dec);
    if (strcmp(type, "ByteLevel") == 0) {
        t->byte_level = true;
        return TS_OK;
    }
    const json_t *list = json_object_get(dec, "decoders");
    if (strcmp(type, "Sequence") != 0 || !json_is_array(list))
        return ts_error(TS_ERR_UNSUPPORTED,
                        "%s: decoder.type '%s': only ByteLevel, or a Sequence of Replace, "
                        "ByteFallback and Fuse is supported",
                        t->path, type);
    static const char *const order[] = {"Replace", "ByteFallback", "Fuse"};
    int next = 0;
    size_t i;
    const json_t *d;
    json_array_foreach(list, i, d) {
        const char *dt = bpe_type(d);
        int k = 0;
        while (k < 3 && strcmp(dt, order[k]) != 0)
            k++;
        if (k == 3 || k < next)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: decoder.decoders[%zu].type '%s': only Replace, ByteFallback, Fuse "
                            "(in that order, once each) are supported",
                            t->path, i, dt);
        next = k + 1;
        if (k == 1) t->dec_byte_fallback = true;
        if (k != 0) continue;
        size_t from_len;
        const char *from = bpe_string_pattern(d, &from_len);
        const json_t *to = json_object_get(d, "content");
        if (!from || from_len == 0 || !json_is_string(to))
            return ts_error(TS_ERR_UNSUPPORTED,
                            "%s: decoder.decoders[%zu]: only a Replace of a non-empty String "
                            "pattern is supported",
                            t->path, i);
        t->dec_from = strndup(from, from_len);
        t->dec_to = strndup(json_string_value(to), json_string_length(to));
        if (!t->dec_from || !t->dec_to) return ts_error(TS_ERR_NOMEM, "%s: out of memory", t->path);
        t->dec_from_len = from_len;
        t->dec_to_len = json_string_length(to);
    }
    return TS_OK;
}

/* Where a word may be cut (space_cut.h): not in byte-level files, nor with ignore_merges (the
 * whole word is looked up first), nor where U+2581 is no piece (its bytes would be fallback
 * pieces, and a pending unk could move). */
static void bpe_find_space_glue(ts_bpe *t) {
    static const char sp[] = "\xE2\x96\x81";
    t->space_glue.on = !t->byte_level && !t->ignore_merges && bpe_vocab_find(t, sp, 3) >= 0;
    for (int32_t id = 0; t->space_glue.on && id < t->n_ids; id++)
        if (t->tok_flags[id] & BPE_TOK_PRESENT)
            ts_space_glue_add(&t->space_glue, t->keys + t->key_off[id], t->key_len[id]);
}

static ts_status bpe_load_model(ts_bpe *t, const json_t *model, ts_strbuf *blob, ts_strbuf *keys) {
    if (!json_is_object(model)) return ts_error(TS_ERR_FORMAT, "%s: model: missing", t->path);
    const char *type = bpe_type(model);
    if (*type && strcmp(type, "BPE") != 0)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: model.type '%s': only BPE is supported", t->path,
                        type);
    if (!bpe_null(json_object_get(model, "dropout")))
        return ts_error(TS_ERR_UNSUPPORTED, "%s: model.dropout: only null is supported", t->path);
    TS_TRY(bpe_empty_string(t, model, "model", "continuing_subword_prefix"));
    TS_TRY(bpe_empty_string(t, model, "model", "end_of_word_suffix"));
    /* unk_token, fuse_unk and byte_fallback only act on characters missing from the vocab:
     * never in a byte-level file (all 256 byte tokens are required). */
    TS_TRY(bpe_bool(t, model, "model", "ignore_merges", false, &t->ignore_merges));
    TS_TRY(bpe_bool(t, model, "model", "byte_fallback", false, &t->byte_fallback));
    TS_TRY(bpe_bool(t, model, "model", "fuse_unk", false, &t->fuse_unk));
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    const json_t *unk = json_object_get(model, "unk_token");
    if (!json_is_object(vocab))
        return ts_error(TS_ERR_FORMAT, "%s: model.vocab: expected an object", t->path);
    if (!bpe_null(merges) && !json_is_array(merges))
        return ts_error(TS_ERR_FORMAT, "%s: model.merges: expected an array", t->path);
    if (!bpe_null(unk) && !json_is_string(unk))
        return ts_error(TS_ERR_FORMAT, "%s: model.unk_token: expected a string", t->path);
    TS_TRY(bpe_load_vocab(t, vocab, blob, keys));
    bpe_find_space_glue(t);
    t->unk_id = -1;
    if (json_is_string(unk)) {
        t->unk_id = bpe_vocab_find(t, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0)
            return ts_error(TS_ERR_FORMAT, "%s: model.unk_token '%.48s' is not in model.vocab",
                            t->path, json_string_value(unk));
    }
    return bpe_load_merges(t, merges); /* absent or null: no merges */
}

/* One side of a TemplateProcessing "single" template: a SpecialToken item's id, through the
 * special_tokens map (exactly one id). */
static ts_status bpe_post_special(ts_bpe *t, const json_t *tp, const json_t *item, int32_t *id) {
    const json_t *name = json_object_get(json_object_get(item, "SpecialToken"), "id");
    const json_t *map = json_object_get(tp, "special_tokens"), *ids = NULL;
    if (json_is_string(name))
        ids = json_object_get(json_object_get(map, json_string_value(name)), "ids");
    if (!json_is_array(ids) || json_array_size(ids) != 1)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "%s: post_processor: a special token of the template must name one id "
                        "in special_tokens",
                        t->path);
    TS_TRY(bpe_id_value(t, json_array_get(ids, 0), "post_processor.special_tokens", id));
    if (*id >= t->n_ids || !(t->tok_flags[*id] & BPE_TOK_PRESENT))
        return ts_error(TS_ERR_FORMAT, "%s: post_processor: id %d is no token", t->path, (int)*id);
    return TS_OK;
}

/* What HF's encode adds around one sequence (add_special_tokens=True): TemplateProcessing's
 * "single" template, alone or in a Sequence, read as [SpecialToken] $A [SpecialToken]. Other
 * post-processors (ByteLevel, which adds nothing here) leave none. */
static ts_status bpe_load_post(ts_bpe *t, const json_t *post) {
    t->post_bos = t->post_eos = -1;
    if (strcmp(bpe_type(post), "Sequence") == 0) {
        size_t i;
        const json_t *p;
        json_array_foreach(json_object_get(post, "processors"), i, p) {
            if (strcmp(bpe_type(p), "TemplateProcessing") == 0) return bpe_load_post(t, p);
        }
        return TS_OK;
    }
    if (strcmp(bpe_type(post), "TemplateProcessing") != 0) return TS_OK;
    const json_t *single = json_object_get(post, "single");
    size_t n = json_array_size(single), a = 0;
    while (a < n && !json_object_get(json_array_get(single, a), "Sequence"))
        a++;
    if (a == n || a > 1 || n - a > 2)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "%s: post_processor.single: only [special] $A [special] is supported",
                        t->path);
    if (a == 1) TS_TRY(bpe_post_special(t, post, json_array_get(single, 0), &t->post_bos));
    if (n - a == 2) TS_TRY(bpe_post_special(t, post, json_array_get(single, a + 1), &t->post_eos));
    return TS_OK;
}

static ts_status bpe_parse(ts_bpe *t, const json_t *root) {
    if (!json_is_object(root)) return ts_error(TS_ERR_FORMAT, "%s: not a JSON object", t->path);
    if (!bpe_null(json_object_get(root, "truncation")))
        return ts_error(TS_ERR_UNSUPPORTED, "%s: truncation: only null is supported", t->path);
    if (!bpe_null(json_object_get(root, "padding")))
        return ts_error(TS_ERR_UNSUPPORTED, "%s: padding: only null is supported", t->path);
    const json_t *model = json_object_get(root, "model");
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!bpe_null(added) && !json_is_array(added))
        return ts_error(TS_ERR_FORMAT, "%s: added_tokens: expected an array", t->path);
    json_t *no_added = json_array();
    if (!no_added) return ts_error(TS_ERR_NOMEM, "%s: out of memory", t->path);
    if (bpe_null(added)) added = no_added;
    ts_strbuf blob = {0}, keys = {0};
    ts_status st = bpe_load_decoder(t, json_object_get(root, "decoder"));
    if (st == TS_OK) st = bpe_load_normalizer(t, json_object_get(root, "normalizer"));
    if (st == TS_OK) st = bpe_load_pretok(t, json_object_get(root, "pre_tokenizer"));
    if (st == TS_OK && !json_is_object(vocab))
        st = ts_error(TS_ERR_FORMAT, "%s: model.vocab: expected an object", t->path);
    if (st == TS_OK) st = bpe_count_ids(t, vocab, added);
    if (st == TS_OK) st = bpe_load_model(t, model, &blob, &keys);
    if (st == TS_OK) st = bpe_load_added(t, added, json_object_size(vocab), &blob);
    if (st == TS_OK) st = bpe_load_post(t, json_object_get(root, "post_processor"));
    json_decref(no_added);
    t->blob = blob.data;
    t->keys = keys.data;
    return st;
}

/* Builds a tokenizer from a parsed tokenizer.json tree (the one path both loaders take). */
static ts_status bpe_from_root(const char *name, const json_t *root, ts_bpe **out) {
    ts_bpe *t = calloc(1, sizeof *t);
    if (!t) return ts_error(TS_ERR_NOMEM, "%s: out of memory", name);
    pthread_mutex_init(&t->pool_lock, NULL);
    t->path = strdup(name);
    ts_status st = t->path ? bpe_parse(t, root) : ts_error(TS_ERR_NOMEM, "%s: out of memory", name);
    if (st != TS_OK) {
        ts_bpe_free(t);
        return st;
    }
    *out = t;
    return TS_OK;
}

ts_status ts_bpe_load(const char *path, ts_bpe **out) {
    *out = NULL;
    char *buf;
    size_t n = 0;
    TS_TRY(bpe_read_file(path, &buf, &n));
    json_error_t jerr;
    json_t *root = json_loadb(buf, n, 0, &jerr);
    free(buf);
    if (!root)
        return ts_error(TS_ERR_FORMAT, "%s: line %d column %d: %s", path, jerr.line, jerr.column,
                        jerr.text);
    ts_status st = bpe_from_root(path, root, out);
    json_decref(root);
    return st;
}

/* ---- building from arrays (GGUF metadata) ------------------------------------------------- */

static int bpe_spec_type(const ts_bpe_spec *s, int32_t i) { return s->types ? s->types[i] : 1; }

static bool bpe_spec_added(int type) { return type == 3 || type == 4; }

/* Added tokens after every regular one, in id order, are what tokenizer.json files hold (HF
 * gives them the ids after the vocabulary). Otherwise they are also listed in the vocabulary,
 * where HF takes their ids from. */
static bool bpe_spec_added_in_vocab(const ts_bpe_spec *s) {
    int32_t n_regular = 0, next = -1;
    for (int32_t i = 0; i < s->n_tokens; i++) {
        int ty = bpe_spec_type(s, i);
        if (ty != 5 && !bpe_spec_added(ty)) n_regular++;
    }
    for (int32_t i = 0; i < s->n_tokens; i++) {
        int ty = bpe_spec_type(s, i);
        if (ty == 5) continue;
        if (!bpe_spec_added(ty)) {
            if (next >= 0) return true; /* a regular token after an added one */
            continue;
        }
        if (next < 0) next = n_regular;
        if (i != next) return true;
        next++;
    }
    return false;
}

static json_t *bpe_spec_split(const char *re) {
    return json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", re,
                     "behavior", "Isolated", "invert", 0);
}

static ts_status bpe_spec_json(const ts_bpe_spec *s, json_t *root) {
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    int bad = 0;
    if (json_object_set_new(root, "added_tokens", added) ||
        json_object_set_new(
            root, "model",
            json_pack("{s:s, s:o, s:o}", "type", "BPE", "vocab", vocab, "merges", merges)))
        bad = 1;
    bool also_vocab = bpe_spec_added_in_vocab(s);
    char *key = NULL;
    size_t key_cap = 0;
    for (int32_t i = 0; !bad && i < s->n_tokens; i++) {
        int ty = bpe_spec_type(s, i);
        if (ty < 0 || ty > 6 || !s->text[i] || memchr(s->text[i], 0, s->len[i])) {
            free(key);
            return ts_error(TS_ERR_FORMAT, "%s: token %d: type %d, or missing, or holds a NUL byte",
                            s->name, (int)i, ty);
        }
        if (ty == 5) continue;
        if (bpe_spec_added(ty))
            bad |= json_array_append_new(
                added, json_pack("{s:I, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)i,
                                 "content", s->text[i], s->len[i], "special", ty == 3, "normalized",
                                 0, "single_word", 0, "lstrip", 0, "rstrip", 0));
        if (bpe_spec_added(ty) && !also_vocab) continue;
        if (s->len[i] + 1 > key_cap) {
            key_cap = 2 * (s->len[i] + 1);
            free(key);
            if (!(key = malloc(key_cap)))
                return ts_error(TS_ERR_NOMEM, "%s: out of memory", s->name);
        }
        memcpy(key, s->text[i], s->len[i]);
        key[s->len[i]] = 0;
        if (json_object_get(vocab, key)) {
            free(key);
            return ts_error(TS_ERR_FORMAT, "%s: token %d: '%.48s' is spelled like an earlier token",
                            s->name, (int)i, s->text[i]);
        }
        bad |= json_object_set_new(vocab, key, json_integer(i));
    }
    free(key);
    json_t *pre = json_array();
    bad |= !pre;
    for (size_t i = 0; !bad && i < s->n_merges; i++)
        bad |= json_array_append_new(merges, json_stringn(s->merges[i], s->merge_len[i]));
    for (int i = 0; !bad && i < s->n_split; i++)
        bad |= json_array_append_new(pre, bpe_spec_split(s->split_regex[i]));
    bad = bad || json_array_append_new(pre, json_pack("{s:s, s:b, s:b}", "type", "ByteLevel",
                                                      "add_prefix_space", 0, "use_regex", 0));
    bad = bad || json_object_set_new(root, "pre_tokenizer",
                                     json_pack("{s:s, s:o}", "type", "Sequence", "pretokenizers",
                                               json_incref(pre)));
    bad = bad || json_object_set_new(root, "normalizer",
                                     s->nfc ? json_pack("{s:s}", "type", "NFC") : json_null());
    bad = bad || json_object_set_new(root, "decoder", json_pack("{s:s}", "type", "ByteLevel"));
    json_decref(pre);
    return bad ? ts_error(TS_ERR_NOMEM, "%s: out of memory building the tokenizer", s->name)
               : TS_OK;
}

ts_status ts_bpe_build(const ts_bpe_spec *spec, ts_bpe **out) {
    *out = NULL;
    const char *name = spec->name ? spec->name : "tokenizer";
    if (spec->n_tokens <= 0 || !spec->text || !spec->len)
        return ts_error(TS_ERR_FORMAT, "%s: empty vocabulary", name);
    json_t *root = json_object();
    if (!root) return ts_error(TS_ERR_NOMEM, "%s: out of memory", name);
    ts_status st = bpe_spec_json(spec, root);
    if (st == TS_OK) st = bpe_from_root(name, root, out);
    json_decref(root);
    return st;
}

void ts_bpe_free(ts_bpe *t) {
    if (!t) return;
    bpe_pool_free(t);
    pthread_mutex_destroy(&t->pool_lock);
    for (int i = 0; i < t->n_split; i++)
        pcre2_code_free(t->split[i]);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].pattern);
    }
    free(t->added);
    free(t->raw_match.slots);
    free(t->raw_match.lens);
    free(t->norm_match.slots);
    free(t->norm_match.lens);
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].from);
        free(t->norm[i].to);
    }
    free(t->dec_from);
    free(t->dec_to);
    free(t->merges);
    free(t->vocab_slots);
    free(t->tok_off);
    free(t->tok_len);
    free(t->key_off);
    free(t->key_len);
    free(t->tok_flags);
    free(t->blob);
    free(t->keys);
    free(t->path);
    free(t);
}
