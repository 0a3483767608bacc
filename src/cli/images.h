/* Images on the command line (`tessera run --image FILE`, `tessera chat`'s --image and /image):
 * read and planned before the prompt is tokenized (each takes the tokens its plan says),
 * encoded once the engine exists. */
#ifndef TS_CLI_IMAGES_H
#define TS_CLI_IMAGES_H

#include "cli/cli.h"

#define CLI_MAX_IMAGES 16

typedef struct {
    int n;
    const char *path[CLI_MAX_IMAGES];
    ts_image *img[CLI_MAX_IMAGES];
    ts_image_plan plan[CLI_MAX_IMAGES];
    int tokens[CLI_MAX_IMAGES];
    ts_vision_info vinfo;
    float *embd;        /* every image's rows, in order */
    const float **rows; /* [n_prompt] a token's row, NULL for text */
    int32_t *rope;      /* [n_prompt][3] */
    int32_t delta;      /* a later token's rotary positions: its place + delta */
} cli_images;

/* Reads the files and plans them with the model's vision settings (the model is opened for
 * that alone). Prints the error and returns non-zero on failure. */
int cli_images_load(cli_images *ci, const char *model_path);
/* Reads and plans image k (path[k]) with vinfo; prints the error and returns non-zero on
 * failure (img[k] is then NULL). */
int cli_images_read(cli_images *ci, int k);
/* The prompt as one user turn of a chat: the images, then the text. */
int cli_images_prompt(const cli_images *ci, const ts_tokenizer *tok, const char *text,
                      int32_t **ids, size_t *n);
/* Runs the vision tower over the images and lays out the rows and rotary positions of ids, n
 * tokens that follow a slot's rotary position `at` (0 for a whole prompt; in a chat the turn's
 * place plus the delta of the images before it). ci->delta is then the delta of these
 * tokens' own images. */
int cli_images_bind(cli_images *ci, ts_engine *e, int n_embd, const int32_t *ids, int n,
                    int32_t at);
/* Frees the images and their rows; ci may then take new ones (vinfo is kept). */
void cli_images_free(cli_images *ci);

#endif
