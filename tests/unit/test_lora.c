/* LoRA adapters against PEFT (tests/fixtures/lora, tools/gen_lora_fixtures.py): every position's
 * logits of a fixture model with PEFT adapters at the scales of each recorded run - one adapter,
 * another with rsLoRA and an alpha_pattern, two at once at their own scales; on the model's
 * checkpoint, on its GGUF file (the adapter's names mapped onto the GGUF's weights) and on a
 * Q8_0 GGUF (the adapter over quantized weights) - and sequences with different adapters in one
 * batch; the Gemma 3 adapter as a GGUF adapter file too (llama.cpp's form). Also what a loader must
 * refuse. TS_LORA_DEVICE=cuda runs the same on a GPU (skipped without one). */
#include "fixture_util.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "tessera.h"
#include "testutil.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOGIT_TOL 1e-4

static char g_fx[4096];
static ts_device g_device = TS_DEVICE_CPU;
static bool g_skip;

static ts_engine *make_engine(ts_model *m, int n_slots) {
    ts_engine_opts o;
    ts_engine_opts_default(&o);
    o.n_slots = n_slots, o.n_ctx = 512, o.n_batch = 256, o.n_threads = 2, o.device = g_device;
    return fx_engine(m, &o, &g_skip);
}

/* A run of a case: its adapters (by directory name) and scales, as meta.json lists them. The
 * fixture's meta.json is what the generator wrote; the runs are written out here again so the
 * test does not need a JSON reader. */
typedef struct {
    const char *name;
    int n;
    const char *adapter[2];
    float scale[2];
} lora_run;

typedef struct {
    const char *name, *base;
    int n_prompts;
    int prompts[2];
    int n_adapters;
    const char *adapters[2];
    int n_runs;
    lora_run runs[3];
} lora_case;

static const lora_case CASES[] = {
    {"qwen35_text",
     "qwen35/tiny_a_f32_tied_explicit",
     2,
     {1, 2},
     2,
     {"all", "some"},
     3,
     {{"all", 1, {"all"}, {1.0f}},
      {"some", 1, {"some"}, {1.0f}},
      {"mix", 2, {"all", "some"}, {0.5f, -1.5f}}}},
    {"qwen35_composite",
     "qwen35/tiny_d_bf16_composite",
     1,
     {1},
     1,
     {"all"},
     1,
     {{"all", 1, {"all"}, {1.0f}}}},
    {"gemma3",
     "gemma3/tiny_a_f32_tied_mqa_w16_pat3",
     2,
     {1, 2},
     1,
     {"all"},
     2,
     {{"all", 1, {"all"}, {1.0f}}, {"half", 1, {"all"}, {0.5f}}}},
    {"gemma3_gguf", "lora/gemma3_gguf/base", 1, {1}, 1, {"all"}, 1, {{"all", 1, {"all"}, {1.0f}}}},
};

/* How far the base model at q (quantized) is from the one at path, over the case's prompts: the
 * error its weights bring, whatever an adapter adds. */
static double quant_error(const lora_case *c, const char *path, const char *q) {
    ts_model *a = NULL, *b = NULL;
    double worst = 0;
    if (ts_model_open(path, &a) != TS_OK || ts_model_open(q, &b) != TS_OK) {
        ts_model_close(a);
        return 0;
    }
    ts_engine *ea = make_engine(a, 1), *eb = make_engine(b, 1);
    for (int p = 0; ea && eb && p < c->n_prompts; p++) {
        char ip[8192];
        int32_t *ids;
        int n;
        snprintf(ip, sizeof ip, "%s/lora/%s/prompt_%d.ids", g_fx, c->name, c->prompts[p]);
        if (fx_read_ids(ip, 0, &ids, &n) != 0) continue;
        float *la = fx_prefill_all(ea, 0, ids, n), *lb = fx_prefill_all(eb, 0, ids, n);
        double d = la && lb ? tu_rel_l2(lb, la, (long)n * ts_engine_n_vocab(ea)) : 0;
        if (d > worst) worst = d;
        free(la), free(lb), free(ids);
    }
    ts_engine_free(ea), ts_engine_free(eb);
    ts_model_close(a), ts_model_close(b);
    return worst;
}

/* The model at path with the case's adapters loaded in the case's order; NULL on failure. */
static ts_model *open_with_adapters(const char *path, const lora_case *c) {
    ts_model *m = NULL;
    if (ts_model_open(path, &m) != TS_OK) {
        fprintf(stderr, "%s: %s\n", path, ts_last_error());
        return NULL;
    }
    for (int a = 0; a < c->n_adapters; a++) {
        char dir[8192];
        snprintf(dir, sizeof dir, "%s/lora/%s/%s", g_fx, c->name, c->adapters[a]);
        int id = -1;
        ts_status st = ts_model_lora_load(m, dir, &id);
        CHECKF(st == TS_OK && id == a, "%s: load %s: %s", c->name, dir,
               st == TS_OK ? "wrong id" : ts_last_error());
        if (st != TS_OK) {
            ts_model_close(m);
            return NULL;
        }
    }
    CHECK(ts_model_lora_count(m) == c->n_adapters);
    return m;
}

static void scales_of(const lora_case *c, const lora_run *r, float *s) {
    for (int a = 0; a < c->n_adapters; a++) {
        s[a] = 0.0f;
        for (int k = 0; k < r->n; k++)
            if (strcmp(r->adapter[k], c->adapters[a]) == 0) s[a] = r->scale[k];
    }
}

/* Every run's logits against PEFT's; tol: what the model's weights allow. Scales back to 0 must
 * give the base model's logits again. */
static void check_runs(const lora_case *c, const char *model_path, const char *label, double tol) {
    ts_model *m = open_with_adapters(model_path, c);
    if (!m) {
        CHECKF(0, "%s %s: no model", c->name, label);
        return;
    }
    ts_engine *e = make_engine(m, 1);
    if (!e) {
        CHECKF(g_skip, "%s %s: no engine", c->name, label);
        ts_model_close(m);
        return;
    }
    int V = ts_engine_n_vocab(e);
    for (int p = 0; p < c->n_prompts; p++) {
        char path[8192];
        int32_t *ids;
        int n;
        snprintf(path, sizeof path, "%s/lora/%s/prompt_%d.ids", g_fx, c->name, c->prompts[p]);
        if (fx_read_ids(path, 0, &ids, &n) != 0) {
            CHECKF(0, "%s: no %s", c->name, path);
            continue;
        }
        double far = INFINITY; /* the least distance between a run and the base model */
        float *base = fx_prefill_all(e, 0, ids, n);
        for (int r = 0; r < c->n_runs; r++) {
            const lora_run *run = &c->runs[r];
            snprintf(path, sizeof path, "%s/lora/%s/%s_%d.logits", g_fx, c->name, run->name,
                     c->prompts[p]);
            float *ref = fx_read_floats(path, (long)n * V);
            float s[TS_MAX_LORA];
            scales_of(c, run, s);
            CHECK(ts_engine_slot_lora(e, 0, s, c->n_adapters) == TS_OK);
            float *got = fx_prefill_all(e, 0, ids, n);
            CHECKF(ref && got, "%s %s %s: no logits", c->name, label, run->name);
            if (ref && got) {
                double rel = tu_rel_l2(got, ref, (long)n * V);
                CHECKF(rel <= tol, "%s %s run %s prompt %d: rel L2 %.3g (tolerance %.1g)", c->name,
                       label, run->name, c->prompts[p], rel, tol);
                if (base) {
                    double d = tu_rel_l2(base, ref, (long)n * V);
                    if (d < far) far = d;
                }
            }
            free(ref), free(got);
        }
        /* the adapters change the logits far beyond the tolerance: a run that matched the base
         * model could not pass */
        CHECKF(far > 20 * LOGIT_TOL, "%s %s prompt %d: the adapters change the logits by only %.3g",
               c->name, label, c->prompts[p], far);
        /* scales back to 0: the base model again, bit for bit */
        float zero[TS_MAX_LORA] = {0};
        CHECK(ts_engine_slot_lora(e, 0, zero, c->n_adapters) == TS_OK);
        float *again = fx_prefill_all(e, 0, ids, n);
        CHECKF(base && again && tu_rel_l2(again, base, (long)n * V) == 0.0,
               "%s %s: scales 0 are not the base model", c->name, label);
        free(base), free(again), free(ids);
    }
    ts_engine_free(e);
    ts_model_close(m);
}

/* Two sequences with different adapters (or none) in one batch, interleaved token by token,
 * each against its own run's logits. */
static void check_mixed_batch(const lora_case *c) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", g_fx, c->base);
    ts_model *m = open_with_adapters(path, c);
    if (!m) return;
    ts_engine *e = make_engine(m, 3);
    if (!e) {
        ts_model_close(m);
        return;
    }
    int V = ts_engine_n_vocab(e);
    int32_t *ids;
    int n;
    snprintf(path, sizeof path, "%s/lora/%s/prompt_%d.ids", g_fx, c->name, c->prompts[0]);
    if (fx_read_ids(path, 0, &ids, &n) != 0) return;
    float *plain = fx_prefill_all(e, 2, ids, n); /* slot 2: no adapter */
    const lora_run *ra = &c->runs[0], *rb = &c->runs[c->n_runs - 1];
    float sa[TS_MAX_LORA], sb[TS_MAX_LORA];
    scales_of(c, ra, sa), scales_of(c, rb, sb);
    CHECK(ts_engine_slot_lora(e, 0, sa, c->n_adapters) == TS_OK);
    CHECK(ts_engine_slot_lora(e, 1, sb, c->n_adapters) == TS_OK);
    for (int s = 0; s < 3; s++)
        ts_engine_slot_clear(e, s);
    int T = 3 * n;
    int32_t *tok = malloc((size_t)T * 4), *pos = malloc((size_t)T * 4), *sl = malloc((size_t)T * 4);
    uint8_t *want = malloc((size_t)T);
    float *out = malloc((size_t)T * V * sizeof *out);
    for (int i = 0; i < n; i++)
        for (int s = 0; s < 3; s++)
            tok[3 * i + s] = ids[i], pos[3 * i + s] = i, sl[3 * i + s] = s, want[3 * i + s] = 1;
    ts_batch b = {T, tok, pos, sl, want, NULL, NULL};
    CHECK(ts_engine_forward(e, &b, out) == TS_OK);
    const lora_run *runs[2] = {ra, rb};
    for (int s = 0; s < 3; s++) {
        float *ref;
        if (s < 2) {
            snprintf(path, sizeof path, "%s/lora/%s/%s_%d.logits", g_fx, c->name, runs[s]->name,
                     c->prompts[0]);
            ref = fx_read_floats(path, (long)n * V);
        } else {
            ref = plain;
        }
        double worst = 0;
        for (int i = 0; ref && i < n; i++) {
            double r = tu_rel_l2(out + (size_t)(3 * i + s) * V, ref + (size_t)i * V, V);
            if (r > worst) worst = r;
        }
        CHECKF(ref && worst <= 10 * LOGIT_TOL, "%s: mixed batch, slot %d: worst row rel %.3g",
               c->name, s, worst);
        if (s < 2) free(ref);
    }
    /* a copied slot keeps its adapters: the next token of a copy of slot 0 as slot 0's */
    CHECK(ts_engine_slot_copy(e, 0, 2) == TS_OK);
    int32_t t2[2] = {ids[0], ids[0]}, p2[2] = {n, n}, s2[2] = {0, 2};
    uint8_t w2[2] = {1, 1};
    float *o2 = malloc((size_t)2 * V * sizeof *o2);
    ts_batch b2 = {2, t2, p2, s2, w2, NULL, NULL};
    CHECK(ts_engine_forward(e, &b2, o2) == TS_OK);
    CHECKF(tu_rel_l2(o2 + V, o2, V) <= 1e-6, "%s: a copied slot lost its adapters", c->name);
    free(o2), free(tok), free(pos), free(sl), free(want), free(out), free(plain), free(ids);
    ts_engine_free(e);
    ts_model_close(m);
}

/* A PEFT adapter of a Gemma 3 model as llama.cpp's convert_lora_to_gguf.py writes it: its
 * pairs as blk.N.NAME.weight.lora_a / lora_b, general.architecture and alpha in the metadata;
 * type "model" for a file that is no adapter. */
static bool write_gguf_adapter(const char *peft_dir, const char *out, int n_layers, float alpha,
                               const char *arch, const char *type) {
    static const char *const peft[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                       "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                       "mlp.down_proj"};
    static const char *const gguf[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                       "ffn_gate", "ffn_up", "ffn_down"};
    char file[8192];
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", peft_dir);
    ts_st *st = NULL;
    ts_gguf_writer *w = NULL;
    if (ts_st_open(file, &st) != TS_OK || ts_gguf_writer_new(&w, 0) != TS_OK) return false;
    bool ok = ts_gguf_writer_kv_str(w, "general.architecture", arch) == TS_OK &&
              ts_gguf_writer_kv_str(w, "general.type", type) == TS_OK &&
              ts_gguf_writer_kv_str(w, "adapter.type", "lora") == TS_OK &&
              ts_gguf_writer_kv_f32(w, "adapter.lora.alpha", alpha) == TS_OK;
    const ts_tensor *ts[2 * 7 * 64];
    int n = 0;
    for (int il = 0; ok && il < n_layers; il++)
        for (int k = 0; ok && k < 7; k++)
            for (int ab = 0; ok && ab < 2; ab++) {
                char src[256], dst[64];
                snprintf(src, sizeof src, "base_model.model.model.layers.%d.%s.lora_%c.weight", il,
                         peft[k], ab ? 'B' : 'A');
                snprintf(dst, sizeof dst, "blk.%d.%s.weight.lora_%c", il, gguf[k], ab ? 'b' : 'a');
                const ts_tensor *t = ts_st_find(st, src);
                ok = t && t->dtype == TS_DTYPE_F32 &&
                     ts_gguf_writer_add_tensor(w, dst, TS_DTYPE_F32, 2, t->shape) == TS_OK;
                ts[n++] = t;
            }
    ok = ok && ts_gguf_writer_begin(w, out) == TS_OK;
    for (int i = 0; ok && i < n; i++)
        ok = ts_gguf_writer_write(w, ts[i]->data, ts[i]->nbytes) == TS_OK;
    ok = ok && ts_gguf_writer_end(w) == TS_OK;
    ts_gguf_writer_free(w);
    ts_st_close(st);
    return ok;
}

/* The Gemma 3 case's adapter as a GGUF file, on the model's checkpoint and GGUF files: PEFT's
 * logits again; and the GGUF adapters a loader must refuse. */
static void check_gguf_adapter(const char *tmp, const char *q8, double q8_tol) {
    const lora_case *c = &CASES[3];
    char peft[8192], ad[8192], path[8192];
    snprintf(peft, sizeof peft, "%s/lora/%s/all", g_fx, c->name);
    snprintf(ad, sizeof ad, "%s/adapter.gguf", tmp);
    CHECK(write_gguf_adapter(peft, ad, 6, 16.0f, "gemma3", "adapter"));
    snprintf(path, sizeof path, "%s/%s", g_fx, c->base);
    const char *models[2] = {path, q8};
    for (int k = 0; k < 2; k++) {
        ts_model *m = NULL;
        if (ts_model_open(models[k], &m) != TS_OK) continue;
        int id = -1;
        ts_status st = ts_model_lora_load(m, ad, &id);
        CHECKF(st == TS_OK && id == 0, "GGUF adapter: %s", st == TS_OK ? "id" : ts_last_error());
        ts_engine *e = st == TS_OK ? make_engine(m, 1) : NULL;
        int32_t *ids;
        int n;
        snprintf(path, sizeof path, "%s/lora/%s/prompt_1.ids", g_fx, c->name);
        if (e && fx_read_ids(path, 0, &ids, &n) == 0) {
            int V = ts_engine_n_vocab(e);
            float one = 1.0f;
            CHECK(ts_engine_slot_lora(e, 0, &one, 1) == TS_OK);
            float *got = fx_prefill_all(e, 0, ids, n);
            snprintf(path, sizeof path, "%s/lora/%s/all_1.logits", g_fx, c->name);
            float *ref = fx_read_floats(path, (long)n * V);
            double rel = got && ref ? tu_rel_l2(got, ref, (long)n * V) : 1.0;
            CHECKF(rel <= (k ? q8_tol : LOGIT_TOL), "GGUF adapter on %s: rel L2 %.3g",
                   k ? "Q8_0" : "the checkpoint", rel);
            free(got), free(ref), free(ids);
        }
        ts_engine_free(e);
        ts_model_close(m);
    }
    /* refused: a file that is no adapter; an adapter of another architecture */
    ts_model *m = NULL;
    if (ts_model_open(q8, &m) != TS_OK) return;
    int id;
    snprintf(ad, sizeof ad, "%s/model.gguf", tmp);
    CHECK(write_gguf_adapter(peft, ad, 6, 16.0f, "gemma3", "model"));
    CHECK(ts_model_lora_load(m, ad, &id) == TS_ERR_FORMAT &&
          strstr(ts_last_error(), "not a LoRA adapter"));
    snprintf(ad, sizeof ad, "%s/qwen.gguf", tmp);
    CHECK(write_gguf_adapter(peft, ad, 6, 16.0f, "qwen35", "adapter"));
    CHECK(ts_model_lora_load(m, ad, &id) == TS_ERR_FORMAT &&
          strstr(ts_last_error(), "'qwen35' model"));
    CHECK(ts_model_lora_count(m) == 0);
    ts_model_close(m);
}

/* What the loader refuses, each with a message naming the reason. */
static void check_refusals(const char *tmp) {
    char base[8192], dir[8192], cmd[8192 * 4];
    snprintf(base, sizeof base, "%s/qwen35/tiny_a_f32_tied_explicit", g_fx);
    ts_model *m = NULL;
    if (ts_model_open(base, &m) != TS_OK) return;
    int id = 7;
    /* an adapter for another model (gemma3's pairs do not fit this model's weights) */
    snprintf(dir, sizeof dir, "%s/lora/gemma3/all", g_fx);
    CHECK(ts_model_lora_load(m, dir, &id) != TS_OK && id == -1);
    CHECKF(strstr(ts_last_error(), "must be [r,") != NULL, "message: %s", ts_last_error());
    CHECK(ts_model_lora_count(m) == 0);
    /* a file that is neither a PEFT directory nor a GGUF adapter; a missing one */
    snprintf(dir, sizeof dir, "%s/lora/gemma3/all/adapter_config.json", g_fx);
    CHECKF(ts_model_lora_load(m, dir, &id) == TS_ERR_FORMAT && strstr(ts_last_error(), "neither"),
           "%s", ts_last_error());
    CHECK(ts_model_lora_load(m, "/nonexistent/adapter", &id) == TS_ERR_IO);
    /* variants with another forward: DoRA, trained biases; a broken config */
    static const struct {
        const char *edit, *says;
    } bad[] = {
        {"s/\"use_dora\": false/\"use_dora\": true/", "DoRA"},
        {"s/\"bias\": \"none\"/\"bias\": \"all\"/", "bias"},
        {"s/\"modules_to_save\": null/\"modules_to_save\": [\"lm_head\"]/", "modules_to_save"},
        {"s/\"peft_type\": \"LORA\"/\"peft_type\": \"IA3\"/", "LoRA"},
        {"s/\"r\": 4,/\"r\": 0,/", "'r'"},
        {"s/^{/[/", "JSON"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(dir, sizeof dir, "%s/bad%zu", tmp, i);
        snprintf(cmd, sizeof cmd,
                 "mkdir -p %s && cp %s/lora/qwen35_text/all/* %s/ && sed -i '%s' "
                 "%s/adapter_config.json",
                 dir, g_fx, dir, bad[i].edit, dir);
        CHECK(system(cmd) == 0);
        ts_status st = ts_model_lora_load(m, dir, &id);
        CHECKF(st != TS_OK && strstr(ts_last_error(), bad[i].says),
               "bad config %zu (%s) loaded or said: %s", i, bad[i].says,
               st == TS_OK ? "nothing" : ts_last_error());
    }
    /* a truncated tensor file */
    snprintf(dir, sizeof dir, "%s/cut", tmp);
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && cp %s/lora/qwen35_text/all/* %s/ && truncate -s 3000 "
             "%s/adapter_model.safetensors",
             dir, g_fx, dir, dir);
    CHECK(system(cmd) == 0);
    CHECK(ts_model_lora_load(m, dir, &id) == TS_ERR_FORMAT);
    CHECK(ts_model_lora_count(m) == 0);
    /* after an engine: refused, and the engine's slots take no scales of adapters not there */
    snprintf(dir, sizeof dir, "%s/lora/qwen35_text/all", g_fx);
    CHECK(ts_model_lora_load(m, dir, &id) == TS_OK && id == 0);
    ts_engine *e = make_engine(m, 1);
    if (e) {
        snprintf(dir, sizeof dir, "%s/lora/qwen35_text/some", g_fx);
        CHECK(ts_model_lora_load(m, dir, &id) == TS_ERR_INVALID);
        float s[2] = {1.0f, 1.0f};
        CHECK(ts_engine_slot_lora(e, 0, s, 2) == TS_ERR_INVALID);
        s[0] = NAN;
        CHECK(ts_engine_slot_lora(e, 0, s, 1) == TS_ERR_INVALID);
        CHECK(ts_engine_slot_lora(e, 1, s, 0) == TS_ERR_INVALID);
        ts_engine_free(e);
        /* the engine gone, loading works again */
        CHECK(ts_model_lora_load(m, dir, &id) == TS_OK && id == 1);
        ts_lora_info info;
        CHECK(ts_model_lora_info(m, 1, &info) == TS_OK && info.rank == 16 &&
              info.n_weights == 15); /* of 5 layers: q, v, down or in_proj_qkv, out_proj, down */
        CHECK(ts_model_lora_info(m, 2, &info) == TS_ERR_INVALID);
    }
    ts_model_close(m);
}

int main(void) {
    snprintf(g_fx, sizeof g_fx, "%s", tu_env("TS_FIXTURES", "tests/fixtures"));
    const char *dev = getenv("TS_LORA_DEVICE");
    if (dev && strcmp(dev, "cuda") == 0) g_device = TS_DEVICE_CUDA;
    char tmp[] = "/tmp/ts_lora_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const lora_case *c = &CASES[i];
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", g_fx, c->base);
        /* bf16 weights: the model's own bits, reference in fp32 of them; our fp32 sums */
        check_runs(c, path, "checkpoint", LOGIT_TOL);
        if (g_skip) break;
        check_mixed_batch(c);
        /* the same weights as a GGUF file: the adapter's names onto the GGUF's tensors */
        if (strcmp(c->name, "gemma3_gguf") == 0 || strcmp(c->name, "qwen35_text") == 0) {
            char gguf[8192 + 64];
            snprintf(gguf, sizeof gguf, "%s/%s_f32.gguf", tmp, c->name);
            CHECKF(ts_quantize_model(path, gguf, "f32", 2) == TS_OK, "quantize: %s",
                   ts_last_error());
            check_runs(c, gguf, "gguf f32", LOGIT_TOL);
            /* quantized weights: the adapters over Q8_0, within a few times the error Q8_0 brings
             * to the base model (0.04-0.15 on these random models; the adapters move the logits
             * by 0.6-0.9) */
            snprintf(gguf, sizeof gguf, "%s/%s_q8.gguf", tmp, c->name);
            CHECKF(ts_quantize_model(path, gguf, "q8_0", 2) == TS_OK, "quantize: %s",
                   ts_last_error());
            double qe = quant_error(c, path, gguf);
            CHECKF(qe > 0 && qe < 0.2, "%s: Q8_0 error %.3g", c->name, qe);
            check_runs(c, gguf, "gguf q8_0", 2 * qe);
            if (c == &CASES[3]) check_gguf_adapter(tmp, gguf, 2 * qe);
        }
    }
    if (g_skip) {
        printf("test_lora: skipped (no GPU)\n");
    } else if (g_device == TS_DEVICE_CPU) {
        check_refusals(tmp);
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return tu_report("test_lora");
}
