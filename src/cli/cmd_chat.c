/* tessera chat: an interactive multi-turn chat in the terminal. Tokens stream as they come;
 * the conversation's state stays in the engine between turns, so each turn prefills only its
 * own tokens; tokens/s is shown after each answer. Commands: /reset, /exit (or end of input). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/common_model.h"
#include "cli/generate.h"

typedef struct {
    ts_engine *engine;
    const ts_tokenizer *tok;
    int32_t im_end, newline;
} chat_ctx;

/* Prefills ids on slot 0 after what it holds; logits of the last one land in logits. */
static ts_status prefill(chat_ctx *c, const int32_t *ids, int n, float *logits) {
    int base = ts_engine_slot_len(c->engine, 0);
    int32_t *pos = malloc((size_t)n * sizeof *pos), *slot = calloc((size_t)n, sizeof *slot);
    if (!pos || !slot) {
        free(pos);
        free(slot);
        return TS_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++) pos[i] = base + i;
    ts_batch b = {n, ids, pos, slot, NULL, NULL, NULL};
    ts_status st = ts_engine_forward(c->engine, &b, logits);
    free(pos);
    free(slot);
    return st;
}

/* The id of text when it is one token (a BOS the tokenizer adds is not counted), else -1. */
static int32_t single_token(const ts_tokenizer *tok, const char *text, int32_t bos) {
    int32_t *ids, id = -1;
    size_t n;
    if (ts_tokenize(tok, text, strlen(text), true, &ids, &n) != TS_OK) return -1;
    size_t skip = n > 0 && ids[0] == bos ? 1 : 0;
    if (n - skip == 1) id = ids[skip];
    free(ids);
    return id;
}

int cmd_chat(int argc, char **argv) {
    cli_engine_args ea = {.model_path = cli_default_model()};
    const char *system = NULL, *v;
    long max_new = 512;
    int thinking = -1;
    ts_sampler_params sp;
    ts_sampler_params_default(&sp);
    sp.temperature = 0.7f;
    sp.top_k = 20;
    sp.top_p = 0.95f;
    for (int i = 1; i < argc; i++) {
        int r = cli_engine_opt(argc, argv, &i, &ea);
        if (r == 0) r = cli_sampler_opt(argc, argv, &i, &sp);
        if (r < 0) return CLI_EXIT_USAGE;
        if (r > 0) continue;
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--system"))) {
            system = v;
        } else if (strcmp(argv[i], "--think") == 0) {
            thinking = 1;
        } else if (strcmp(argv[i], "--no-think") == 0) {
            thinking = 0;
        } else if ((v = cli_opt_value(argc, argv, &i, "-n", "--n-predict"))) {
            if (!cli_parse_int(v, 1, 1 << 20, &max_new)) return cli_usage("bad -n '%s'", v);
        } else {
            return cli_usage("chat: unknown option '%s'", argv[i]);
        }
    }
    if (!ea.model_path) return cli_usage("missing -m MODEL");
    ts_tokenizer *tok;
    if (ts_tokenizer_open(ea.model_path, &tok) != TS_OK) return cli_fail("cannot load tokenizer");
    ts_model *model;
    ts_engine *engine;
    int rc = cli_open(&ea, &model, &engine);
    if (rc) {
        ts_tokenizer_free(tok);
        return rc;
    }
    /* the BOS the format writes at the very start (Gemma), which later turns must not repeat,
     * and the token that closes a turn */
    int32_t bos = -1;
    {
        int32_t *b;
        size_t nb;
        if (ts_tokenize(tok, "", 0, false, &b, &nb) == TS_OK) {
            if (nb == 1) bos = b[0];
            free(b);
        }
    }
    int32_t close_id = single_token(tok, "<end_of_turn>", bos);
    if (close_id < 0) close_id = single_token(tok, "<|im_end|>", bos);
    chat_ctx c = {engine, tok, close_id, single_token(tok, "\n", bos)};
    int V = ts_engine_n_vocab(engine), n_ctx = ts_engine_n_ctx(engine);
    float *logits = malloc((size_t)V * sizeof *logits);
    ts_sampler *sampler = NULL;
    ts_detokenizer *detok = NULL;
    char *line = NULL;
    size_t cap = 0;
    if (!logits || c.im_end < 0 || c.newline < 0 || ts_tokenizer_vocab_size(tok) > V) {
        fprintf(stderr, "tessera: chat: the model's tokenizer has no chat format\n");
        rc = CLI_EXIT_ERROR;
        goto done;
    }
    if (ts_sampler_create(&sp, V, &sampler) != TS_OK ||
        ts_detokenizer_create(tok, true, &detok) != TS_OK) {
        rc = cli_fail("chat");
        goto done;
    }
    printf("tessera chat (%s, context %d). /reset starts over, /exit quits.\n",
           ts_engine_describe(engine), n_ctx);
    bool first = true;
    for (;;) {
        printf("> ");
        fflush(stdout);
        ssize_t len = getline(&line, &cap, stdin);
        if (len < 0) break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        if (strcmp(line, "/exit") == 0) break;
        if (strcmp(line, "/reset") == 0) {
            ts_engine_slot_clear(engine, 0);
            first = true;
            printf("(conversation cleared)\n");
            continue;
        }
        /* the new turn: the whole first turn, later only "\n" + this user turn, since the
         * state already holds everything up to the previous <|im_end|> */
        ts_chat_message msgs[2];
        int nm = 0;
        if (first && system) msgs[nm++] = (ts_chat_message){.role = "system", .content = system};
        msgs[nm++] = (ts_chat_message){.role = "user", .content = line};
        ts_chat_params cp = {.add_generation_prompt = true, .enable_thinking = thinking};
        int32_t *ids;
        size_t n;
        if (ts_chat_tokenize(tok, msgs, nm, &cp, &ids, &n) != TS_OK) {
            fprintf(stderr, "tessera: chat: %s\n", ts_last_error());
            continue;
        }
        int32_t *turn = malloc((n + 1) * sizeof *turn);
        int nt = 0;
        size_t skip = 0;
        if (!first) {
            turn[nt++] = c.newline; /* the newline that follows the previous turn's end */
            if (n > 0 && ids[0] == bos) skip = 1;
        }
        memcpy(turn + nt, ids + skip, (n - skip) * sizeof *ids);
        nt += (int)(n - skip);
        free(ids);
        if (ts_engine_slot_len(engine, 0) + nt + 1 >= n_ctx) {
            printf("(the conversation is longer than the context of %d tokens; starting over)\n",
                   n_ctx);
            ts_engine_slot_clear(engine, 0);
            free(turn);
            first = true;
            continue;
        }
        double t0 = cli_now();
        ts_status st = prefill(&c, turn, nt, logits);
        double t_prefill = cli_now() - t0;
        free(turn);
        if (st != TS_OK) {
            rc = cli_fail("prefill");
            break;
        }
        first = false;
        int room = n_ctx - ts_engine_slot_len(engine, 0) - 1;
        cli_gen g = {engine, 0, sampler, tok, detok, true, true, NULL, NULL, 0};
        cli_gen_result gr;
        if (cli_generate(&g, logits, ts_engine_slot_len(engine, 0),
                         (int)(max_new < room ? max_new : room), &gr) != TS_OK) {
            rc = cli_fail("decode");
            break;
        }
        if (!gr.stopped_at_eog) { /* close the turn so the next one follows the format */
            int32_t p = ts_engine_slot_len(engine, 0), s0 = 0;
            ts_batch b = {1, &c.im_end, &p, &s0, NULL, NULL, NULL};
            if (p < n_ctx && ts_engine_forward(engine, &b, logits) != TS_OK) {
                rc = cli_fail("decode");
                break;
            }
        }
        printf("\n[%d tokens, %.1f tokens/s; prompt %d tokens in %.0f ms]\n", gr.n_generated,
               gr.seconds > 0 ? gr.n_generated / gr.seconds : 0.0, nt, t_prefill * 1e3);
    }
done:
    free(line);
    free(logits);
    ts_detokenizer_free(detok);
    ts_sampler_free(sampler);
    ts_engine_free(engine);
    ts_model_close(model);
    ts_tokenizer_free(tok);
    return rc;
}
