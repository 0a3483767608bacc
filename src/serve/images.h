/* The images of a chat request on their way into the model: decoded and planned by
 * preparation (HTTP thread), encoded by the worker when the prompt's image tokens must run.
 *
 * Prefix reuse compares token sequences, and every image of one size is the same run of
 * image tokens: so each image token is compared by a key instead - a negative number made from
 * the image's pixels and the token's place in the image (serve_images_key). Equal keys mean
 * the same image (up to a 64-bit hash), and a key never equals a token id. */
#ifndef TS_SERVE_IMAGES_H
#define TS_SERVE_IMAGES_H

#include "tessera.h"

#include <stdbool.h>
#include <stdint.h>

#define SERVE_MAX_IMAGES 16

typedef struct {
    int n;
    ts_image *img[SERVE_MAX_IMAGES]; /* decoded at the plan's size; freed once encoded */
    ts_image_plan plan[SERVE_MAX_IMAGES];
    int tokens[SERVE_MAX_IMAGES]; /* plan[k].n_tokens, for ts_chat_params */
    uint64_t hash[SERVE_MAX_IMAGES];
    int32_t image_token;
    /* for the prompt (n_ids tokens), once tokenized (serve_images_bind): */
    int32_t *keys;     /* the prompt with each image token replaced by its key */
    int32_t *rope_pos; /* [n_ids][3] rotary positions (ts_vision_rope_positions) */
    int32_t delta;     /* a later token's rotary positions are its place + delta */
    int *row;          /* [n_ids] the embedding row of an image token, else -1 */
    int n_ids;
    int n_rows;  /* image tokens in all */
    /* [n_rows][n_embd] the images' rows, written image by image (serve/decode.c): the first
     * n_encoded images' are in; NULL before the first */
    float *embd;
    int n_encoded;
} serve_images;

/* The key of token j of an image with pixel hash h. */
int32_t serve_images_key(uint64_t h, int j);
/* Decodes one image file and plans it (into slot im->n, which grows): max_pixels (0 = the
 * model's) lowers the model's pixel range. TS_ERR_* with the library's message. */
ts_status serve_images_add(serve_images *im, const ts_vision_info *v, int64_t max_pixels,
                           const void *data, size_t len);
/* After tokenization: keys, rotary positions and embedding rows for the prompt. */
ts_status serve_images_bind(serve_images *im, const ts_vision_info *v, const int32_t *ids, int n);
/* The token id behind a key (an image token's key: the image token). */
static inline int32_t serve_images_token(const serve_images *im, int32_t key) {
    return key < 0 ? im->image_token : key;
}
/* For places [from, from + n) of the sequence: each token's embedding row (NULL: its own
 * embedding) into embd[i] and rotary positions into rope[3i..3i+2] (past the prompt: the place
 * plus delta). Returns whether there are images at all (else embd and rope are only the plain
 * positions, which the engine need not be given). The images must be encoded when the range
 * holds image tokens. */
bool serve_images_rows(const serve_images *im, int from, int n, int n_embd, const float **embd,
                       int32_t *rope);
/* Another rendering of the conversation (the next turn's prefix): its image tokens replaced by
 * their keys. False when one is not where the prompt had one (then it cannot be keyed). */
bool serve_images_rekey(const serve_images *im, int32_t *ids, int n);
/* Whether tokens [from, n_ids) of the prompt hold an image token. */
bool serve_images_needed_after(const serve_images *im, int from, int n_ids);
void serve_images_free(serve_images *im);

#endif
