/* The tessera command line: one file per command, sharing the small helpers below.
 * Commands use only the public header. Exit status: 0 ok, 1 usage error, 2 a model or file
 * error (one clear line on stderr). */
#ifndef TS_CLI_CLI_H
#define TS_CLI_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera.h"

#define CLI_EXIT_USAGE 1
#define CLI_EXIT_ERROR 2

int cmd_logits(int argc, char **argv);
int cmd_embed(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_ppl(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_quantize(int argc, char **argv);

/* Prints "tessera: <what>: <ts_last_error()>" and returns CLI_EXIT_ERROR. */
int cli_fail(const char *what);
/* Prints a usage error and returns CLI_EXIT_USAGE. */
int cli_usage(const char *fmt, ...);
/* Reads a whole file into a malloc'd NUL-terminated buffer; false when it cannot be opened or
 * read, is longer than max bytes (the buffer stops doubling at max), or memory runs
 * out. */
bool cli_read_file(const char *path, size_t max, char **text, size_t *len);

/* Option parsing: cli_opt_value returns the value of `--name VALUE` / `-n VALUE` at argv[*i]
 * (advancing *i), or NULL when argv[*i] is not that option. */
const char *cli_opt_value(int argc, char **argv, int *i, const char *short_name,
                          const char *long_name);
bool cli_parse_int(const char *s, long lo, long hi, long *out);
bool cli_parse_float(const char *s, double *out);
/* --pooling's value: last, mean, or cls (also spelt first); false for anything else. */
bool cli_parse_pooling(const char *s, ts_pooling *out);
/* Parses "1,2,3" into a malloc'd array; false on any malformed entry. */
bool cli_parse_ids(const char *s, int32_t **ids, int *n);
double cli_now(void);

#endif
