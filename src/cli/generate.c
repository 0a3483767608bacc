#include "cli/generate.h"

#include <stdio.h>
#include <unistd.h>

#define TS_TRY_CLI(expr)                                                                           \
    do {                                                                                           \
        ts_status st_ = (expr);                                                                    \
        if (st_ != TS_OK) return st_;                                                              \
    } while (0)

/* A draw from logits on the host: under the grammar, from the tokens it allows. */
static ts_status host_draw(const cli_gen *g, float *logits, int32_t *tok) {
    if (g->gm) TS_TRY_CLI(ts_grammar_matcher_mask(g->gm, logits, ts_engine_n_vocab(g->engine)));
    *tok = ts_sampler_sample(g->sampler, logits);
    return TS_OK;
}

/* show_think: a tag of the thinking - its text where the detokenizer gave none (printed: a
 * tokenizer that marks the tags special skips them), the thinking dimmed on a terminal. */
static void think_tag(int32_t id, const cli_gen *g, bool before, bool printed) {
    bool open = id == g->think->open, tty = isatty(STDOUT_FILENO);
    if (before) {
        if (open && tty) fputs("\x1b[2m", stdout);
        return;
    }
    if (!printed) fputs(open ? "<think>" : "</think>", stdout);
    if (!open && tty) fputs("\x1b[0m", stdout);
}

/* The token the thinking budget puts in, else -1. */
static int32_t forced(const cli_gen *g) { return g->think ? ts_think_budget_forced(g->think) : -1; }

ts_status cli_generate(const cli_gen *g, float *logits, int pos, int max_new, cli_gen_result *r) {
    *r = (cli_gen_result){0};
    double t0 = cli_now();
    /* the first token from the prompt's logits; each later one drawn by the forward that
     * feeds its predecessor (on a GPU, where the logits are), or under a grammar on the host;
     * a token the thinking budget puts in instead of either */
    int32_t tok = forced(g);
    if (max_new > 0 && tok < 0) TS_TRY_CLI(host_draw(g, logits, &tok));
    bool shown = g->show_think && g->think;
    if (shown && g->think->thinking) { /* the prompt's <think> */
        think_tag(g->think->open, g, true, false);
        think_tag(g->think->open, g, false, false);
    }
    for (int k = 0; k < max_new; k++) {
        if (g->ids_out) g->ids_out[k] = tok;
        r->n_generated++;
        bool eog = g->tok && ts_tokenizer_is_eog(g->tok, tok);
        bool done = false; /* the grammar's text is complete and nothing may follow */
        if (g->gm && !eog) {
            TS_TRY_CLI(ts_grammar_matcher_accept(g->gm, tok));
            done = ts_grammar_matcher_done(g->gm);
        }
        bool tag = shown && !eog && (tok == g->think->open || tok == g->think->close);
        if (tag) think_tag(tok, g, true, false);
        size_t len = 0;
        if (g->detok && !eog) {
            const char *text;
            if (ts_detokenizer_push(g->detok, tok, &text, &len) == TS_OK && len) {
                fwrite(text, 1, len, stdout);
                fflush(stdout);
            }
        }
        if (tag) think_tag(tok, g, false, len > 0);
        if (g->think)
            ts_think_budget_token(g->think, tok, g->detok && ts_detokenizer_mid_char(g->detok));
        bool last = k + 1 == max_new || (eog && g->stop_at_eog) || done;
        if (!last || g->feed_last) {
            int32_t p = pos + k, s = g->slot, next = -1, rp = p + g->rope_delta;
            int32_t rope[3] = {rp, rp, rp};
            ts_batch b = {1, &tok, &p, &s, NULL, NULL, g->rope_delta ? rope : NULL};
            ts_status st = last || g->gm
                               ? ts_engine_forward(g->engine, &b, logits)
                               : ts_engine_forward_sample(g->engine, &b, &g->sampler, &next);
            if (st != TS_OK) return st;
            int32_t f = forced(g);
            if (f >= 0)
                next = f;
            else if (!last && g->gm)
                TS_TRY_CLI(host_draw(g, logits, &next));
            tok = next;
        }
        if ((eog && g->stop_at_eog) || done) {
            r->stopped_at_eog = true;
            break;
        }
    }
    if (g->detok) {
        const char *text;
        size_t len;
        if (ts_detokenizer_flush(g->detok, &text, &len) == TS_OK && len) fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    r->seconds = cli_now() - t0;
    return TS_OK;
}

static int bad_sampler_value(const char *fmt, const char *v) {
    cli_usage(fmt, v);
    return -1;
}

int cli_sampler_opt(int argc, char **argv, int *i, ts_sampler_params *sp) {
    const char *v;
    double d;
    long x;
    if ((v = cli_opt_value(argc, argv, i, NULL, "--temp"))) {
        if (!cli_parse_float(v, &d) || d < 0 || d > 100)
            return bad_sampler_value("bad --temp '%s'", v);
        sp->temperature = (float)d;
    } else if ((v = cli_opt_value(argc, argv, i, NULL, "--top-k"))) {
        if (!cli_parse_int(v, 0, 1 << 24, &x)) return bad_sampler_value("bad --top-k '%s'", v);
        sp->top_k = (int)x;
    } else if ((v = cli_opt_value(argc, argv, i, NULL, "--top-p"))) {
        if (!cli_parse_float(v, &d) || !(d > 0 && d <= 1))
            return bad_sampler_value("bad --top-p '%s'", v);
        sp->top_p = (float)d;
    } else if ((v = cli_opt_value(argc, argv, i, NULL, "--min-p"))) {
        if (!cli_parse_float(v, &d) || !(d >= 0 && d <= 1))
            return bad_sampler_value("bad --min-p '%s'", v);
        sp->min_p = (float)d;
    } else if ((v = cli_opt_value(argc, argv, i, NULL, "--seed"))) {
        if (!cli_parse_int(v, 0, 0x7fffffffL, &x)) return bad_sampler_value("bad --seed '%s'", v);
        sp->seed = (uint64_t)x;
    } else {
        return 0;
    }
    return 1;
}
