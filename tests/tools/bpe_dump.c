/* Test driver for the BPE tokenizer, used by tests/py/test_tokenizer_parity.py and
 * bench/tokenizer_bench.py.
 *
 *   ts_bpe_dump encode [--no-special] TOKENIZER_JSON STRINGS
 *       STRINGS has one string per line, hex-encoded (so it can hold any bytes, including
 *       newlines and ill-formed UTF-8). Prints one line per string:
 *         ids (space-separated) TAB hex(decode(ids)) TAB hex(streamed decode(ids))
 *       or "ERR <status> <message>" when encoding fails.
 *   ts_bpe_dump split [--no-special] TOKENIZER_JSON STRINGS
 *       Like encode, but prints the pre-tokens instead of ids: each piece's bytes in hex
 *       (after normalization), an added token as #id, separated by spaces.
 *   ts_bpe_dump decode [--skip-special] TOKENIZER_JSON IDS
 *       IDS has space-separated ids per line. Prints lines in the same format as encode.
 *   ts_bpe_dump bench [--lines] [--repeat N] TOKENIZER_JSON TEXT_FILE
 *       Encodes the file (as one string, or line by line with each '\n' kept) N times on
 *       one thread; prints a JSON line with bytes, tokens, first and best wall seconds, best
 *       CPU seconds of the thread, and MB/s by each.
 *   ts_bpe_dump info TOKENIZER_JSON
 *       Prints the vocabulary size and the load time. */
#include "text/bpe_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dump_util.h"

/* Prints TAB hex(decode) TAB hex(streamed decode). */
static int print_decodes(const ts_bpe *t, const ts_ids *ids, bool skip_special) {
    char *text;
    size_t len;
    if (ts_bpe_decode(t, ids->data, ids->len, skip_special, &text, &len) != TS_OK) {
        printf("\tERR %s", ts_last_error());
        return 1;
    }
    putchar('\t');
    dump_print_hex(text, len);
    free(text);
    ts_token_source src;
    ts_bpe_token_source(t, &src);
    ts_detok *d;
    if (ts_detok_create(&src, skip_special, &d) != TS_OK) return 1;
    putchar('\t');
    for (size_t i = 0; i <= ids->len; i++) {
        const char *piece;
        size_t n;
        ts_status st = i < ids->len ? ts_detok_push(d, ids->data[i], &piece, &n)
                                    : ts_detok_flush(d, &piece, &n);
        if (st != TS_OK) {
            printf("ERR %s", ts_last_error());
            break;
        }
        dump_print_hex(piece, n);
    }
    ts_detok_free(d);
    return 0;
}

static ts_status print_piece(void *ctx, const char *p, size_t n, int32_t added_id) {
    bool *first = ctx;
    if (!*first) putchar(' ');
    *first = false;
    if (added_id >= 0)
        printf("#%d", (int)added_id);
    else
        dump_print_hex(p, n);
    return TS_OK;
}

static int cmd_split(const ts_bpe *t, FILE *in, bool parse_special) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, in)) >= 0) {
        long n = dump_unhex(line, (size_t)got);
        if (n < 0) {
            fprintf(stderr, "malformed hex line\n");
            return 1;
        }
        bool first = true;
        ts_status st = bpe_pretokenize(t, line, (size_t)n, parse_special, print_piece, &first);
        if (st != TS_OK) printf("ERR %s %s", ts_status_name(st), ts_last_error());
        putchar('\n');
    }
    free(line);
    return 0;
}

static int cmd_encode(const ts_bpe *t, FILE *in, bool parse_special) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    ts_ids ids = {0};
    while ((got = getline(&line, &cap, in)) >= 0) {
        long n = dump_unhex(line, (size_t)got);
        if (n < 0) {
            fprintf(stderr, "malformed hex line\n");
            return 1;
        }
        ids.len = 0;
        ts_status st = ts_bpe_encode(t, line, (size_t)n, parse_special, &ids);
        if (st != TS_OK) {
            printf("ERR %s %s\n", ts_status_name(st), ts_last_error());
            continue;
        }
        for (size_t i = 0; i < ids.len; i++)
            printf(i ? " %d" : "%d", (int)ids.data[i]);
        print_decodes(t, &ids, false);
        putchar('\n');
    }
    free(line);
    ts_ids_free(&ids);
    return 0;
}

static int cmd_decode(const ts_bpe *t, FILE *in, bool skip_special) {
    char *line = NULL;
    size_t cap = 0;
    ts_ids ids = {0};
    while (getline(&line, &cap, in) >= 0) {
        ids.len = 0;
        char *p = line, *end;
        for (long v = strtol(p, &end, 10); end != p; v = strtol(p, &end, 10)) {
            ts_ids_push(&ids, (int32_t)v);
            p = end;
        }
        for (size_t i = 0; i < ids.len; i++)
            printf(i ? " %d" : "%d", (int)ids.data[i]);
        print_decodes(t, &ids, skip_special);
        putchar('\n');
    }
    free(line);
    ts_ids_free(&ids);
    return 0;
}

static int cmd_bench(const ts_bpe *t, const char *path, bool lines, int repeat) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        return 1;
    }
    fclose(f);
    ts_ids ids = {0};
    double first = 0, best = 1e30, best_cpu = 1e30;
    for (int r = 0; r < repeat; r++) {
        ids.len = 0;
        double t0 = dump_now_s(), c0 = dump_clock_s(CLOCK_THREAD_CPUTIME_ID);
        if (!lines) {
            if (ts_bpe_encode(t, text, (size_t)size, true, &ids) != TS_OK) goto fail;
        } else {
            for (long i = 0; i < size;) {
                const char *nl = memchr(text + i, '\n', (size_t)(size - i));
                long end = nl ? (long)(nl - text) + 1 : size;
                if (ts_bpe_encode(t, text + i, (size_t)(end - i), true, &ids) != TS_OK) goto fail;
                i = end;
            }
        }
        double dt = dump_now_s() - t0, dc = dump_clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
        if (r == 0) first = dt;
        if (dt < best) best = dt;
        if (dc < best_cpu) best_cpu = dc;
    }
    printf("{\"bytes\": %ld, \"tokens\": %zu, \"mode\": \"%s\", \"first_s\": %.6f, "
           "\"best_s\": %.6f, \"best_cpu_s\": %.6f, \"mb_per_s\": %.3f, "
           "\"cpu_mb_per_s\": %.3f}\n",
           size, ids.len, lines ? "lines" : "whole", first, best, best_cpu,
           (double)size / best / 1e6, (double)size / best_cpu / 1e6);
    free(text);
    ts_ids_free(&ids);
    return 0;
fail:
    fprintf(stderr, "encode failed: %s\n", ts_last_error());
    free(text);
    ts_ids_free(&ids);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s encode|decode|bench|info [options] TOKENIZER_JSON [FILE]\n",
                argv[0]);
        return 2;
    }
    const char *cmd = argv[1];
    bool flag_special = false, lines = false;
    int repeat = 3, i = 2;
    for (; i < argc && argv[i][0] == '-' && argv[i][1] == '-'; i++) {
        if (!strcmp(argv[i], "--no-special") || !strcmp(argv[i], "--skip-special"))
            flag_special = true;
        else if (!strcmp(argv[i], "--lines"))
            lines = true;
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (i >= argc) return 2;
    double t0 = dump_now_s();
    ts_bpe *t;
    if (ts_bpe_load(argv[i], &t) != TS_OK) {
        fprintf(stderr, "%s\n", ts_last_error());
        return 1;
    }
    double load_s = dump_now_s() - t0;
    const char *file = i + 1 < argc ? argv[i + 1] : NULL;
    int rc = 2;
    if (!strcmp(cmd, "info")) {
        printf("{\"vocab_size\": %d, \"load_s\": %.3f}\n", ts_bpe_vocab_size(t), load_s);
        rc = 0;
    } else if (file && !strcmp(cmd, "bench")) {
        rc = cmd_bench(t, file, lines, repeat < 1 ? 1 : repeat);
    } else if (file) {
        FILE *in = strcmp(file, "-") ? fopen(file, "rb") : stdin;
        if (!in) {
            perror(file);
            ts_bpe_free(t);
            return 1;
        }
        if (!strcmp(cmd, "encode")) rc = cmd_encode(t, in, !flag_special);
        if (!strcmp(cmd, "split")) rc = cmd_split(t, in, !flag_special);
        if (!strcmp(cmd, "decode")) rc = cmd_decode(t, in, flag_special);
        if (in != stdin) fclose(in);
    }
    ts_bpe_free(t);
    return rc;
}
