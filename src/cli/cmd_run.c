/* tessera run: prefill a prompt, then decode N tokens one at a time with the sampler. */
#include "cli/common_model.h"
#include "cli/generate.h"
#include "cli/images.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_run(int argc, char **argv) {
    cli_engine_args ea = {.model_path = cli_default_model()};
    const char *ids_arg = NULL, *prompt = NULL, *schema_path = NULL, *gbnf_path = NULL, *v;
    bool json_mode = false;
    long n_gen = 16;
    bool print_ids = false, special = false, ignore_eos = false;
    cli_images ci = {0};
    ts_sampler_params sp;
    ts_sampler_params_default(&sp);
    for (int i = 1; i < argc; i++) {
        int r = cli_engine_opt(argc, argv, &i, &ea);
        if (r == 0) r = cli_sampler_opt(argc, argv, &i, &sp);
        if (r < 0) return CLI_EXIT_USAGE;
        if (r > 0) continue;
        if ((v = cli_opt_value(argc, argv, &i, NULL, "--ids"))) {
            ids_arg = v;
        } else if ((v = cli_opt_value(argc, argv, &i, "-p", "--prompt"))) {
            prompt = v;
        } else if (strcmp(argv[i], "--special") == 0) {
            special = true;
        } else if (strcmp(argv[i], "--ignore-eos") == 0) {
            ignore_eos = true;
        } else if ((v = cli_opt_value(argc, argv, &i, "-n", "--n-predict"))) {
            if (!cli_parse_int(v, 0, 1 << 24, &n_gen)) return cli_usage("bad -n '%s'", v);
        } else if (strcmp(argv[i], "--json") == 0) {
            json_mode = true;
        } else if ((v = cli_opt_value(argc, argv, &i, NULL, "--json-schema"))) {
            schema_path = v;
        } else if ((v = cli_opt_value(argc, argv, &i, NULL, "--grammar"))) {
            gbnf_path = v;
        } else if (!strcmp(argv[i], "--image") || !strcmp(argv[i], "--video")) {
            bool video = argv[i][2] == 'v';
            v = cli_opt_value(argc, argv, &i, NULL, argv[i]);
            if (ci.n == CLI_MAX_IMAGES)
                return cli_usage("run: at most %d images and videos", CLI_MAX_IMAGES);
            ci.video[ci.n] = video;
            ci.path[ci.n++] = v;
        } else if (strcmp(argv[i], "--print-ids") == 0) {
            print_ids = true;
        } else {
            return cli_usage("run: unknown option '%s'", argv[i]);
        }
    }
    int32_t *ids = NULL;
    int n_prompt = 0;
    ts_tokenizer *tok = NULL;
    ts_detokenizer *detok = NULL;
    if (!!ids_arg == !!prompt) return cli_usage("run needs one of --ids 1,2,3 or -p TEXT");
    if ((json_mode || schema_path || gbnf_path) && !prompt)
        return cli_usage("run: --json, --json-schema and --grammar need -p TEXT (the tokenizer)");
    if (json_mode + !!schema_path + !!gbnf_path > 1)
        return cli_usage("run: one of --json, --json-schema, --grammar");
    ts_grammar *grammar = NULL;
    if (json_mode || schema_path || gbnf_path) {
        char *text = NULL;
        size_t len = 0;
        const char *path = schema_path ? schema_path : gbnf_path;
        if (path && !cli_read_file(path, (size_t)16 << 20, &text, &len))
            return cli_usage("run: cannot read '%s'", path);
        ts_status st = gbnf_path ? ts_grammar_from_gbnf(text, len, &grammar)
                                 : ts_grammar_from_json_schema(text, len, &grammar);
        free(text);
        if (st != TS_OK) return cli_usage("run: %s", ts_last_error());
    }
    if (ids_arg && !cli_parse_ids(ids_arg, &ids, &n_prompt)) {
        ts_grammar_free(grammar);
        return cli_usage("run: --ids needs a comma-separated list of token ids");
    }
    /* images: planned first, since each takes the tokens its plan says */
    int rc = ci.n ? cli_images_load(&ci, ea.model_path) : 0;
    if (rc) {
        free(ids);
        cli_images_free(&ci);
        ts_grammar_free(grammar);
        return rc;
    }
    if (prompt) {
        size_t n;
        if (!ea.model_path) return cli_usage("missing -m MODEL");
        if (ts_tokenizer_open(ea.model_path, &tok) != TS_OK) {
            ts_grammar_free(grammar);
            return cli_fail("cannot load tokenizer");
        }
        /* with images the prompt is one user turn of a chat: the images, then the text */
        rc = ci.n ? cli_images_prompt(&ci, tok, prompt, &ids, &n)
             : ts_tokenize(tok, prompt, strlen(prompt), special, &ids, &n) != TS_OK
                 ? cli_fail("tokenize")
                 : 0;
        if (rc) {
            ts_tokenizer_free(tok);
            ts_grammar_free(grammar);
            cli_images_free(&ci);
            return rc;
        }
        n_prompt = (int)n;
        if (n_prompt == 0) {
            free(ids);
            ts_tokenizer_free(tok);
            ts_grammar_free(grammar);
            cli_images_free(&ci);
            return cli_usage("run: the prompt is empty");
        }
    }
    if (!ea.n_ctx) ea.n_ctx = n_prompt + (int)n_gen;
    ts_model *model;
    ts_engine *engine;
    rc = cli_open(&ea, &model, &engine);
    if (rc) {
        free(ids);
        ts_tokenizer_free(tok);
        ts_grammar_free(grammar);
        cli_images_free(&ci);
        return rc;
    }
    ts_grammar_vocab *gvocab = NULL;
    ts_grammar_matcher *gm = NULL;
    int V = ts_engine_n_vocab(engine);
    ts_sampler *sampler = NULL;
    int32_t *pos = malloc((size_t)n_prompt * sizeof *pos), *slot = calloc((size_t)n_prompt, 4);
    int32_t *out = malloc(((size_t)n_gen + 1) * sizeof *out);
    float *logits = malloc((size_t)V * sizeof(float));
    if (tok && ts_tokenizer_vocab_size(tok) > V) {
        fprintf(stderr, "tessera: run: the tokenizer has %d tokens, the model only %d\n",
                ts_tokenizer_vocab_size(tok), V);
        rc = CLI_EXIT_ERROR;
        goto done;
    }
    if (tok && !print_ids && ts_detokenizer_create(tok, true, &detok) != TS_OK) {
        rc = cli_fail("detokenizer");
        goto done;
    }
    if (!pos || !slot || !out || !logits) {
        fprintf(stderr, "tessera: run: out of memory\n");
        rc = CLI_EXIT_ERROR;
        goto done;
    }
    if (ts_sampler_create(&sp, V, &sampler) != TS_OK) {
        rc = cli_fail("sampler");
        goto done;
    }
    if (grammar && (ts_grammar_vocab_create(tok, NULL, 0, &gvocab) != TS_OK ||
                    ts_grammar_matcher_create(grammar, gvocab, &gm) != TS_OK)) {
        rc = cli_fail("grammar");
        goto done;
    }
    for (int i = 0; i < n_prompt; i++) pos[i] = i;
    ts_batch pb = {n_prompt, ids, pos, slot, NULL, NULL, NULL};
    if (ci.n) { /* the vision tower runs here, before the prompt's clock starts */
        ts_model_info info;
        ts_model_get_info(model, &info);
        if ((rc = cli_images_bind(&ci, engine, info.n_embd, ids, n_prompt, 0))) goto done;
        pb.embd = ci.rows, pb.rope_pos = ci.rope;
    }
    double t0 = cli_now();
    if (ts_engine_forward(engine, &pb, logits) != TS_OK) {
        rc = cli_fail("prefill failed");
        goto done;
    }
    double t_prefill = cli_now() - t0;
    cli_gen g = {engine, 0,   sampler, tok,      detok, tok && !ignore_eos,
                 false,  out, gm,      ci.delta, NULL,  false};
    cli_gen_result gr;
    if (cli_generate(&g, logits, n_prompt, (int)n_gen, &gr) != TS_OK) {
        rc = cli_fail("decode failed");
        goto done;
    }
    int n_out = gr.n_generated;
    double t_decode = gr.seconds;
    if (print_ids || !detok) {
        if (!print_ids) printf("generated:");
        for (int i = 0; i < n_out; i++) printf(i || !print_ids ? " %d" : "%d", out[i]);
    }
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "prompt %d tokens in %.1f ms (%.1f t/s), %d generated in %.1f ms (%.2f t/s), %s\n",
            n_prompt, t_prefill * 1e3, n_prompt / t_prefill, n_out, t_decode * 1e3,
            n_out > 0 ? n_out / t_decode : 0.0, ts_engine_describe(engine));
done:
    cli_images_free(&ci);
    ts_grammar_matcher_free(gm);
    ts_grammar_vocab_free(gvocab);
    ts_grammar_free(grammar);
    ts_detokenizer_free(detok);
    ts_tokenizer_free(tok);
    ts_sampler_free(sampler);
    free(ids);
    free(pos);
    free(slot);
    free(out);
    free(logits);
    ts_engine_free(engine);
    ts_model_close(model);
    return rc;
}
