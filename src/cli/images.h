/* Images and videos on the command line (`tessera run --image FILE --video FILE`, `tessera
 * chat`'s --image / --video and /image / /video): read and planned before the prompt is
 * tokenized (an image takes the tokens its plan says, a video its steps), encoded once the
 * engine exists. */
#ifndef TS_CLI_IMAGES_H
#define TS_CLI_IMAGES_H

#include "cli/cli.h"

#define CLI_MAX_IMAGES 16 /* images and videos a message */

typedef struct {
    int n; /* files, in the order they were given */
    const char *path[CLI_MAX_IMAGES];
    bool video[CLI_MAX_IMAGES];
    ts_image *img[CLI_MAX_IMAGES]; /* an image's: itself, at its own size */
    ts_image_plan plan[CLI_MAX_IMAGES];
    int tokens[CLI_MAX_IMAGES];          /* the vision tokens the file takes */
    ts_video_plan vplan[CLI_MAX_IMAGES]; /* a video's: its plan */
    ts_image **frames[CLI_MAX_IMAGES];   /* and its steps' frames (ts_video_load) */
    ts_vision_info vinfo;
    float *embd;        /* every file's rows, in order */
    const float **rows; /* [n_prompt] a token's row, NULL for text */
    int32_t *rope;      /* [n_prompt][3] */
    int32_t delta;      /* a later token's rotary positions: its place + delta */
} cli_images;

/* Reads the files and plans them with the model's vision settings (the model is opened for
 * that alone). Prints the error and returns non-zero on failure. */
int cli_images_load(cli_images *ci, const char *model_path);
/* Reads and plans file k (path[k], an image or, video[k], a video) with vinfo; prints the error
 * and returns non-zero on failure (nothing of it is then kept). */
int cli_images_read(cli_images *ci, int k);
/* The chat message of one user turn: the files in order, then the text (parts: n + 1 of them),
 * and the chat parameters that say how many tokens each takes (image_tokens and videos must
 * hold n each; cp's other fields are left as they are). */
void cli_images_message(const cli_images *ci, const char *text, ts_content_part *parts,
                        int *image_tokens, ts_chat_video *videos, ts_chat_message *msg,
                        ts_chat_params *cp);
/* The prompt as one user turn of a chat: the files, then the text. */
int cli_images_prompt(const cli_images *ci, const ts_tokenizer *tok, const char *text,
                      int32_t **ids, size_t *n);
/* Runs the vision tower over the files and lays out the rows and rotary positions of ids, n
 * tokens that follow a slot's rotary position `at` (0 for a whole prompt; in a chat the turn's
 * place plus the delta of the images before it). ci->delta is then the delta of these
 * tokens' own images and videos. */
int cli_images_bind(cli_images *ci, ts_engine *e, int n_embd, const int32_t *ids, int n,
                    int32_t at);
/* Frees the files and their rows; ci may then take new ones (vinfo is kept). */
void cli_images_free(cli_images *ci);

#endif
