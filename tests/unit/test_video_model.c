/* Qwen3.5 with videos against Hugging Face (tests/fixtures/qwen35_vision, videos made by
 * tools/gen_qwen35_video_fixtures.py with transformers' Qwen3VLVideoProcessor and
 * Qwen3VLProcessor; the frames are raw RGB there, so no video file is decoded here):
 * - the model reads its video_preprocessor_config.json;
 * - ts_video_plan_make samples HF's frame indices, resizes to HF's size and grid, and times
 *   each step as the processor prints it (an odd count repeating the last frame, a file without
 *   a frame rate, enlarging to the pixel floor);
 * - our resize of the sampled frames is the processor's up to its torchvision rounding;
 * - each step's frames, encoded together, give the tower's rows HF gives for the video;
 * - a prompt of two videos: HF's MRoPE positions exactly, its logits at every position, and
 *   its greedy continuation with the cache;
 * - conversations of the small test tokenizer with videos (and an image): ts_chat_tokenize
 *   gives the ids Qwen3VLProcessor gives, the steps' "<S seconds>" text joined to the text
 *   before the video as the processor's one prompt string joins it.
 * TS_VISION_DEVICE=cuda runs the model's checks on the GPU at tolerances ten times wider (as
 * test_vision does; skipped without a device). */
#include "fixture_util.h"
#include "tessera.h"
#include "testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_VIDEOS 4

static char root[1024];
static double tol_rows = 1e-5, tol_logits = 1e-4; /* relative errors against HF's */

static const char *at(const char *fmt, int k) {
    static char buf[4][1200];
    static int next;
    char *p = buf[next++ % 4], tail[160];
    snprintf(tail, sizeof tail, fmt, k);
    snprintf(p, 1200, "%s/%s", root, tail);
    return p;
}

typedef struct {
    ts_video_info info;
    ts_video_plan plan;
    float *rows; /* the video's rows, ours (checked against HF's) */
} video;

static ts_video_info info_of(const json_t *v) {
    const json_t *fps = json_object_get(v, "fps");
    return (ts_video_info){(int)json_integer_value(json_object_get(v, "width")),
                           (int)json_integer_value(json_object_get(v, "height")),
                           json_integer_value(json_object_get(v, "frames")),
                           json_is_number(fps) ? json_number_value(fps) : 0};
}

static void check_plan(const ts_vision_info *vi, const json_t *v, int k, video *out) {
    out->info = info_of(v);
    CHECKF(ts_video_plan_make(vi, &out->info, 0, &out->plan) == TS_OK, "video %d: %s", k,
           ts_last_error());
    const ts_video_plan *p = &out->plan;
    const json_t *idx = json_object_get(v, "indices"), *grid = json_object_get(v, "grid_thw"),
                 *sec = json_object_get(v, "seconds");
    CHECKF(p->n_frames == (int)json_array_size(idx), "video %d: %d frames sampled, HF %zu", k,
           p->n_frames, json_array_size(idx));
    for (int i = 0; i < p->n_frames && i < (int)json_array_size(idx); i++)
        CHECKF(p->indices[i] == json_integer_value(json_array_get(idx, i)),
               "video %d: frame %d is %lld, HF's %lld", k, i, (long long)p->indices[i],
               (long long)json_integer_value(json_array_get(idx, i)));
    CHECKF(p->n_steps == json_integer_value(json_array_get(grid, 0)) &&
               p->step.grid_h == json_integer_value(json_array_get(grid, 1)) &&
               p->step.grid_w == json_integer_value(json_array_get(grid, 2)) && p->step.video,
           "video %d: grid %d x %d x %d", k, p->n_steps, p->step.grid_h, p->step.grid_w);
    CHECK(p->step.n_tokens == json_integer_value(json_object_get(v, "step_tokens")));
    for (int s = 0; s < p->n_steps && s < (int)json_array_size(sec); s++) {
        double want = json_number_value(json_array_get(sec, s));
        char a[32], b[32];
        snprintf(a, sizeof a, "%.1f", p->seconds[s]);
        snprintf(b, sizeof b, "%.1f", want);
        CHECKF(p->seconds[s] == want && !strcmp(a, b), "video %d step %d: %.17g s, HF %.17g", k, s,
               p->seconds[s], want);
    }
}

/* The sampled frames, the last repeated to fill the last step, at the plan's size: HF's (read
 * back from its pixels) or ours (the source frames resized by ts_image_resize). */
static ts_image **frames_of(const json_t *v, int k, const ts_video_plan *p, bool hf) {
    int tf = 2, n = p->n_steps * tf, w = p->step.width, h = p->step.height;
    int sw = (int)json_integer_value(json_object_get(v, "width")),
        sh = (int)json_integer_value(json_object_get(v, "height"));
    size_t len;
    unsigned char *raw =
        fx_read_file(at(hf ? "videos/video_%d.resized.rgb" : "videos/video_%d.rgb", k), &len);
    if (!raw) return NULL;
    ts_image **f = calloc((size_t)n, sizeof *f);
    for (int i = 0; i < n; i++) {
        int src = i < p->n_frames ? i : p->n_frames - 1;
        if (hf) {
            f[i] = malloc(sizeof **f);
            *f[i] = (ts_image){w, h, malloc((size_t)w * h * 3)};
            memcpy(f[i]->rgb, raw + (size_t)i * w * h * 3, (size_t)w * h * 3);
        } else {
            ts_image s = {sw, sh, raw + (size_t)p->indices[src] * sw * sh * 3};
            if (w == sw && h == sh) {
                f[i] = malloc(sizeof **f);
                *f[i] = (ts_image){w, h, malloc((size_t)w * h * 3)};
                memcpy(f[i]->rgb, s.rgb, (size_t)w * h * 3);
            } else {
                CHECK(ts_image_resize(&s, w, h, &f[i]) == TS_OK);
            }
        }
    }
    free(raw);
    return f;
}

static void frames_free(ts_image **f, int n) {
    for (int i = 0; f && i < n; i++)
        ts_image_free(f[i]);
    free(f);
}

/* Each step's frames encoded together into rows (n_steps * step.n_tokens of them) */
static void encode(ts_engine *e, int D, const ts_video_plan *p, ts_image **f, float *rows) {
    for (int s = 0; s < p->n_steps; s++)
        CHECKF(ts_engine_encode_frames(e, (const ts_image *const *)f + 2 * s, 2, &p->step,
                                       rows + (size_t)s * p->step.n_tokens * D) == TS_OK,
               "step %d: %s", s, ts_last_error());
}

static void check_video(ts_engine *e, int D, const json_t *v, int k, video *vd) {
    const ts_video_plan *p = &vd->plan;
    size_t n = (size_t)p->n_steps * p->step.n_tokens * D;
    float *ref = fx_read_floats(at("tiny_v_f32/ref/video_%d.embeds", k), (long)n);
    ts_image **hf = frames_of(v, k, p, true), **ours = frames_of(v, k, p, false);
    CHECKF(ref && hf && ours, "video %d fixture", k);
    if (!ref || !hf || !ours) return;
    /* our resize against the processor's (torchvision's bicubic, equal to PIL's up to 1) */
    int worst = 0;
    long differ = 0, total = (long)p->n_steps * 2 * p->step.width * p->step.height * 3;
    for (int i = 0; i < p->n_steps * 2; i++)
        for (long b = 0; b < (long)p->step.width * p->step.height * 3; b++) {
            int d = abs(hf[i]->rgb[b] - ours[i]->rgb[b]);
            worst = d > worst ? d : worst, differ += d != 0;
        }
    bool resized = p->step.width != vd->info.width || p->step.height != vd->info.height;
    CHECKF(resized ? worst <= 1 : worst == 0, "video %d: frames differ from HF's by up to %d", k,
           worst);
    printf("video %d: %dx%d -> %dx%d, %ld of %ld bytes differ from HF's (by up to %d)\n", k,
           vd->info.width, vd->info.height, p->step.width, p->step.height, differ, total, worst);
    /* the tower on HF's frames: HF's rows */
    vd->rows = malloc(n * sizeof *vd->rows);
    encode(e, D, p, hf, vd->rows);
    double err = fx_rel_err(vd->rows, ref, (long)n);
    CHECKF(err < tol_rows, "video %d: rows vs HF %.3g", k, err);
    /* and on ours: a pixel off here and there */
    float *mine = malloc(n * sizeof *mine);
    encode(e, D, p, ours, mine);
    double err2 = fx_rel_err(mine, ref, (long)n);
    CHECKF(resized ? err2 < 2e-2 : err2 < tol_rows, "video %d: rows from our frames vs HF %.3g", k,
           err2);
    printf("video %d: rows vs HF %.3g (HF's frames), %.3g (ours)\n", k, err, err2);
    free(mine), free(ref);
    frames_free(hf, p->n_steps * 2), frames_free(ours, p->n_steps * 2);
}

static void check_prompt(ts_engine *e, const ts_model_info *mi, const ts_vision_info *vi,
                         video *vd) {
    int32_t *ids = NULL;
    int n = 0, V = mi->n_vocab, D = mi->n_embd;
    CHECK(fx_read_ids(at("tiny_v_f32/ref/video_prompt.ids", 0), 0, &ids, &n) == 0);
    if (!ids) return;
    /* videos 0 and 1: a plan a step */
    ts_image_plan plans[64];
    const float *rows_of[64];
    int np = 0;
    for (int k = 0; k < 2; k++)
        for (int s = 0; s < vd[k].plan.n_steps; s++, np++) {
            plans[np] = vd[k].plan.step;
            rows_of[np] = vd[k].rows + (size_t)s * vd[k].plan.step.n_tokens * D;
        }
    int32_t *rope = malloc((size_t)n * 3 * sizeof *rope), delta = 0;
    CHECKF(ts_vision_rope_positions(vi, ids, n, plans, np, rope, &delta) == TS_OK, "%s",
           ts_last_error());
    int32_t *pos3 = malloc((size_t)n * 3 * sizeof *pos3);
    FILE *f = fopen(at("tiny_v_f32/ref/video_prompt.pos3", 0), "rb");
    CHECK(f && fread(pos3, 4, (size_t)n * 3, f) == (size_t)n * 3);
    if (f) fclose(f);
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (int a = 0; a < 3; a++)
            bad += rope[3 * i + a] != pos3[a * n + i];
    CHECKF(bad == 0, "%d rotary positions differ from HF's", bad);

    const float **rows = calloc((size_t)n, sizeof *rows);
    for (int i = 0, b = 0, j = 0; i < n; i++) {
        if (ids[i] != vi->video_token) continue;
        rows[i] = rows_of[b] + (size_t)j * D;
        if (++j == plans[b].n_tokens) b++, j = 0;
    }
    float *ref = fx_read_floats(at("tiny_v_f32/ref/video_prompt.logits", 0), (long)n * V);
    float *lg = malloc((size_t)n * V * sizeof *lg);
    int32_t *pos = malloc((size_t)n * sizeof *pos), *slot = calloc((size_t)n, sizeof *slot);
    uint8_t *want = malloc((size_t)n);
    for (int i = 0; i < n; i++)
        pos[i] = i, want[i] = 1;
    CHECK(ts_engine_slot_clear(e, 0) == TS_OK);
    ts_batch b = {n, ids, pos, slot, want, rows, rope};
    CHECK(ts_engine_forward(e, &b, lg) == TS_OK);
    double err = ref ? fx_rel_err(lg, ref, (long)n * V) : 1;
    int wrong = 0;
    for (int i = 0; ref && i < n; i++)
        wrong += fx_argmax(lg + (size_t)i * V, V) != fx_argmax(ref + (size_t)i * V, V);
    CHECKF(err < tol_logits && wrong == 0, "prompt logits vs HF %.3g, %d argmaxes differ", err,
           wrong);
    printf("prompt of %d ids: logits vs HF %.3g\n", n, err);

    int32_t *g = NULL;
    int ng = 0;
    CHECK(fx_read_ids(at("tiny_v_f32/ref/video_greedy.txt", 0), 1, &g, &ng) == 0);
    CHECK(ts_engine_slot_clear(e, 0) == TS_OK);
    ts_batch bg = {n, ids, pos, slot, NULL, rows, rope};
    int32_t tok;
    CHECK(ts_engine_forward_greedy(e, &bg, &tok) == TS_OK);
    int same = 0;
    for (int k = 0; k < ng; k++) {
        if (tok != g[k]) break;
        same++;
        int32_t p = n + k, s = 0, r3[3] = {p + delta, p + delta, p + delta};
        ts_batch d = {1, &tok, &p, &s, NULL, NULL, r3};
        CHECK(ts_engine_forward_greedy(e, &d, &tok) == TS_OK);
    }
    CHECKF(ng > 0 && same == ng, "greedy matches HF for %d of %d tokens", same, ng);
    free(ids), free(rope), free(pos3), free(rows), free(ref), free(lg), free(pos), free(slot);
    free(want), free(g);
}

/* Conversations of the small tokenizer: our ids are Qwen3VLProcessor's */
static void check_chat(const ts_vision_info *vi, video *vd) {
    json_error_t je;
    json_t *doc = json_load_file(at("video_chat.json", 0), 0, &je);
    CHECKF(doc, "video_chat.json: %s", je.text);
    if (!doc) return;
    char tpath[1200];
    snprintf(tpath, sizeof tpath, "%s/../tokenizer/small/tokenizer.json", root);
    ts_tokenizer *tok = NULL;
    CHECKF(ts_tokenizer_open(tpath, &tok) == TS_OK, "%s", ts_last_error());
    const json_t *isz = json_object_get(doc, "image_size");
    ts_image_plan ip;
    CHECK(ts_vision_plan(vi, (int)json_integer_value(json_array_get(isz, 0)),
                         (int)json_integer_value(json_array_get(isz, 1)), &ip) == TS_OK);
    size_t ci;
    const json_t *c;
    json_array_foreach(json_object_get(doc, "cases"), ci, c) {
        const json_t *parts = json_object_get(c, "parts");
        int np = (int)json_array_size(parts), n_img = 0, n_vid = 0;
        ts_content_part cp[8] = {0};
        ts_chat_video cv[8];
        int itok[8];
        for (int k = 0; k < np && k < 8; k++) {
            const json_t *p = json_array_get(parts, k);
            const char *kind = json_string_value(json_array_get(p, 0));
            if (!strcmp(kind, "text")) {
                cp[k].text = json_string_value(json_array_get(p, 1));
            } else if (!strcmp(kind, "video")) {
                const ts_video_plan *vp = &vd[json_integer_value(json_array_get(p, 1))].plan;
                cp[k].video = true;
                cv[n_vid++] = (ts_chat_video){vp->n_steps, vp->step.n_tokens, vp->seconds};
            } else {
                itok[n_img++] = ip.n_tokens;
            }
        }
        ts_chat_message m = {.role = "user", .parts = cp, .n_parts = np};
        ts_chat_params prm = {
            .image_tokens = itok, .n_images = n_img, .videos = cv, .n_videos = n_vid};
        int32_t *ids = NULL;
        size_t n = 0;
        CHECKF(tok && ts_chat_tokenize(tok, &m, 1, &prm, &ids, &n) == TS_OK, "case %zu: %s", ci,
               ts_last_error());
        const json_t *want = json_object_get(c, "ids");
        size_t same = 0;
        while (same < n && same < json_array_size(want) &&
               ids[same] == json_integer_value(json_array_get(want, same)))
            same++;
        CHECKF(same == n && n == json_array_size(want),
               "case %zu: %zu ids, HF %zu; the first %zu agree", ci, n, json_array_size(want),
               same);
        free(ids);
        /* a count that is not the conversation's is refused, never dropped */
        prm.n_videos = n_vid ? n_vid - 1 : 1, prm.videos = cv;
        CHECK(ts_chat_tokenize(tok, &m, 1, &prm, &ids, &n) == TS_ERR_INVALID);
    }
    ts_tokenizer_free(tok);
    json_decref(doc);
}

/* tiny_v_f32 with the video processor file replaced by one with `set` (a JSON object's
 * members, ,-separated) over its frames-a-second defaults, opened: a checkpoint that asks for
 * what is not supported takes no videos and says why, its images unaffected; a malformed value
 * fails the load. */
static void check_video_config(const char *set, const char *why) {
    char dir[] = "/tmp/ts_video_cfg_XXXXXX", from[1300], to[1300];
    if (!mkdtemp(dir)) {
        CHECKF(false, "mkdtemp: %s", dir);
        return;
    }
    const char *files[] = {"config.json", "model.safetensors", "preprocessor_config.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(to, sizeof to, "%s/%s", dir, files[i]);
        CHECK(realpath(at("tiny_v_f32", 0), from) != NULL);
        snprintf(from + strlen(from), sizeof from - strlen(from), "/%s", files[i]);
        CHECK(symlink(from, to) == 0);
    }
    snprintf(to, sizeof to, "%s/video_preprocessor_config.json", dir);
    FILE *f = fopen(to, "w");
    CHECK(f != NULL);
    if (f) {
        fprintf(f,
                "{\"image_mean\": [0.5, 0.5, 0.5], \"image_std\": [0.5, 0.5, 0.5], "
                "\"patch_size\": 4, \"temporal_patch_size\": 2, \"merge_size\": 2, %s}",
                set);
        fclose(f);
    }
    ts_model *m = NULL;
    ts_status st = ts_model_open(dir, &m);
    ts_vision_info vi;
    if (why) {
        CHECKF(st == TS_OK, "%s: %s", set, ts_last_error());
        CHECKF(m && ts_model_vision(m, &vi) && vi.video_token == -1 &&
                   strstr(vi.video_refused, "video_preprocessor_config.json: ") &&
                   strstr(vi.video_refused, why),
               "%s: '%s'", set, m ? vi.video_refused : "");
    } else {
        CHECKF(st == TS_ERR_FORMAT && strstr(ts_last_error(), "video_preprocessor_config.json"),
               "%s: %d %s", set, st, ts_last_error());
    }
    ts_model_close(m);
    for (int i = 0; i < 4; i++) {
        snprintf(to, sizeof to, "%s/%s", dir, i < 3 ? files[i] : "video_preprocessor_config.json");
        unlink(to);
    }
    rmdir(dir);
}

int main(void) {
    snprintf(root, sizeof root, "%s/qwen35_vision", tu_env("TS_FIXTURES", "tests/fixtures"));
    check_video_config("\"do_sample_frames\": false", "do_sample_frames false");
    check_video_config("\"num_frames\": 8", "num_frames");
    check_video_config("\"rescale_factor\": 0.5", "rescale factor differ");
    check_video_config("\"fps\": -1", NULL);
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/tiny_v_f32", root);
    ts_model *m = NULL;
    CHECKF(ts_model_open(dir, &m) == TS_OK, "%s: %s", dir, ts_last_error());
    if (!m) return tu_report("test_video_model");
    ts_model_info mi;
    ts_model_get_info(m, &mi);
    ts_vision_info vi;
    CHECK(ts_model_vision(m, &vi));
    /* its video_preprocessor_config.json */
    CHECK(vi.video_token == 511 && vi.temporal_patch_size == 2);
    CHECK(vi.video_min_pixels == 4096 && vi.video_max_pixels == 8192);
    CHECK(vi.video_fps == 2 && vi.video_min_frames == 4 && vi.video_max_frames == 768);
    CHECK(vi.video_max_frame_tokens == 0);

    ts_engine_opts o;
    ts_engine_opts_default(&o);
    o.n_ctx = 256;
    o.n_threads = 2;
    bool cuda = strcmp(tu_env("TS_VISION_DEVICE", "cpu"), "cuda") == 0;
    if (cuda) o.device = TS_DEVICE_CUDA, tol_rows *= 10, tol_logits *= 10;
    ts_engine *e = NULL;
    if (ts_engine_create(m, &o, &e) != TS_OK) {
        CHECKF(cuda, "%s", ts_last_error());
        if (cuda) printf("skipped: %s\n", ts_last_error()); /* no GPU */
        ts_model_close(m);
        return tu_report("test_video_model");
    }
    json_error_t je;
    json_t *doc = json_load_file(at("videos/videos.json", 0), 0, &je);
    CHECKF(doc, "videos.json: %s", je.text);
    video vd[MAX_VIDEOS] = {0};
    int nv = doc ? (int)json_array_size(json_object_get(doc, "videos")) : 0;
    CHECK(nv == 3);
    for (int k = 0; e && k < nv && k < MAX_VIDEOS; k++) {
        const json_t *v = json_array_get(json_object_get(doc, "videos"), k);
        check_plan(&vi, v, k, &vd[k]);
        check_video(e, mi.n_embd, v, k, &vd[k]);
    }
    if (e && vd[0].rows && vd[1].rows) check_prompt(e, &mi, &vi, vd);
    check_chat(&vi, vd);

    /* fewer frames than a step, and a model's own sampling: refused or clamped, never 0 */
    ts_video_plan p;
    ts_video_info one = {40, 32, 1, 30};
    CHECK(ts_video_plan_make(&vi, &one, 0, &p) == TS_ERR_RANGE);
    ts_video_info hour = {40, 32, 108000, 30}; /* an hour at 30: 7200 at 2 a second, max 768 */
    CHECK(ts_video_plan_make(&vi, &hour, 0, &p) == TS_OK && p.n_frames == 768);
    ts_video_plan_free(&p);
    CHECK(ts_video_plan_make(&vi, &hour, 0.1, &p) == TS_OK && p.n_frames == 360);
    ts_video_plan_free(&p);
    ts_vision_info novideo = vi;
    novideo.video_token = -1;
    CHECK(ts_video_plan_make(&novideo, &hour, 0, &p) == TS_ERR_UNSUPPORTED);

    for (int k = 0; k < MAX_VIDEOS; k++)
        free(vd[k].rows), ts_video_plan_free(&vd[k].plan);
    json_decref(doc);
    ts_engine_free(e);
    ts_model_close(m);
    return tu_report("test_video_model");
}
