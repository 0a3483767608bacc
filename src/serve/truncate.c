#include "serve/truncate.h"

#include "base/status.h"
#include "serve/prep.h"

#include <stdlib.h>
#include <string.h>

/* The image and video parts of messages [from, to). */
static void count_parts(const serve_request *r, int from, int to, int *images, int *videos) {
    *images = *videos = 0;
    for (int i = from; i < to; i++)
        for (int k = 0; !r->msgs[i].content && k < r->msgs[i].n_parts; k++)
            if (!r->msgs[i].parts[k].text) ++*(r->msgs[i].parts[k].video ? videos : images);
}

/* Renders the conversation without messages [lead, cut), with the token counts of the images
 * and videos kept (im holds all of them, in the conversation's order). */
static ts_status render_without(const serve_runtime *rt, const serve_request *r,
                                const serve_images *im, int lead, int cut, int32_t **ids,
                                size_t *n) {
    int n_keep = r->n_msgs - (cut - lead);
    ts_chat_message *m = malloc((size_t)n_keep * sizeof *m);
    if (!m) return ts_error(TS_ERR_NOMEM, "out of memory");
    memcpy(m, r->msgs, (size_t)lead * sizeof *m);
    memcpy(m + lead, r->msgs + cut, (size_t)(r->n_msgs - cut) * sizeof *m);
    int i0, v0, di, dv; /* parts before the cut turns, and in them */
    count_parts(r, 0, lead, &i0, &v0);
    count_parts(r, lead, cut, &di, &dv);
    int tokens[SERVE_MAX_IMAGES];
    ts_chat_video videos[SERVE_MAX_IMAGES];
    memcpy(tokens, im->tokens, (size_t)i0 * sizeof *tokens);
    memcpy(tokens + i0, im->tokens + i0 + di, (size_t)(im->n_images - i0 - di) * sizeof *tokens);
    memcpy(videos, im->videos, (size_t)v0 * sizeof *videos);
    memcpy(videos + v0, im->videos + v0 + dv, (size_t)(im->n_videos - v0 - dv) * sizeof *videos);
    ts_chat_params cp = serve_chat_params(r, im);
    cp.image_tokens = tokens, cp.n_images = im->n_images - di;
    cp.videos = videos, cp.n_videos = im->n_videos - dv;
    ts_status st = ts_chat_tokenize(rt->tok, m, n_keep, &cp, ids, n);
    free(m);
    return st;
}

/* Drops messages [lead, cut) from r, with their images' data. */
static void drop_messages(serve_request *r, int lead, int cut) {
    int i0, v0, di, dv;
    count_parts(r, 0, lead, &i0, &v0);
    count_parts(r, lead, cut, &di, &dv);
    int p0 = i0 + v0, dp = di + dv; /* r->images holds both, in the conversation's order */
    for (int k = p0; k < p0 + dp; k++)
        free(r->images[k].data);
    memmove(r->images + p0, r->images + p0 + dp,
            (size_t)(r->n_images - p0 - dp) * sizeof *r->images);
    r->n_images -= dp;
    memmove(r->msgs + lead, r->msgs + cut, (size_t)(r->n_msgs - cut) * sizeof *r->msgs);
    r->n_msgs -= cut - lead;
}

static bool render_failed(ts_status st, serve_error *e) {
    if (st == TS_ERR_NOMEM) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    return serve_fail(e, 400, "invalid_value", "messages", "%s", ts_last_error());
}

bool serve_truncate_turns(const serve_runtime *rt, serve_request *r, serve_images *im, int room,
                          int32_t **ids, size_t *n, serve_error *e) {
    int lead = 0;
    while (lead < r->n_msgs && !strcmp(r->msgs[lead].role, "system"))
        lead++;
    /* the places a turn starts: a user message after the first kept one */
    int *cuts = malloc((size_t)r->n_msgs * sizeof *cuts), n_cuts = 0;
    if (!cuts) return serve_fail(e, 500, "internal_error", NULL, "out of memory");
    for (int i = lead + 1; i < r->n_msgs; i++)
        if (!strcmp(r->msgs[i].role, "user")) cuts[n_cuts++] = i;
    /* the fewest turns dropped that fit: the prompt only shortens as more go */
    int lo = 0, hi = n_cuts; /* cuts[hi] fits (hi == n_cuts: none known to) */
    size_t shortest = *n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int32_t *t = NULL;
        size_t nt = 0;
        ts_status st = render_without(rt, r, im, lead, cuts[mid], &t, &nt);
        if (st != TS_OK) {
            free(cuts);
            return render_failed(st, e);
        }
        free(t);
        if (nt <= (size_t)room)
            hi = mid;
        else
            lo = mid + 1, shortest = nt;
    }
    if (hi == n_cuts) {
        free(cuts);
        return serve_fail(e, 400, "context_length_exceeded", "messages",
                          "this model's maximum context length is %d tokens: the conversation "
                          "does not fit even with every turn before its last user message "
                          "dropped (truncation 'auto'): %zu tokens in the prompt, of %d that "
                          "leave room for the answer",
                          rt->n_ctx, shortest, room);
    }
    int cut = cuts[hi];
    free(cuts);
    drop_messages(r, lead, cut);
    free(*ids);
    *ids = NULL;
    serve_images_free(im); /* read again: the blocks of the images kept */
    if (!serve_read_images(rt, r, im, e)) return false;
    ts_chat_params cp = serve_chat_params(r, im);
    ts_status st = ts_chat_tokenize(rt->tok, r->msgs, r->n_msgs, &cp, ids, n);
    return st == TS_OK || render_failed(st, e);
}
