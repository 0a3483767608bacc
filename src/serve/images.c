#include "serve/images.h"

#include "base/status.h"
#include "serve/budget.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Images (and videos) decoded at once in this process: a small file can declare up to
 * TS_IMAGE_MAX_PIXELS (a 5000x5000 PNG of one colour is 84 KB, and ~100 MB once decoded), so
 * the decodes, not the bodies, are what would take the memory. The others wait their turn (an
 * image's decode takes at most about a second; a video's, its frames up to the last sampled). */
#define DECODES_AT_ONCE 2

static serve_budget decodes;
static pthread_once_t decodes_once = PTHREAD_ONCE_INIT;
static void decodes_init(void) { serve_budget_init(&decodes, DECODES_AT_ONCE); }

static void decodes_take(void) {
    pthread_once(&decodes_once, decodes_init);
    while (!serve_budget_try(&decodes, 1))
        serve_budget_wait(&decodes, 20);
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* 64 bits of the pixels and the size, eight bytes at a time, on top of h */
static uint64_t image_hash(uint64_t h, const ts_image *img) {
    size_t n = (size_t)img->width * img->height * 3, i = 0;
    h = mix64(h ^ ((uint64_t)img->width << 32 | (uint32_t)img->height));
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, img->rgb + i, 8);
        h = mix64(h ^ w) + i;
    }
    uint64_t w = 0;
    memcpy(&w, img->rgb + i, n - i);
    return mix64(h ^ w ^ (uint64_t)n);
}

int32_t serve_images_key(uint64_t h, int j, bool video) {
    /* 30 bits: -1 .. -2^30, never a token id; the lowest of them the kind of token */
    uint32_t v = (uint32_t)(mix64(h + (uint64_t)j * 0x9E3779B97F4A7C15ULL) >> 35) << 1 | video;
    return -1 - (int32_t)v;
}

/* Room for n more blocks */
static ts_status blocks_reserve(serve_images *im, int n) {
    if (im->n + n > SERVE_MAX_BLOCKS)
        return ts_error(TS_ERR_RANGE, "more than %d images and video steps in one request",
                        SERVE_MAX_BLOCKS);
    if (im->n + n <= im->cap) return TS_OK;
    int cap = im->cap ? im->cap : 8;
    while (cap < im->n + n)
        cap *= 2;
    serve_frames *b = realloc(im->block, (size_t)cap * sizeof *b);
    if (b) im->block = b;
    ts_image_plan *p = b ? realloc(im->plan, (size_t)cap * sizeof *p) : NULL;
    if (p) im->plan = p;
    uint64_t *h = p ? realloc(im->hash, (size_t)cap * sizeof *h) : NULL;
    if (h) im->hash = h;
    if (!h) return ts_error(TS_ERR_NOMEM, "out of memory");
    im->cap = cap;
    return TS_OK;
}

static void frames_free(serve_frames *f) {
    for (int i = 0; f->frames && i < f->n_frames; i++)
        ts_image_free(f->frames[i]);
    free(f->frames);
    f->frames = NULL;
    f->n_frames = 0;
}

ts_status serve_images_add(serve_images *im, const ts_vision_info *v, int64_t max_pixels,
                           const void *data, size_t len) {
    if (im->n_images + im->n_videos == SERVE_MAX_IMAGES)
        return ts_error(TS_ERR_RANGE, "more than %d images and videos", SERVE_MAX_IMAGES);
    TS_TRY(blocks_reserve(im, 1));
    ts_vision_info vi = *v;
    if (max_pixels > 0 && max_pixels < vi.max_pixels) vi.max_pixels = max_pixels;
    if (vi.min_pixels > vi.max_pixels) vi.min_pixels = vi.max_pixels;
    ts_image **frames = calloc(1, sizeof *frames);
    if (!frames) return ts_error(TS_ERR_NOMEM, "out of memory");
    decodes_take();
    ts_image *img = NULL, *sized = NULL;
    ts_image_plan *plan = &im->plan[im->n];
    ts_status st = ts_image_decode(data, len, &img);
    if (st == TS_OK) st = ts_vision_plan(&vi, img->width, img->height, plan);
    if (st == TS_OK) im->hash[im->n] = image_hash(0, img); /* of the file's own pixels */
    /* the job keeps the image at the size the tower takes (the engine's own resize to the
     * plan's size, done here): a full-size one would be held until the worker encodes it */
    if (st == TS_OK && (plan->width != img->width || plan->height != img->height)) {
        st = ts_image_resize(img, plan->width, plan->height, &sized);
        if (st == TS_OK) {
            ts_image_free(img);
            img = sized;
        }
    }
    serve_budget_give(&decodes, 1);
    if (st != TS_OK) {
        ts_image_free(img);
        free(frames);
        return st;
    }
    frames[0] = img;
    im->block[im->n] = (serve_frames){frames, 1};
    im->tokens[im->n_images++] = plan->n_tokens;
    im->image_token = v->image_token, im->video_token = v->video_token;
    im->n++;
    return TS_OK;
}

ts_status serve_images_add_video(serve_images *im, const ts_vision_info *v, double fps,
                                 const void *data, size_t len) {
    if (im->n_images + im->n_videos == SERVE_MAX_IMAGES)
        return ts_error(TS_ERR_RANGE, "more than %d images and videos", SERVE_MAX_IMAGES);
    ts_video_plan plan;
    ts_image **frames;
    decodes_take();
    ts_status st = ts_video_load(data, len, v, fps, &plan, &frames);
    serve_budget_give(&decodes, 1);
    TS_TRY(st);
    int tf = v->temporal_patch_size, n = plan.n_steps * tf, first = im->n;
    st = blocks_reserve(im, plan.n_steps);
    /* tf frames a step, each step a block that owns them */
    for (int s = 0; st == TS_OK && s < plan.n_steps; s++) {
        serve_frames *b = &im->block[im->n];
        if (!(b->frames = malloc((size_t)tf * sizeof *b->frames))) {
            st = ts_error(TS_ERR_NOMEM, "out of memory");
            break;
        }
        b->n_frames = tf;
        uint64_t h = 0x766964656fULL; /* "video" */
        for (int f = 0; f < tf; f++) {
            b->frames[f] = frames[s * tf + f];
            frames[s * tf + f] = NULL;
            h = image_hash(h, b->frames[f]);
        }
        im->plan[im->n] = plan.step;
        im->hash[im->n] = h;
        im->n++;
    }
    for (int k = 0; k < n; k++)
        ts_image_free(frames[k]);
    free(frames);
    free(plan.indices);
    plan.indices = NULL;
    if (st != TS_OK) {
        while (im->n > first)
            frames_free(&im->block[--im->n]);
        ts_video_plan_free(&plan);
        return st;
    }
    im->videos[im->n_videos++] = (ts_chat_video){plan.n_steps, plan.step.n_tokens, plan.seconds};
    im->image_token = v->image_token, im->video_token = v->video_token;
    return TS_OK;
}

ts_status serve_images_bind(serve_images *im, const ts_vision_info *v, const int32_t *ids, int n) {
    im->keys = malloc((size_t)n * sizeof *im->keys);
    im->rope_pos = malloc((size_t)n * 3 * sizeof *im->rope_pos);
    im->row = malloc((size_t)n * sizeof *im->row);
    if (!im->keys || !im->rope_pos || !im->row) return ts_error(TS_ERR_NOMEM, "out of memory");
    TS_TRY(ts_vision_rope_positions(v, ids, n, im->plan, im->n, im->rope_pos, &im->delta));
    im->n_ids = n;
    /* the runs of vision tokens are the blocks in order (checked just above) */
    int k = 0, j = 0;
    im->n_rows = 0;
    for (int i = 0; i < n; i++) {
        if (k >= im->n || ids[i] != (im->plan[k].video ? v->video_token : v->image_token)) {
            im->keys[i] = ids[i];
            im->row[i] = -1;
            continue;
        }
        im->keys[i] = serve_images_key(im->hash[k], j, im->plan[k].video);
        im->row[i] = im->n_rows++;
        if (++j == im->plan[k].n_tokens) k++, j = 0;
    }
    return TS_OK;
}

bool serve_images_rows(const serve_images *im, int from, int n, int n_embd, const float **embd,
                       int32_t *rope) {
    for (int i = 0; i < n; i++) {
        int p = from + i;
        embd[i] = NULL;
        if (im->n && p < im->n_ids) {
            if (im->row[p] >= 0 && im->embd) embd[i] = im->embd + (size_t)im->row[p] * n_embd;
            for (int a = 0; a < 3; a++)
                rope[3 * i + a] = im->rope_pos[3 * p + a];
        } else {
            rope[3 * i] = rope[3 * i + 1] = rope[3 * i + 2] = p + im->delta;
        }
    }
    return im->n > 0;
}

bool serve_images_rekey(const serve_images *im, int32_t *ids, int n) {
    for (int i = 0; im->n && i < n; i++) {
        bool image = im->n_images && ids[i] == im->image_token,
             video = im->n_videos && ids[i] == im->video_token;
        if (!image && !video) continue;
        if (i >= im->n_ids || im->keys[i] >= 0 || serve_images_token(im, im->keys[i]) != ids[i])
            return false;
        ids[i] = im->keys[i];
    }
    return true;
}

bool serve_images_needed_after(const serve_images *im, int from, int n_ids) {
    for (int i = from; im->row && i < n_ids; i++)
        if (im->row[i] >= 0) return true;
    return false;
}

void serve_images_free(serve_images *im) {
    for (int k = 0; k < im->n; k++)
        frames_free(&im->block[k]);
    for (int k = 0; k < im->n_videos; k++)
        free((void *)im->videos[k].seconds);
    free(im->block);
    free(im->plan);
    free(im->hash);
    free(im->keys);
    free(im->rope_pos);
    free(im->row);
    free(im->embd);
    memset(im, 0, sizeof *im);
}
