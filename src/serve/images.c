#include "serve/images.h"

#include "base/status.h"
#include "serve/budget.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Images decoded at once in this process: a small file can declare up to TS_IMAGE_MAX_PIXELS
 * (a 5000x5000 PNG of one colour is 84 KB, and ~100 MB once decoded), so the decodes, not the
 * bodies, are what would take the memory. The others wait their turn (a decode takes at most
 * about a second). */
#define DECODES_AT_ONCE 2

static serve_budget decodes;
static pthread_once_t decodes_once = PTHREAD_ONCE_INIT;
static void decodes_init(void) { serve_budget_init(&decodes, DECODES_AT_ONCE); }

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* 64 bits of the pixels and the size, eight bytes at a time */
static uint64_t image_hash(const ts_image *img) {
    size_t n = (size_t)img->width * img->height * 3, i = 0;
    uint64_t h = mix64((uint64_t)img->width << 32 | (uint32_t)img->height);
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, img->rgb + i, 8);
        h = mix64(h ^ w) + i;
    }
    uint64_t w = 0;
    memcpy(&w, img->rgb + i, n - i);
    return mix64(h ^ w ^ (uint64_t)n);
}

int32_t serve_images_key(uint64_t h, int j) {
    /* 30 bits: -1 .. -2^30, never a token id */
    return -1 - (int32_t)(mix64(h + (uint64_t)j * 0x9E3779B97F4A7C15ULL) >> 34);
}

ts_status serve_images_add(serve_images *im, const ts_vision_info *v, int64_t max_pixels,
                           const void *data, size_t len) {
    if (im->n == SERVE_MAX_IMAGES)
        return ts_error(TS_ERR_RANGE, "more than %d images", SERVE_MAX_IMAGES);
    ts_vision_info vi = *v;
    if (max_pixels > 0 && max_pixels < vi.max_pixels) vi.max_pixels = max_pixels;
    if (vi.min_pixels > vi.max_pixels) vi.min_pixels = vi.max_pixels;
    pthread_once(&decodes_once, decodes_init);
    while (!serve_budget_try(&decodes, 1))
        serve_budget_wait(&decodes, 20);
    ts_image *img = NULL, *sized = NULL;
    ts_image_plan *plan = &im->plan[im->n];
    ts_status st = ts_image_decode(data, len, &img);
    if (st == TS_OK) st = ts_vision_plan(&vi, img->width, img->height, plan);
    if (st == TS_OK) im->hash[im->n] = image_hash(img); /* of the file's own pixels */
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
        return st;
    }
    im->img[im->n] = img;
    im->tokens[im->n] = im->plan[im->n].n_tokens;
    im->image_token = v->image_token;
    im->n++;
    return TS_OK;
}

ts_status serve_images_bind(serve_images *im, const ts_vision_info *v, const int32_t *ids, int n) {
    im->keys = malloc((size_t)n * sizeof *im->keys);
    im->rope_pos = malloc((size_t)n * 3 * sizeof *im->rope_pos);
    im->row = malloc((size_t)n * sizeof *im->row);
    if (!im->keys || !im->rope_pos || !im->row) return ts_error(TS_ERR_NOMEM, "out of memory");
    TS_TRY(ts_vision_rope_positions(v, ids, n, im->plan, im->n, im->rope_pos, &im->delta));
    im->n_ids = n;
    /* the runs of image tokens are the images in order (checked just above) */
    int k = 0, j = 0;
    im->n_rows = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] != v->image_token) {
            im->keys[i] = ids[i];
            im->row[i] = -1;
            continue;
        }
        im->keys[i] = serve_images_key(im->hash[k], j);
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
        if (ids[i] != im->image_token) continue;
        if (i >= im->n_ids || im->keys[i] >= 0) return false;
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
        ts_image_free(im->img[k]);
    free(im->keys);
    free(im->rope_pos);
    free(im->row);
    free(im->embd);
    memset(im, 0, sizeof *im);
}
