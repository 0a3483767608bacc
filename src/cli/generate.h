/* The decode loop shared by `run` and `chat`: sample, stream text, feed the token back. */
#ifndef TS_CLI_GENERATE_H
#define TS_CLI_GENERATE_H

#include "cli/cli.h"

typedef struct {
    ts_engine *engine;
    int slot;
    ts_sampler *sampler;
    const ts_tokenizer *tok; /* NULL: no end-of-generation stop */
    ts_detokenizer *detok;   /* NULL: no text output */
    bool stop_at_eog;
    bool feed_last; /* also run the final token through the model (to continue later) */
    int32_t *ids_out; /* NULL or room for max_new ids */
    /* NULL, or the grammar every token must follow (drawn on the host from the masked
     * logits); the generation ends once its text is complete and nothing may follow */
    ts_grammar_matcher *gm;
    /* rotary positions of a generated token: its place plus this (after an image; 0 = none) */
    int32_t rope_delta;
    /* NULL, or the thinking's tags followed and its budget kept (the tokens it puts in are
     * taken instead of the draws); with show_think the thinking is printed between <think>
     * and </think> (dimmed on a terminal), which the detokenizer would leave out */
    ts_think_budget *think;
    bool show_think;
} cli_gen;

typedef struct {
    int n_generated;
    double seconds; /* decode time, from the first sample to the end */
    bool stopped_at_eog;
} cli_gen_result;

/* logits holds the next token's logits on entry (n_vocab floats); with feed_last it holds the
 * logits after the final token on return. pos is the position of the first generated token.
 * Returns TS_OK or the engine's error. */
ts_status cli_generate(const cli_gen *g, float *logits, int pos, int max_new, cli_gen_result *r);

/* Parses a sampling option at argv[*i] into sp: --temp T (0..100), --top-k K (0 = off),
 * --top-p P (0 < P <= 1), --min-p P (0..1), --seed S. Returns 1 when it consumed one, 0 when
 * argv[*i] is none of them, -1 (after printing the usage line) on a bad value. */
int cli_sampler_opt(int argc, char **argv, int *i, ts_sampler_params *sp);

#endif
