/* tessera tokenize / detokenize: the model's tokenizer from the command line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *v;
    bool special = false;
    for (int i = 1; i < argc; i++) {
        if ((v = cli_opt_value(argc, argv, &i, "-m", "--model")))
            model = v;
        else if (strcmp(argv[i], "--special") == 0)
            special = true;
        else if (!text && argv[i][0] != '-')
            text = argv[i];
        else
            return cli_usage("tokenize: unexpected argument '%s'", argv[i]);
    }
    if (!model || !*model || !text) return cli_usage("tokenize needs -m MODEL and TEXT");
    ts_tokenizer *tok;
    if (ts_tokenizer_open(model, &tok) != TS_OK) return cli_fail("cannot load tokenizer");
    int32_t *ids;
    size_t n;
    int rc = 0;
    if (ts_tokenize(tok, text, strlen(text), special, &ids, &n) != TS_OK) {
        rc = cli_fail("tokenize");
    } else {
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
        free(ids);
    }
    ts_tokenizer_free(tok);
    return rc;
}

int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL, *v;
    bool skip = false;
    int32_t *ids = malloc((size_t)argc * sizeof *ids);
    int n = 0;
    if (!ids) return CLI_EXIT_ERROR;
    for (int i = 1; i < argc; i++) {
        long x;
        if ((v = cli_opt_value(argc, argv, &i, "-m", "--model"))) {
            model = v;
        } else if (strcmp(argv[i], "--skip-special") == 0) {
            skip = true;
        } else if (cli_parse_int(argv[i], 0, INT32_MAX, &x)) {
            ids[n++] = (int32_t)x;
        } else {
            free(ids);
            return cli_usage("detokenize: '%s' is not a token id", argv[i]);
        }
    }
    if (!model || !*model) {
        free(ids);
        return cli_usage("detokenize needs -m MODEL and ids");
    }
    ts_tokenizer *tok;
    if (ts_tokenizer_open(model, &tok) != TS_OK) {
        free(ids);
        return cli_fail("cannot load tokenizer");
    }
    char *text;
    size_t len;
    int rc = 0;
    if (ts_detokenize(tok, ids, (size_t)n, skip, &text, &len) != TS_OK) {
        rc = cli_fail("detokenize");
    } else {
        fwrite(text, 1, len, stdout);
        printf("\n");
        free(text);
    }
    free(ids);
    ts_tokenizer_free(tok);
    return rc;
}
