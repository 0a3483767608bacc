#include "cli/images.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the largest file read: a video of a few minutes */
#define CLI_MEDIA_MAX_BYTES ((size_t)1 << 30)

/* The blocks of the files in prompt order (an image, or a video's step): their plans and, when
 * frames is not NULL, each one's frames and frame count. Returns the count. */
static int blocks(const cli_images *ci, ts_image_plan *plans, ts_image *const **frames,
                  int *n_frames) {
    int nb = 0, tf = ci->vinfo.temporal_patch_size;
    for (int k = 0; k < ci->n; k++) {
        if (!ci->video[k]) {
            if (plans) plans[nb] = ci->plan[k];
            if (frames) frames[nb] = &ci->img[k], n_frames[nb] = 1;
            nb++;
            continue;
        }
        for (int s = 0; s < ci->vplan[k].n_steps; s++, nb++) {
            if (plans) plans[nb] = ci->vplan[k].step;
            if (frames) frames[nb] = ci->frames[k] + (size_t)s * tf, n_frames[nb] = tf;
        }
    }
    return nb;
}

static void drop(cli_images *ci, int k) {
    ts_image_free(ci->img[k]);
    ci->img[k] = NULL;
    int nf = ci->vplan[k].n_steps * ci->vinfo.temporal_patch_size;
    for (int i = 0; ci->frames[k] && i < nf; i++)
        ts_image_free(ci->frames[k][i]);
    free(ci->frames[k]);
    ci->frames[k] = NULL;
    ts_video_plan_free(&ci->vplan[k]);
}

int cli_images_read(cli_images *ci, int k) {
    char *data;
    size_t len;
    if (!cli_read_file(ci->path[k], CLI_MEDIA_MAX_BYTES, &data, &len)) {
        fprintf(stderr, "tessera: cannot read '%s'\n", ci->path[k]);
        return CLI_EXIT_USAGE;
    }
    ts_status st;
    if (ci->video[k]) {
        st = ts_video_load(data, len, &ci->vinfo, 0, &ci->vplan[k], &ci->frames[k]);
        if (st == TS_OK) ci->tokens[k] = ci->vplan[k].n_steps * ci->vplan[k].step.n_tokens;
    } else {
        st = ts_image_decode(data, len, &ci->img[k]);
        if (st == TS_OK)
            st = ts_vision_plan(&ci->vinfo, ci->img[k]->width, ci->img[k]->height, &ci->plan[k]);
        if (st == TS_OK) ci->tokens[k] = ci->plan[k].n_tokens;
    }
    free(data);
    if (st != TS_OK) {
        fprintf(stderr, "tessera: %s: %s\n", ci->path[k], ts_last_error());
        drop(ci, k);
        return CLI_EXIT_ERROR;
    }
    return 0;
}

int cli_images_load(cli_images *ci, const char *model_path) {
    ts_model *m;
    if (!model_path) return cli_usage("missing -m MODEL");
    if (ts_model_open(model_path, &m) != TS_OK) return cli_fail("cannot load model");
    bool vision = ts_model_vision(m, &ci->vinfo);
    ts_model_close(m);
    for (int k = 0; k < ci->n; k++) {
        if (!vision || (ci->video[k] && ci->vinfo.video_token < 0))
            return cli_usage("%s: the model %s takes no %s%s%s",
                             ci->video[k] ? "--video" : "--image", model_path,
                             ci->video[k] ? "videos" : "images",
                             vision && ci->vinfo.video_refused[0] ? ": " : "",
                             vision ? ci->vinfo.video_refused : "");
        int rc = cli_images_read(ci, k);
        if (rc) return rc;
    }
    return 0;
}

void cli_images_message(const cli_images *ci, const char *text, ts_content_part *parts,
                        int *image_tokens, ts_chat_video *videos, ts_chat_message *msg,
                        ts_chat_params *cp) {
    int ni = 0, nv = 0;
    for (int k = 0; k < ci->n; k++) {
        parts[k] = (ts_content_part){NULL, ci->video[k]};
        if (!ci->video[k]) {
            image_tokens[ni++] = ci->plan[k].n_tokens;
            continue;
        }
        const ts_video_plan *vp = &ci->vplan[k];
        videos[nv++] = (ts_chat_video){vp->n_steps, vp->step.n_tokens, vp->seconds};
    }
    parts[ci->n] = (ts_content_part){text, false};
    *msg = (ts_chat_message){.role = "user", .parts = parts, .n_parts = ci->n + 1};
    cp->image_tokens = image_tokens, cp->n_images = ni;
    cp->videos = videos, cp->n_videos = nv;
}

int cli_images_prompt(const cli_images *ci, const ts_tokenizer *tok, const char *text,
                      int32_t **ids, size_t *n) {
    ts_content_part parts[CLI_MAX_IMAGES + 1];
    int itok[CLI_MAX_IMAGES];
    ts_chat_video vids[CLI_MAX_IMAGES];
    ts_chat_message msg;
    ts_chat_params cp = {.add_generation_prompt = true, .enable_thinking = -1};
    cli_images_message(ci, text, parts, itok, vids, &msg, &cp);
    if (ts_chat_tokenize(tok, &msg, 1, &cp, ids, n) != TS_OK) return cli_fail("chat template");
    return 0;
}

int cli_images_bind(cli_images *ci, ts_engine *e, int n_embd, const int32_t *ids, int n,
                    int32_t at) {
    int nb = blocks(ci, NULL, NULL, NULL);
    ts_image_plan *plans = malloc((size_t)(nb ? nb : 1) * sizeof *plans);
    ts_image *const **frames = malloc((size_t)(nb ? nb : 1) * sizeof *frames);
    int *n_frames = malloc((size_t)(nb ? nb : 1) * sizeof *n_frames);
    size_t rows = 0;
    for (int k = 0; k < ci->n; k++)
        rows += (size_t)ci->tokens[k];
    ci->embd = malloc((rows ? rows : 1) * n_embd * sizeof *ci->embd);
    ci->rows = calloc((size_t)n, sizeof *ci->rows);
    ci->rope = malloc((size_t)n * 3 * sizeof *ci->rope);
    int rc = 0;
    if (!plans || !frames || !n_frames || !ci->embd || !ci->rows || !ci->rope) {
        rc = cli_usage("out of memory");
        goto done;
    }
    blocks(ci, plans, frames, n_frames);
    if (ts_vision_rope_positions(&ci->vinfo, ids, n, plans, nb, ci->rope, &ci->delta) != TS_OK) {
        rc = cli_fail("--image / --video");
        goto done;
    }
    for (int i = 0; i < 3 * n; i++) /* the positions continue what the slot holds */
        ci->rope[i] += at;
    size_t row = 0;
    double t0 = cli_now();
    for (int b = 0; b < nb; b++) {
        float *out = ci->embd + row * n_embd;
        ts_status st = n_frames[b] == 1
                           ? ts_engine_encode_image(e, frames[b][0], &plans[b], out)
                           : ts_engine_encode_frames(e, (const ts_image *const *)frames[b],
                                                     n_frames[b], &plans[b], out);
        if (st != TS_OK) {
            rc = cli_fail("the vision tower");
            goto done;
        }
        row += (size_t)plans[b].n_tokens;
    }
    for (int i = 0, r = 0; i < n; i++)
        if (ids[i] == ci->vinfo.image_token ||
            (ci->vinfo.video_token >= 0 && ids[i] == ci->vinfo.video_token))
            ci->rows[i] = ci->embd + (size_t)r++ * n_embd;
    fprintf(stderr, "%d image(s) and video(s), %zu tokens, encoded in %.1f ms\n", ci->n, rows,
            (cli_now() - t0) * 1e3);
done:
    free(plans), free(frames), free(n_frames);
    return rc;
}

void cli_images_free(cli_images *ci) {
    for (int k = 0; k < ci->n; k++)
        drop(ci, k);
    free(ci->embd);
    free(ci->rows);
    free(ci->rope);
    ci->n = 0;
    ci->embd = NULL, ci->rows = NULL, ci->rope = NULL;
}
