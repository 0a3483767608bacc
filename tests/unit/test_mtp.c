/* Qwen3.5's multi-token-prediction block against a reference (tests/fixtures/qwen35_mtp,
 * tools/gen_qwen35_mtp_fixtures.py: a tiny model whose MTP block was trained on its own
 * continuations, its logits computed with transformers' decoder layer):
 * - the block's logits at every position of a prompt, each drafted after the prompt so far
 *   went in by chunks of several sizes (its rows follow the sequence across forward calls);
 * - a chain of four drafts after the whole prompt (the block fed its own output);
 * - several slots drafted in one call as each alone; a rewind to a mark and a snapshot
 *   restored draft as the sequence would;
 * - the same from the model's GGUF file (llama.cpp's nextn layout);
 * - what is refused: drafts without the block on, the block turned on too late, a model
 *   without one.
 * TS_MTP_DEVICE=cuda runs the same on a GPU (skipped without one). */
#include "fixture_util.h"
#include "tessera.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LOGIT_TOL 1e-4

static char g_dir[4096];
static ts_device g_device = TS_DEVICE_CPU;
static bool g_skip;

static ts_engine *make_engine(ts_model *m, int n_slots) {
    ts_engine_opts o;
    ts_engine_opts_default(&o);
    o.n_slots = n_slots, o.n_ctx = 256, o.n_batch = 64, o.n_threads = 2, o.device = g_device;
    o.snap_bytes = 8u << 20, o.n_snaps = 4;
    return fx_engine(m, &o, &g_skip);
}

/* ids[from, to) into the slot, in one forward */
static bool feed(ts_engine *e, int slot, const int32_t *ids, int from, int to) {
    int n = to - from;
    int32_t pos[256], sl[256];
    for (int i = 0; i < n; i++)
        pos[i] = from + i, sl[i] = slot;
    ts_batch b = {n, ids + from, pos, sl, NULL, NULL, NULL};
    int32_t id;
    ts_status st = ts_engine_forward_greedy(e, &b, &id);
    if (st != TS_OK) fprintf(stderr, "forward: %s\n", ts_last_error());
    return st == TS_OK;
}

typedef struct {
    int32_t *prompt, *chain;
    int n, n_chain;
    float *prompt_logits, *chain_logits;
    int V;
} ref;

static bool read_ref(ref *r, int V) {
    char p[8192];
    r->V = V;
    snprintf(p, sizeof p, "%s/tiny_mtp/ref/prompt.ids", g_dir);
    if (fx_read_ids(p, 0, &r->prompt, &r->n) != 0) return false;
    snprintf(p, sizeof p, "%s/tiny_mtp/ref/chain.ids", g_dir);
    if (fx_read_ids(p, 0, &r->chain, &r->n_chain) != 0) return false;
    snprintf(p, sizeof p, "%s/tiny_mtp/ref/prompt.logits", g_dir);
    r->prompt_logits = fx_read_floats(p, (long)(r->n - 1) * V);
    snprintf(p, sizeof p, "%s/tiny_mtp/ref/chain.logits", g_dir);
    r->chain_logits = fx_read_floats(p, (long)(r->n_chain - 1) * V);
    return r->prompt_logits && r->chain_logits;
}

static void free_ref(ref *r) {
    free(r->prompt), free(r->chain), free(r->prompt_logits), free(r->chain_logits);
}

/* The block's logits after each prefix of the prompt, the prompt fed in pieces of `chunk`:
 * drafting after t_0..t_q with t_{q+1} next gives the reference's row q. */
static void check_every_position(ts_engine *e, const ref *r, int chunk, const char *what,
                                 double tol) {
    float *lg = malloc((size_t)r->V * sizeof *lg);
    double worst = 0;
    int bad_argmax = 0;
    ts_engine_slot_clear(e, 0);
    for (int q = 0, fed = 0; q + 1 < r->n; q++) {
        while (fed <= q) { /* the next piece, or what q needs */
            int to = fed + chunk < q + 1 ? q + 1 : fed + chunk;
            if (to > r->n - 1) to = r->n - 1;
            if (!feed(e, 0, r->prompt, fed, to)) goto out;
            fed = to;
        }
        /* the slot may hold more than q + 1 tokens: rewinding is not what this checks, so the
         * drafts come at the piece's end only, and at every position when chunk is 1 */
        if (fed != q + 1) continue;
        int32_t id;
        int slot = 0;
        CHECKF(ts_engine_draft(e, 1, &slot, &r->prompt[q + 1], NULL, 1, &id, lg) == TS_OK,
               "draft: %s", ts_last_error());
        const float *want = r->prompt_logits + (size_t)q * r->V;
        double err = fx_rel_err(lg, want, r->V);
        if (err > worst) worst = err;
        bad_argmax += id != fx_argmax(want, r->V);
    }
    CHECKF(worst <= tol, "%s, pieces of %d: relative L2 %.3g", what, chunk, worst);
    CHECKF(bad_argmax == 0, "%s, pieces of %d: %d drafts not the reference's argmax", what, chunk,
           bad_argmax);
    printf("  %s, pieces of %d: worst relative L2 %.3g\n", what, chunk, worst);
out:
    free(lg);
}

/* Four drafts after the whole prompt, the first after the model's own next token. */
static void check_chain(ts_engine *e, int slot, const ref *r, const char *what, double tol) {
    int k = r->n_chain - 1;
    float *lg = malloc((size_t)k * r->V * sizeof *lg);
    int32_t ids[8];
    ts_engine_slot_clear(e, slot);
    if (feed(e, slot, r->prompt, 0, r->n)) {
        CHECKF(ts_engine_draft(e, 1, &slot, &r->chain[0], NULL, k, ids, lg) == TS_OK, "draft: %s",
               ts_last_error());
        CHECK(ts_engine_slot_len(e, slot) == r->n); /* drafting moves nothing */
        for (int j = 0; j < k; j++) {
            double err =
                fx_rel_err(lg + (size_t)j * r->V, r->chain_logits + (size_t)j * r->V, r->V);
            CHECKF(err <= tol, "%s: chain step %d: relative L2 %.3g", what, j, err);
            CHECKF(ids[j] == r->chain[j + 1], "%s: chain step %d drafted %d, reference %d", what, j,
                   ids[j], r->chain[j + 1]);
        }
    }
    free(lg);
}

/* Three slots holding different prefixes, drafted together: as each alone. A slot rewound to
 * its mark and run again, and a snapshot restored into another slot, draft as before. */
static void check_slots(ts_engine *e, const ref *r) {
    const int lens[3] = {r->n, r->n - 7, 9};
    int32_t slots[3] = {0, 1, 2}, next[3], alone[3][3], together[9];
    for (int s = 0; s < 3; s++) {
        ts_engine_slot_clear(e, s);
        if (!feed(e, s, r->prompt, 0, lens[s])) return;
        next[s] = r->prompt[(lens[s] + 3) % r->n];
    }
    for (int s = 0; s < 3; s++)
        CHECK(ts_engine_draft(e, 1, &slots[s], &next[s], NULL, 3, alone[s], NULL) == TS_OK);
    CHECK(ts_engine_draft(e, 3, slots, next, NULL, 3, together, NULL) == TS_OK);
    for (int s = 0; s < 3; s++)
        CHECKF(memcmp(alone[s], together + 3 * s, sizeof alone[s]) == 0,
               "slot %d drafted otherwise beside others", s);
    /* a mark, wrong tokens run, a rewind and the right ones again */
    int32_t wrong[8], again[3];
    for (int i = 0; i < 8; i++)
        wrong[i] = (r->prompt[i] + 5) % r->V;
    ts_engine_slot_clear(e, 1);
    feed(e, 1, r->prompt, 0, 20);
    CHECK(ts_engine_slot_mark(e, 1) == TS_OK);
    int32_t mixed[28];
    memcpy(mixed, r->prompt, 20 * sizeof *mixed);
    memcpy(mixed + 20, wrong, sizeof wrong);
    feed(e, 1, mixed, 20, 28);
    int got = -1;
    CHECK(ts_engine_slot_rewind(e, 1, 20, &got) == TS_OK && got == 20);
    feed(e, 1, r->prompt, 20, lens[1]);
    CHECK(ts_engine_draft(e, 1, &slots[1], &next[1], NULL, 3, again, NULL) == TS_OK);
    CHECKF(memcmp(again, alone[1], sizeof again) == 0, "a rewound slot drafts otherwise");
    /* slot 0's prefix as a snapshot, into slot 2 */
    CHECK(ts_engine_snap_save(e, 0, 0) == TS_OK);
    CHECK(ts_engine_snap_restore(e, 0, 2) == TS_OK);
    CHECK(ts_engine_draft(e, 1, &slots[2], &next[0], NULL, 3, again, NULL) == TS_OK);
    CHECKF(memcmp(again, alone[0], sizeof again) == 0, "a restored snapshot drafts otherwise");
}

/* Greedy decode as the server and `tessera bench --draft-mtp K` run it, in forwards of at most
 * K + 1 tokens (the engine's batch no larger, as the bench makes it): the first half of the
 * answer a token a step (on a GPU those steps are decoded ahead), the rest with up to K of the
 * block's guesses checked in each step, a wrong one taken back by a rewind to the mark and the
 * tokens after it run again in the next step. The answer must be the reference's greedy one,
 * most guesses taken. (On an H100, forwards decoded ahead with the block on made a later step
 * fault on the device: the engine does not decode ahead with the block on.) */
static void check_greedy_with_guesses(ts_model *m, int k, const char *what) {
    char p[8192];
    snprintf(p, sizeof p, "%s/tiny_mtp/ref/greedy.ids", g_dir);
    int32_t *prompt = NULL, *want = NULL, got[512], tok[64], pos[64], sl[64], out[64], guess[64];
    uint8_t wl[64];
    int np = 0, nw = 0;
    if (fx_read_ids(p, 0, &prompt, &np) != 0 || fx_read_ids(p, 1, &want, &nw) != 0) {
        CHECKF(false, "read %s", p);
        goto out;
    }
    if (nw > 256) nw = 256;
    CHECKF(np <= 128, "%s: a prompt of %d tokens (the buffers here hold 128)", p, np);
    if (np > 128) goto out;
    ts_engine_opts o;
    ts_engine_opts_default(&o);
    o.n_slots = 1, o.n_ctx = np + nw + k + 2, o.n_batch = k + 1, o.n_threads = 2;
    o.device = g_device;
    ts_engine *e = fx_engine(m, &o, &g_skip);
    if (!e) goto out;
    int32_t slot0 = 0;
    int have = 0, made = 0, taken = 0, steps = 0;
    { /* the prompt, in forwards of at most K + 1 tokens (the engine splits it): its last row
       * gives the answer's first token */
        int32_t ps[256], sl0[256];
        for (int i = 0; i < np; i++)
            ps[i] = i, sl0[i] = 0;
        ts_batch b = {np, prompt, ps, sl0, NULL, NULL, NULL};
        CHECK(ts_engine_forward_greedy(e, &b, &got[have++]) == TS_OK);
    }
    while (have < nw) {
        int held = ts_engine_slot_len(e, 0), last = np + have - 1;
        int g = have >= nw / 2 && held == last ? k : 0, n = 0;
        if (g > nw - have) g = nw - have;
        if (g > 0) {
            CHECK(ts_engine_draft(e, 1, &slot0, &got[have - 1], NULL, g, guess, NULL) == TS_OK);
            CHECK(ts_engine_slot_mark(e, 0) == TS_OK);
        }
        for (int q = held; q <= last + g; q++, n++) {
            tok[n] = q <= last ? got[q - np] : guess[q - last - 1];
            pos[n] = q, sl[n] = 0, wl[n] = q >= last;
        }
        ts_batch b = {n, tok, pos, sl, wl, NULL, NULL};
        ts_status st = ts_engine_forward_greedy(e, &b, out);
        CHECKF(st == TS_OK, "%s, K = %d: step %d: %s", what, k, steps, ts_last_error());
        if (st != TS_OK) break;
        steps++;
        int right = 0;
        while (right < g && out[right] == guess[right])
            got[have + right] = guess[right], right++;
        got[have + right] = out[right];
        have += right + 1, made += g, taken += right;
        int keep = np + have - 1, len;
        if (ts_engine_slot_len(e, 0) > keep)
            CHECK(ts_engine_slot_rewind(e, 0, keep, &len) == TS_OK);
    }
    int diff = 0;
    for (int i = 0; i < nw && i < have; i++)
        diff += got[i] != want[i];
    /* the state the guesses and rewinds left: the next token's logits as a plain prefill of
     * the same tokens gives them (a rewind that kept the wrong guesses' state shows here,
     * where this small model's greedy answer may not) */
    if (diff == 0) {
        int32_t seq[512], ps[512], sl0[512];
        int n_seq = np + have, held = ts_engine_slot_len(e, 0), V = ts_engine_n_vocab(e);
        memcpy(seq, prompt, (size_t)np * sizeof *seq);
        memcpy(seq + np, got, (size_t)have * sizeof *seq);
        for (int i = 0; i < n_seq; i++)
            ps[i] = i, sl0[i] = 0;
        float *la = malloc((size_t)V * sizeof *la), *lb = malloc((size_t)V * sizeof *lb);
        ts_batch b = {n_seq - held, seq + held, ps + held, sl0, NULL, NULL, NULL};
        CHECK(la && lb && ts_engine_forward(e, &b, la) == TS_OK);
        o.n_batch = 64;
        ts_engine *ref_e = fx_engine(m, &o, &g_skip);
        ts_batch rb = {n_seq, seq, ps, sl0, NULL, NULL, NULL};
        CHECK(ref_e && ts_engine_forward(ref_e, &rb, lb) == TS_OK);
        double rel = la && lb ? tu_rel_l2(la, lb, V) : 1;
        CHECKF(rel <= LOGIT_TOL, "%s, K = %d: the next logits after the guesses: relative L2 %.3g",
               what, k, rel);
        ts_engine_free(ref_e);
        free(la), free(lb);
    }
    if (getenv("TS_VERBOSE"))
        printf("  %s, K = %d: %d answer tokens in %d steps, %d of %d guesses taken\n", what, k,
               nw, steps, taken, made);
    CHECKF(diff == 0, "%s, K = %d: %d of %d answer tokens differ from the greedy reference", what,
           k, diff, nw);
    CHECKF(made > 0 && taken * 2 > made, "%s, K = %d: %d of %d guesses taken", what, k, taken,
           made);
    ts_engine_free(e);
out:
    free(prompt), free(want);
}

static void check_model(const char *path, const char *what, double tol) {
    ts_model *m = NULL;
    CHECKF(ts_model_open(path, &m) == TS_OK, "open %s: %s", path, ts_last_error());
    if (!m) return;
    ts_model_info info;
    ts_model_get_info(m, &info);
    CHECKF(info.mtp, "%s: no MTP block found", what);
    ref r = {0};
    CHECK(read_ref(&r, info.n_vocab));
    if (!r.prompt_logits) goto out;
    /* the block off: no drafts; the state without its rows */
    size_t plain = ts_model_state_bytes(m, 256);
    ts_engine *e = make_engine(m, 3);
    if (!e) goto out;
    int32_t id, slot = 0;
    feed(e, 0, r.prompt, 0, 4);
    CHECK(ts_engine_draft(e, 1, &slot, &r.prompt[4], NULL, 1, &id, NULL) == TS_ERR_INVALID);
    CHECK(ts_model_mtp_enable(m) == TS_ERR_INVALID); /* an engine exists */
    ts_engine_free(e);
    CHECK(ts_model_mtp_enable(m) == TS_OK);
    CHECK(ts_model_state_bytes(m, 256) > plain);
    check_greedy_with_guesses(m, 1, what);
    check_greedy_with_guesses(m, 3, what);
    e = make_engine(m, 3);
    if (!e) goto out;
    check_every_position(e, &r, 1, what, tol);
    check_every_position(e, &r, 5, what, tol);
    check_every_position(e, &r, 64, what, tol);
    check_chain(e, 0, &r, what, tol);
    check_chain(e, 2, &r, what, tol);
    check_slots(e, &r);
    /* refused: an empty slot, a token out of range, past the context, a slot twice */
    ts_engine_slot_clear(e, 1);
    int32_t two[2] = {0, 0}, toks[2] = {1, 2}, ids[8];
    int32_t slot1 = 1, bad = info.n_vocab;
    CHECK(ts_engine_draft(e, 1, &slot1, toks, NULL, 1, ids, NULL) == TS_ERR_INVALID);
    CHECK(ts_engine_draft(e, 1, &slot, &bad, NULL, 1, ids, NULL) == TS_ERR_RANGE);
    CHECK(ts_engine_draft(e, 1, &slot, toks, NULL, 256, ids, NULL) == TS_ERR_RANGE);
    CHECK(ts_engine_draft(e, 2, two, toks, NULL, 1, ids, NULL) == TS_ERR_INVALID);
    ts_engine_free(e);
out:
    free_ref(&r);
    ts_model_close(m);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s/qwen35_mtp", tu_env("TS_FIXTURES", "tests/fixtures"));
    const char *dev = getenv("TS_MTP_DEVICE");
    if (dev && strcmp(dev, "cuda") == 0) g_device = TS_DEVICE_CUDA;
    char model[8192], tmp[] = "/tmp/ts_mtp_XXXXXX", gguf[8192];
    snprintf(model, sizeof model, "%s/tiny_mtp", g_dir);
    if (!mkdtemp(tmp)) return 1;
    check_model(model, "checkpoint", LOGIT_TOL);
    if (!g_skip) {
        /* llama.cpp's layout: the block as block n_layers with its nextn tensors */
        snprintf(gguf, sizeof gguf, "%s/mtp_f32.gguf", tmp);
        CHECKF(ts_quantize_model(model, gguf, "f32", 2) == TS_OK, "quantize: %s", ts_last_error());
        check_model(gguf, "gguf f32", LOGIT_TOL);
        unlink(gguf);
    }
    /* a model without the block: refused by name */
    ts_model *m = NULL;
    char plain[8192];
    snprintf(plain, sizeof plain, "%s/../qwen35/tiny_a_f32_tied_explicit", g_dir);
    if (ts_model_open(plain, &m) == TS_OK) {
        ts_model_info info;
        ts_model_get_info(m, &info);
        CHECK(!info.mtp);
        CHECK(ts_model_mtp_enable(m) == TS_ERR_UNSUPPORTED);
        CHECK(strstr(ts_last_error(), "multi-token-prediction") != NULL);
        ts_model_close(m);
    } else {
        CHECKF(false, "open %s: %s", plain, ts_last_error());
    }
    rmdir(tmp);
    if (g_skip) printf("test_mtp: skipped (no CUDA device)\n");
    return tu_failures ? 1 : 0;
}
