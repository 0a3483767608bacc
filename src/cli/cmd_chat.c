/* tessera chat: an interactive multi-turn chat in the terminal. Tokens stream as they come;
 * the conversation's state stays in the engine between turns, so each turn prefills only its
 * own tokens; tokens/s is shown after each answer. Commands: /image FILE and /video FILE (attach
 * an image or a video to the next message, with a model that takes them), /reset, /exit (or end
 * of input). */
#include "cli/common_model.h"
#include "cli/generate.h"
#include "cli/images.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ts_engine *engine;
    const ts_tokenizer *tok;
    int32_t im_end, newline;
    int32_t think[2]; /* <think>, </think>; -1 where the vocabulary has none */
    bool vision;      /* the engine takes images */
    int n_embd;
    cli_images ci; /* the images the next message carries; ci.vinfo: the model's */
    char *paths[CLI_MAX_IMAGES];
    /* the rotary positions of the slot's next token: its place plus delta (Qwen3.5's MRoPE
     * after an image: an image of r x c merged tokens advances them by max(r, c), not r * c) */
    int32_t delta;
} chat_ctx;

/* Prefills ids on slot 0 after what it holds; logits of the last one land in logits. rows and
 * rope: the images' rows and every token's rotary positions (cli_images_bind), or NULL: then
 * rotary positions are the places plus c->delta. */
static ts_status prefill(chat_ctx *c, const int32_t *ids, int n, const float *const *rows,
                         const int32_t *rope, float *logits) {
    int base = ts_engine_slot_len(c->engine, 0);
    int32_t *pos = malloc((size_t)n * sizeof *pos), *slot = calloc((size_t)n, sizeof *slot);
    int32_t *own = !rope && c->delta ? malloc((size_t)n * 3 * sizeof *own) : NULL;
    if (!pos || !slot || (!rope && c->delta && !own)) {
        free(pos);
        free(slot);
        free(own);
        return TS_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++) pos[i] = base + i;
    for (int i = 0; own && i < 3 * n; i++)
        own[i] = base + i / 3 + c->delta;
    ts_batch b = {n, ids, pos, slot, NULL, rows, rope ? rope : own};
    ts_status st = ts_engine_forward(c->engine, &b, logits);
    free(pos);
    free(slot);
    free(own);
    return st;
}

/* Drops the images not yet sent. */
static void drop_images(chat_ctx *c) {
    for (int k = 0; k < CLI_MAX_IMAGES; k++) {
        free(c->paths[k]);
        c->paths[k] = NULL;
        c->ci.path[k] = NULL;
    }
    cli_images_free(&c->ci);
}

/* /image FILE, /video FILE: reads and plans the file for the next message. Returns false
 * (after saying why) when it cannot be taken. */
static bool attach(chat_ctx *c, const char *path, bool video) {
    const char *what = video ? "video" : "image";
    if (c->vision && video && c->ci.vinfo.video_refused[0]) {
        printf("(this model takes no videos: %s)\n", c->ci.vinfo.video_refused);
        return false;
    }
    if (!c->vision || (video && c->ci.vinfo.video_token < 0)) {
        printf("(this model takes no %ss here: it has no vision tower, or its device runs "
               "none)\n",
               what);
        return false;
    }
    if (!*path) {
        printf("(usage: /%s FILE)\n", what);
        return false;
    }
    if (c->ci.n == CLI_MAX_IMAGES) {
        printf("(at most %d images and videos a message)\n", CLI_MAX_IMAGES);
        return false;
    }
    int k = c->ci.n;
    c->paths[k] = strdup(path);
    c->ci.path[k] = c->paths[k];
    c->ci.video[k] = video;
    if (!c->paths[k] || cli_images_read(&c->ci, k) != 0) {
        free(c->paths[k]);
        c->paths[k] = NULL;
        c->ci.path[k] = NULL;
        return false;
    }
    c->ci.n++;
    if (video)
        printf("(video %s: %d frames sampled, %d steps of %dx%d, %d tokens; it goes with your "
               "next message)\n",
               path, c->ci.vplan[k].n_frames, c->ci.vplan[k].n_steps, c->ci.vplan[k].step.width,
               c->ci.vplan[k].step.height, c->ci.tokens[k]);
    else
        printf("(image %s: %dx%d, %d tokens; it goes with your next message)\n", path,
               c->ci.img[k]->width, c->ci.img[k]->height, c->ci.tokens[k]);
    return true;
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
    const char *system = NULL, *v, *image_args[CLI_MAX_IMAGES];
    bool video_arg[CLI_MAX_IMAGES];
    int n_image_args = 0;
    long max_new = 512;
    int thinking = -1;
    long think_budget = -1;
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
        } else if ((v = cli_opt_value(argc, argv, &i, NULL, "--think-budget"))) {
            if (!cli_parse_int(v, -1, 1 << 30, &think_budget))
                return cli_usage("bad --think-budget '%s'", v);
        } else if (!strcmp(argv[i], "--image") || !strcmp(argv[i], "--video")) {
            bool video = argv[i][2] == 'v';
            v = cli_opt_value(argc, argv, &i, NULL, argv[i]);
            if (n_image_args == CLI_MAX_IMAGES)
                return cli_usage("chat: at most %d images and videos", CLI_MAX_IMAGES);
            video_arg[n_image_args] = video;
            image_args[n_image_args++] = v;
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
    chat_ctx c = {.engine = engine,
                  .tok = tok,
                  .im_end = close_id,
                  .newline = single_token(tok, "\n", bos),
                  .think = {single_token(tok, "<think>", bos), single_token(tok, "</think>", bos)},
                  .vision = ts_engine_vision(engine) && ts_model_vision(model, NULL)};
    if (c.vision) {
        ts_model_info mi;
        ts_model_get_info(model, &mi);
        ts_model_vision(model, &c.ci.vinfo);
        c.n_embd = mi.n_embd;
    }
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
    printf("tessera chat (%s, context %d). %s/reset starts over, /exit quits.\n",
           ts_engine_describe(engine), n_ctx,
           c.vision ? "/image FILE or /video FILE attaches one to your next message, " : "");
    for (int k = 0; k < n_image_args; k++)
        if (!attach(&c, image_args[k], video_arg[k])) {
            rc = CLI_EXIT_USAGE;
            goto done;
        }
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
            first = true, c.delta = 0;
            printf("(conversation cleared%s)\n", c.ci.n ? "; the images not yet sent dropped" : "");
            drop_images(&c);
            continue;
        }
        if ((strncmp(line, "/image", 6) == 0 || strncmp(line, "/video", 6) == 0) &&
            (line[6] == ' ' || line[6] == 0)) {
            const char *path = line + 6;
            while (*path == ' ')
                path++;
            attach(&c, path, line[1] == 'v');
            continue;
        }
        /* the new turn: the whole first turn, later only "\n" + this user turn, since the
         * state already holds everything up to the previous <|im_end|> */
        ts_chat_message msgs[2];
        int nm = 0;
        if (first && system) msgs[nm++] = (ts_chat_message){.role = "system", .content = system};
        /* the attached files, then the text, as `tessera run --image` lays out a turn */
        ts_content_part parts[CLI_MAX_IMAGES + 1];
        int itok[CLI_MAX_IMAGES];
        ts_chat_video vids[CLI_MAX_IMAGES];
        ts_chat_params cp = {.add_generation_prompt = true, .enable_thinking = thinking};
        msgs[nm] = (ts_chat_message){.role = "user", .content = line};
        if (c.ci.n) cli_images_message(&c.ci, line, parts, itok, vids, &msgs[nm], &cp);
        nm++;
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
            if (first)
                printf("(this message is %d tokens, more than the context of %d can answer%s)\n",
                       nt, n_ctx, c.ci.n ? "; its images are dropped" : "");
            else
                printf("(the conversation is longer than the context of %d tokens; starting "
                       "over%s)\n",
                       n_ctx, c.ci.n ? "; attach the images again" : "");
            ts_engine_slot_clear(engine, 0);
            free(turn);
            drop_images(&c);
            first = true, c.delta = 0;
            continue;
        }
        /* the images' rows and the turn's rotary positions, after the slot's last one */
        const float *const *rows = NULL;
        const int32_t *rope = NULL;
        if (c.ci.n) {
            int at = ts_engine_slot_len(engine, 0) + c.delta;
            if (cli_images_bind(&c.ci, engine, c.n_embd, turn, nt, at) != 0) {
                free(turn);
                drop_images(&c); /* the slot is as it was: the message is not sent */
                continue;
            }
            rows = c.ci.rows, rope = c.ci.rope;
        }
        /* the answer starts inside the thinking where the turn's last <think> is open */
        bool in_think = false;
        for (int k = 0; k < nt; k++)
            if (c.think[0] >= 0 && (turn[k] == c.think[0] || turn[k] == c.think[1]))
                in_think = turn[k] == c.think[0];
        double t0 = cli_now();
        ts_status st = prefill(&c, turn, nt, rows, rope, logits);
        double t_prefill = cli_now() - t0;
        free(turn);
        if (c.ci.n) c.delta += c.ci.delta;
        drop_images(&c);
        if (st != TS_OK) {
            rc = cli_fail("prefill");
            break;
        }
        first = false;
        int room = n_ctx - ts_engine_slot_len(engine, 0) - 1;
        ts_think_budget tb;
        ts_think_budget_init(&tb, c.think[0], c.think[1], (int)think_budget, &c.think[1], 1,
                             in_think);
        cli_gen g = {engine, 0, sampler, tok, detok, true, true, NULL, NULL, c.delta, &tb, true};
        cli_gen_result gr;
        if (cli_generate(&g, logits, ts_engine_slot_len(engine, 0),
                         (int)(max_new < room ? max_new : room), &gr) != TS_OK) {
            rc = cli_fail("decode");
            break;
        }
        if (!gr.stopped_at_eog) { /* close the turn so the next one follows the format */
            if (ts_engine_slot_len(engine, 0) < n_ctx &&
                prefill(&c, &c.im_end, 1, NULL, NULL, logits) != TS_OK) {
                rc = cli_fail("decode");
                break;
            }
        }
        printf("\n[%d tokens, %.1f tokens/s; prompt %d tokens in %.0f ms]\n", gr.n_generated,
               gr.seconds > 0 ? gr.n_generated / gr.seconds : 0.0, nt, t_prefill * 1e3);
    }
done:
    drop_images(&c);
    free(line);
    free(logits);
    ts_detokenizer_free(detok);
    ts_sampler_free(sampler);
    ts_engine_free(engine);
    ts_model_close(model);
    ts_tokenizer_free(tok);
    return rc;
}
