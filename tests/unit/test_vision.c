/* Qwen3.5 with images against Hugging Face (tests/fixtures/qwen35_vision, made by
 * tools/gen_qwen35_vision_fixtures.py): for each tiny composite checkpoint,
 * - the vision tower on the processor's resized pixels gives HF's merger output;
 * - the whole way from the PNG file (decode, smart_resize, PIL's bicubic, patches) gives the
 *   same plan and the same rows;
 * - every image encoded again, in the other order, gives the same bits (the engine keeps the
 *   tower's workspace between images);
 * - the MRoPE positions of each multimodal prompt are HF's, exactly;
 * - the prompt's logits at every position are HF's (relative error, and every argmax), in one
 *   piece and in chunks that cut through an image;
 * - greedy decoding with the cache continues as HF's generate() does (positions shifted by the
 *   images' delta).
 * TS_VISION_DEVICE=cuda runs the same checks on the GPU (src/backend/cuda/gpu_check.sh does),
 * at tolerances ten times wider - its GEMMs sum in other orders and take BF16 weights'
 * activations as two bf16 halves - and prints the largest errors it saw. */
#include "fixture_util.h"
#include "tessera.h"
#include "testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IMG 8

typedef struct {
    const char *dir;
    ts_model *m;
    ts_engine *e;
    ts_model_info info;
    ts_vision_info vi;
    ts_image_plan plan[MAX_IMG];
    float *rows[MAX_IMG]; /* HF-checked embeddings of each image */
    int n_img;
} vcase;

/* relative-error bounds: the tower's rows and the logits against HF's */
static double tol_rows = 1e-5, tol_logits = 1e-4;
static double worst_rows, worst_logits; /* the largest errors seen, for the GPU's log */

static char *path_of(const char *dir, const char *fmt, int k) {
    static char buf[4][1024];
    static int next;
    char *p = buf[next++ % 4], tail[128];
    snprintf(tail, sizeof tail, fmt, k);
    snprintf(p, 1024, "%s/%s", dir, tail);
    return p;
}

/* the tower on HF's resized pixels, then from the PNG */
static void check_images(vcase *c) {
    for (int k = 0; k < MAX_IMG; k++) {
        const char *gpath = path_of(c->dir, "ref/image_%d.grid.json", k);
        json_t *g = json_load_file(gpath, 0, NULL);
        if (!g) break;
        int gh = (int)json_integer_value(json_object_get(g, "h"));
        int gw = (int)json_integer_value(json_object_get(g, "w"));
        json_decref(g);
        c->n_img = k + 1;
        int P = c->vi.patch_size, M = c->vi.merge_size, D = c->info.n_embd;
        int nt = gh * gw / (M * M);
        ts_image_plan want = {gw * P, gh * P, gh, gw, nt, false};
        size_t len;
        unsigned char *rgb = fx_read_file(path_of(c->dir, "ref/image_%d.resized.rgb", k), &len);
        float *ref = fx_read_floats(path_of(c->dir, "ref/image_%d.embeds", k), (long)nt * D);
        CHECKF(rgb && len == (size_t)want.width * want.height * 3 && ref, "%s image %d fixture",
               c->dir, k);
        if (!rgb || !ref) return;
        ts_image img = {want.width, want.height, rgb};
        float *out = malloc((size_t)nt * D * sizeof *out);
        CHECK(ts_engine_encode_image(c->e, &img, &want, out) == TS_OK);
        double err = fx_rel_err(out, ref, (long)nt * D);
        worst_rows = fmax(worst_rows, err);
        CHECKF(err < tol_rows, "%s image %d: tower vs HF: %.3g", c->dir, k, err);
        /* the whole way from the file */
        unsigned char *png = fx_read_file(path_of(c->dir, "../images/image_%d.png", k), &len);
        ts_image *dec = NULL;
        CHECK(png && ts_image_decode(png, len, &dec) == TS_OK);
        if (dec) {
            ts_image_plan p;
            CHECK(ts_vision_plan(&c->vi, dec->width, dec->height, &p) == TS_OK);
            CHECKF(p.width == want.width && p.height == want.height && p.grid_h == want.grid_h &&
                       p.grid_w == want.grid_w && p.n_tokens == want.n_tokens && !p.video,
                   "%s image %d: plan %dx%d grid %dx%d, HF's "
                   "%dx%d",
                   c->dir, k, p.width, p.height, p.grid_w, p.grid_h, gw, gh);
            float *out2 = malloc((size_t)nt * D * sizeof *out2);
            CHECK(ts_engine_encode_image(c->e, dec, NULL, out2) == TS_OK);
            double e2 = fx_rel_err(out2, ref, (long)nt * D);
            worst_rows = fmax(worst_rows, e2);
            CHECKF(e2 < tol_rows, "%s image %d: from the PNG vs HF: %.3g", c->dir, k, e2);
            free(out2);
        }
        ts_image_free(dec);
        free(png);
        c->plan[k] = want;
        c->rows[k] = out;
        free(rgb);
        free(ref);
    }
    CHECKF(c->n_img >= 3, "%s: %d images", c->dir, c->n_img);
    /* The engine keeps the tower's workspace from image to image (sized for the largest so
     * far): every image again, last to first, gives the bits it gave the first time. */
    for (int k = c->n_img - 1; k >= 0; k--) {
        const ts_image_plan *p = &c->plan[k];
        size_t n = (size_t)p->n_tokens * c->info.n_embd, len;
        unsigned char *rgb = fx_read_file(path_of(c->dir, "ref/image_%d.resized.rgb", k), &len);
        float *again = malloc(n * sizeof *again);
        ts_image img = {p->width, p->height, rgb};
        CHECK(rgb && ts_engine_encode_image(c->e, &img, p, again) == TS_OK);
        CHECKF(!memcmp(again, c->rows[k], n * sizeof *again), "%s image %d: other bits again",
               c->dir, k);
        free(again);
        free(rgb);
    }
}

/* the prompt's image rows (in order) and its rotary positions */
static const float **prompt_rows(const vcase *c, const int32_t *ids, int n, const int32_t *which,
                                 int n_which) {
    const float **rows = calloc((size_t)n, sizeof *rows);
    int k = 0, j = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] != c->vi.image_token) continue;
        const ts_image_plan *p = &c->plan[which[k]];
        rows[i] = c->rows[which[k]] + (size_t)j * c->info.n_embd;
        if (++j == p->n_tokens) k++, j = 0;
    }
    CHECK(k == n_which);
    return rows;
}

static void check_prompt(vcase *c, int pi) {
    int32_t *ids = NULL, *which = NULL;
    int n = 0, nw = 0;
    if (fx_read_ids(path_of(c->dir, "ref/mm_prompt_%d.ids", pi), 0, &ids, &n)) return;
    CHECK(fx_read_ids(path_of(c->dir, "ref/mm_prompt_%d.images", pi), 0, &which, &nw) == 0);
    int V = c->info.n_vocab;
    ts_image_plan plans[MAX_IMG];
    for (int k = 0; k < nw; k++)
        plans[k] = c->plan[which[k]];
    int32_t *rope = malloc((size_t)n * 3 * sizeof *rope), delta = 0;
    CHECK(ts_vision_rope_positions(&c->vi, ids, n, plans, nw, rope, &delta) == TS_OK);
    /* HF's [3][n] against ours [n][3] */
    FILE *f = fopen(path_of(c->dir, "ref/mm_prompt_%d.pos3", pi), "rb");
    int32_t *pos3 = malloc((size_t)n * 3 * sizeof *pos3);
    CHECK(f && fread(pos3, 4, (size_t)n * 3, f) == (size_t)n * 3);
    if (f) fclose(f);
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (int a = 0; a < 3; a++)
            bad += rope[3 * i + a] != pos3[a * n + i];
    CHECKF(bad == 0, "%s prompt %d: %d rotary positions differ from HF's", c->dir, pi, bad);

    const float **rows = prompt_rows(c, ids, n, which, nw);
    float *ref = fx_read_floats(path_of(c->dir, "ref/mm_prompt_%d.logits", pi), (long)n * V);
    float *lg = malloc((size_t)n * V * sizeof *lg);
    int32_t *pos = malloc((size_t)n * sizeof *pos), *slot = calloc((size_t)n, sizeof *slot);
    uint8_t *want = malloc((size_t)n);
    for (int i = 0; i < n; i++)
        pos[i] = i, want[i] = 1;
    /* in one piece, then in pieces of 7 (cutting through the images) */
    for (int chunk = n; chunk >= 7; chunk = chunk == n ? 7 : 0) {
        CHECK(ts_engine_slot_clear(c->e, 0) == TS_OK);
        for (int a = 0; a < n; a += chunk) {
            int m = n - a < chunk ? n - a : chunk;
            ts_batch b = {m, ids + a, pos + a, slot, want, rows + a, rope + 3 * a};
            CHECK(ts_engine_forward(c->e, &b, lg + (size_t)a * V) == TS_OK);
        }
        double err = ref ? fx_rel_err(lg, ref, (long)n * V) : 1;
        int wrong = 0;
        for (int i = 0; ref && i < n; i++)
            wrong += fx_argmax(lg + (size_t)i * V, V) != fx_argmax(ref + (size_t)i * V, V);
        worst_logits = fmax(worst_logits, err);
        CHECKF(err < tol_logits && wrong == 0,
               "%s prompt %d (chunks of %d): logits vs HF %.3g, %d "
               "argmaxes differ",
               c->dir, pi, chunk, err, wrong);
    }

    /* greedy with the cache: prompt, then a token at a time at place + delta */
    int32_t *g = NULL;
    int ng = 0;
    CHECK(fx_read_ids(path_of(c->dir, "ref/mm_greedy_%d.txt", pi), 1, &g, &ng) == 0);
    CHECK(ts_engine_slot_clear(c->e, 0) == TS_OK);
    ts_batch b = {n, ids, pos, slot, NULL, rows, rope};
    int32_t tok;
    CHECK(ts_engine_forward_greedy(c->e, &b, &tok) == TS_OK);
    int same = 0;
    for (int k = 0; k < ng; k++) {
        if (tok != g[k]) break;
        same++;
        int32_t p = n + k, s = 0, r3[3] = {p + delta, p + delta, p + delta};
        ts_batch d = {1, &tok, &p, &s, NULL, NULL, r3};
        CHECK(ts_engine_forward_greedy(c->e, &d, &tok) == TS_OK);
    }
    CHECKF(same == ng, "%s prompt %d: greedy matches HF for %d of %d tokens", c->dir, pi, same, ng);
    free(ids), free(which), free(rope), free(pos3), free(rows), free(ref), free(lg);
    free(pos), free(slot), free(want), free(g);
}

int main(void) {
    const char *fx = tu_env("TS_FIXTURES", "tests/fixtures");
    const char *names[] = {"tiny_v_f32", "tiny_v_bf16"};
    bool cuda = strcmp(tu_env("TS_VISION_DEVICE", "cpu"), "cuda") == 0;
    if (cuda) tol_rows *= 10, tol_logits *= 10;
    for (int mi = 0; mi < 2; mi++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/qwen35_vision/%s", fx, names[mi]);
        vcase c = {.dir = dir};
        if (ts_model_open(dir, &c.m) != TS_OK) {
            CHECKF(0, "%s: %s", dir, ts_last_error());
            continue;
        }
        ts_model_get_info(c.m, &c.info);
        CHECKF(ts_model_vision(c.m, &c.vi), "%s has no vision tower", dir);
        ts_engine_opts o;
        ts_engine_opts_default(&o);
        o.n_ctx = 256;
        o.n_threads = 2;
        if (cuda) o.device = TS_DEVICE_CUDA;
        if (ts_engine_create(c.m, &o, &c.e) != TS_OK) {
            CHECKF(cuda, "%s: %s", dir, ts_last_error()); /* no GPU: skipped */
            if (cuda) printf("skipped: %s\n", ts_last_error());
            ts_model_close(c.m);
            return tu_report("test_vision");
        }
        CHECK(ts_engine_vision(c.e));
        check_images(&c);
        for (int pi = 0; pi < 3; pi++)
            check_prompt(&c, pi);
        for (int k = 0; k < c.n_img; k++)
            free(c.rows[k]);
        ts_engine_free(c.e);
        ts_model_close(c.m);
    }
    printf("largest errors vs HF on %s: rows %.3g, logits %.3g\n", cuda ? "cuda" : "cpu",
           worst_rows, worst_logits);
    return tu_report("test_vision");
}
