/* Test driver for the public tokenizer API (any tokenizer ts_tokenizer_open accepts:
 * tokenizer.json, a model directory, a GGUF file). Used by tests/py/test_gguf_tokenizer_parity.py.
 *
 *   ts_tok_dump encode [--no-special] TOKENIZER STRINGS
 *       STRINGS has one hex-encoded string per line. Prints one line per string:
 *         ids (space-separated, BOS included when the tokenizer adds one) TAB
 *         hex(ts_detokenize(ids)) TAB hex(streamed decode of ids)
 *       or "ERR <message>".
 *   ts_tok_dump decode [--skip-special] TOKENIZER IDS
 *       IDS has space-separated ids per line; prints hex(decode) TAB hex(streamed decode).
 *   ts_tok_dump chat TOKENIZER CONVERSATIONS
 *       Each line: hex of "role\x1fcontent\x1erole\x1fcontent..." (unit/record separators);
 *       prints the ids of ts_chat_tokenize with a generation prompt, or "ERR <message>".
 *   ts_tok_dump bench [--repeat N] TOKENIZER TEXT_FILE
 *       Encodes the whole file as one string N times on one thread; prints a JSON line with
 *       bytes, tokens, best wall seconds and MB/s.
 *   ts_tok_dump info TOKENIZER
 *       Prints vocab size, the ids of the empty string, the fill-in-the-middle tokens (prefix,
 *       suffix, middle, pad, repo, file_sep; -1 absent) and the load time. */
#include "tessera.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dump_util.h"

static void print_decodes(const ts_tokenizer *t, const int32_t *ids, size_t n, bool skip) {
    char *text;
    size_t len;
    if (ts_detokenize(t, ids, n, skip, &text, &len) != TS_OK) {
        printf("ERR %s", ts_last_error());
        return;
    }
    dump_print_hex(text, len);
    free(text);
    putchar('\t');
    ts_detokenizer *d;
    if (ts_detokenizer_create(t, skip, &d) != TS_OK) return;
    for (size_t i = 0; i <= n; i++) {
        const char *piece;
        size_t plen;
        ts_status st = i < n ? ts_detokenizer_push(d, ids[i], &piece, &plen)
                             : ts_detokenizer_flush(d, &piece, &plen);
        if (st != TS_OK) {
            printf("ERR");
            break;
        }
        dump_print_hex(piece, plen);
    }
    ts_detokenizer_free(d);
}

static int cmd_encode(const ts_tokenizer *t, FILE *f, bool special) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) >= 0) {
        long n = dump_unhex(line, (size_t)got);
        if (n < 0) {
            printf("ERR bad hex line\n");
            continue;
        }
        int32_t *ids;
        size_t n_ids;
        if (ts_tokenize(t, line, (size_t)n, special, &ids, &n_ids) != TS_OK) {
            printf("ERR %s\n", ts_last_error());
            continue;
        }
        for (size_t i = 0; i < n_ids; i++)
            printf(i ? " %d" : "%d", (int)ids[i]);
        putchar('\t');
        print_decodes(t, ids, n_ids, false);
        putchar('\n');
        free(ids);
    }
    free(line);
    return 0;
}

static int cmd_decode(const ts_tokenizer *t, FILE *f, bool skip) {
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) {
        int32_t *ids = malloc((strlen(line) / 2 + 2) * sizeof *ids);
        size_t n = 0;
        char *p = line, *end;
        for (long v; (v = strtol(p, &end, 10)), end != p; p = end)
            ids[n++] = (int32_t)v;
        print_decodes(t, ids, n, skip);
        putchar('\n');
        free(ids);
    }
    free(line);
    return 0;
}

static int cmd_chat(const ts_tokenizer *t, FILE *f) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) >= 0) {
        long n = dump_unhex(line, (size_t)got);
        if (n < 0) continue;
        line[n] = 0;
        ts_chat_message msgs[64];
        int nm = 0;
        for (char *rec = line; rec && nm < 64;) {
            char *next = strchr(rec, '\x1e');
            if (next) *next++ = 0;
            char *sep = strchr(rec, '\x1f');
            if (sep) {
                *sep = 0;
                msgs[nm++] = (ts_chat_message){.role = rec, .content = sep + 1};
            }
            rec = next;
        }
        ts_chat_params p = {.add_generation_prompt = true, .enable_thinking = -1};
        int32_t *ids;
        size_t n_ids;
        if (ts_chat_tokenize(t, msgs, nm, &p, &ids, &n_ids) != TS_OK) {
            printf("ERR %s\n", ts_last_error());
            continue;
        }
        for (size_t i = 0; i < n_ids; i++)
            printf(i ? " %d" : "%d", (int)ids[i]);
        putchar('\n');
        free(ids);
    }
    free(line);
    return 0;
}

static int cmd_bench(const ts_tokenizer *t, const char *path, int repeat) {
    FILE *f = fopen(path, "rb");
    if (!f) return fprintf(stderr, "cannot open %s\n", path), 1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)size + 1);
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) return fclose(f), 1;
    fclose(f);
    double best = 1e30;
    size_t n_ids = 0;
    for (int r = 0; r < repeat; r++) {
        int32_t *ids;
        double t0 = dump_now_s();
        if (ts_tokenize(t, buf, (size_t)size, false, &ids, &n_ids) != TS_OK)
            return fprintf(stderr, "%s\n", ts_last_error()), 1;
        double dt = dump_now_s() - t0;
        if (dt < best) best = dt;
        free(ids);
    }
    printf("{\"bytes\": %ld, \"tokens\": %zu, \"best_s\": %.6f, \"mb_per_s\": %.3f}\n", size, n_ids,
           best, (double)size / best / 1e6);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr,
                "usage: ts_tok_dump encode|decode|chat|bench|info [opts] TOKENIZER [FILE]\n");
        return 2;
    }
    const char *cmd = argv[1];
    bool no_special = false, skip = false;
    int repeat = 3, i = 2;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--no-special") == 0)
            no_special = true;
        else if (strcmp(argv[i], "--skip-special") == 0)
            skip = true;
        else if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc)
            repeat = atoi(argv[++i]);
    }
    if (i >= argc) return 2;
    double t0 = dump_now_s();
    ts_tokenizer *t;
    if (ts_tokenizer_open(argv[i], &t) != TS_OK) {
        fprintf(stderr, "%s\n", ts_last_error());
        return 1;
    }
    double load = dump_now_s() - t0;
    int rc = 0;
    FILE *in = stdin;
    if (strcmp(cmd, "info") != 0 && i + 1 < argc && strcmp(cmd, "bench") != 0) {
        in = fopen(argv[i + 1], "rb");
        if (!in) return fprintf(stderr, "cannot open %s\n", argv[i + 1]), 1;
    }
    if (strcmp(cmd, "encode") == 0) {
        rc = cmd_encode(t, in, !no_special);
    } else if (strcmp(cmd, "decode") == 0) {
        rc = cmd_decode(t, in, skip);
    } else if (strcmp(cmd, "chat") == 0) {
        rc = cmd_chat(t, in);
    } else if (strcmp(cmd, "bench") == 0) {
        rc = i + 1 < argc ? cmd_bench(t, argv[i + 1], repeat) : 2;
    } else if (strcmp(cmd, "info") == 0) {
        int32_t *ids;
        size_t n;
        if (ts_tokenize(t, "", 0, false, &ids, &n) != TS_OK) return 1;
        printf("{\"vocab_size\": %d, \"empty\": [", ts_tokenizer_vocab_size(t));
        for (size_t k = 0; k < n; k++)
            printf(k ? ", %d" : "%d", (int)ids[k]);
        ts_fim_tokens f;
        bool fim = ts_tokenizer_fim(t, &f);
        printf("], \"fim\": %s, \"fim_ids\": [%d, %d, %d, %d, %d, %d]", fim ? "true" : "false",
               (int)f.prefix, (int)f.suffix, (int)f.middle, (int)f.pad, (int)f.repo,
               (int)f.file_sep);
        printf(", \"load_s\": %.3f}\n", load);
        free(ids);
    } else {
        rc = 2;
    }
    if (in != stdin) fclose(in);
    ts_tokenizer_free(t);
    return rc;
}
