/* The images and videos of a chat request on their way into the model: decoded and planned by
 * preparation (HTTP thread), encoded by the worker when the prompt's vision tokens must run.
 * Each image is one block of the prompt, and so is each step of a video (its
 * temporal_patch_size frames, encoded together): blocks are kept in the prompt's order.
 *
 * Prefix reuse compares token sequences, and every block of one size is the same run of
 * image (or video) tokens: so each such token is compared by a key instead - a negative number
 * made from the block's pixels and the token's place in the block (serve_images_key). Equal
 * keys mean the same pixels (up to a 64-bit hash), and a key never equals a token id. */
#ifndef TS_SERVE_IMAGES_H
#define TS_SERVE_IMAGES_H

#include "tessera.h"

#include <stdbool.h>
#include <stdint.h>

#define SERVE_MAX_IMAGES 16   /* images and videos a request */
#define SERVE_MAX_BLOCKS 4096 /* blocks a request: its images and all its videos' steps */

/* One block: a still image (n_frames 1) or a video's step */
typedef struct {
    ts_image **frames; /* at the plan's size; freed once encoded */
    int n_frames;
} serve_frames;

typedef struct {
    int n, cap;          /* blocks */
    serve_frames *block; /* [n] */
    ts_image_plan *plan; /* [n] */
    uint64_t *hash;      /* [n] */
    /* for ts_chat_params: the tokens of each image part, the steps of each video part */
    int tokens[SERVE_MAX_IMAGES], n_images;
    ts_chat_video videos[SERVE_MAX_IMAGES]; /* seconds owned */
    int n_videos;
    int32_t image_token, video_token;
    /* for the prompt (n_ids tokens), once tokenized (serve_images_bind): */
    int32_t *keys;     /* the prompt with each vision token replaced by its key */
    int32_t *rope_pos; /* [n_ids][3] rotary positions (ts_vision_rope_positions) */
    int32_t delta;     /* a later token's rotary positions are its place + delta */
    int *row;          /* [n_ids] the embedding row of a vision token, else -1 */
    int n_ids;
    int n_rows; /* vision tokens in all */
    /* [n_rows][n_embd] the blocks' rows, written block by block (serve/decode.c): the first
     * n_encoded blocks' are in; NULL before the first */
    float *embd;
    int n_encoded;
} serve_images;

/* The key of token j of a block with pixel hash h: its lowest bit (of -1 - key) says whether
 * it stands for a video token. */
int32_t serve_images_key(uint64_t h, int j, bool video);
/* Decodes one image file and plans it (a block more): max_pixels (0 = the model's) lowers the
 * model's pixel range. TS_ERR_* with the library's message. */
ts_status serve_images_add(serve_images *im, const ts_vision_info *v, int64_t max_pixels,
                           const void *data, size_t len);
/* Decodes one video file's sampled frames (ts_video_plan; fps > 0 replaces the model's frames a
 * second) and plans it: a block for each of its steps. */
ts_status serve_images_add_video(serve_images *im, const ts_vision_info *v, double fps,
                                 const void *data, size_t len);
/* After tokenization: keys, rotary positions and embedding rows for the prompt. */
ts_status serve_images_bind(serve_images *im, const ts_vision_info *v, const int32_t *ids, int n);
/* The token id behind a key (a vision token's key: the image or video token it stands for). */
static inline int32_t serve_images_token(const serve_images *im, int32_t key) {
    return key >= 0 ? key : ((-1 - key) & 1) ? im->video_token : im->image_token;
}
/* For places [from, from + n) of the sequence: each token's embedding row (NULL: its own
 * embedding) into embd[i] and rotary positions into rope[3i..3i+2] (past the prompt: the place
 * plus delta). Returns whether there are blocks at all (else embd and rope are only the plain
 * positions, which the engine need not be given). The blocks must be encoded when the range
 * holds vision tokens. */
bool serve_images_rows(const serve_images *im, int from, int n, int n_embd, const float **embd,
                       int32_t *rope);
/* Another rendering of the conversation (the next turn's prefix): its vision tokens replaced
 * by their keys. False when one is not where the prompt had one (then it cannot be keyed). */
bool serve_images_rekey(const serve_images *im, int32_t *ids, int n);
/* Whether tokens [from, n_ids) of the prompt hold a vision token. */
bool serve_images_needed_after(const serve_images *im, int from, int n_ids);
void serve_images_free(serve_images *im);

#endif
