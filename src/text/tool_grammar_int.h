/* What the two grammars of forced tool calls share (tool_grammar.c: Qwen3.5's blocks,
 * tool_grammar_py.c: the list form): reading the request's tools, the functions asked for,
 * and the answer's frame - a little whitespace, then one call or, when parallel, several
 * with a separator between them, inside an opening and a closing text. A format gives its
 * own rules through these hooks. Internal to the two files. */
#ifndef TS_TEXT_TOOL_GRAMMAR_INT_H
#define TS_TEXT_TOOL_GRAMMAR_INT_H

#include "base/status.h"
#include "text/grammar.h"

#include <jansson.h>
#include <stdbool.h>

typedef struct tool_format tool_format;
struct tool_format {
    const char *open, *close; /* around the calls ("" for none) */
    /* makes the format's shared rules in a new builder, and sep: the rule between calls */
    void (*begin)(tool_format *f, ts_gbuild *b);
    /* adds function nm's call (fn: its "function" object) as an alternative of rule call */
    ts_status (*call)(tool_format *f, ts_gbuild *b, int call, const char *nm, const json_t *fn);
    int sep;
};

/* A function's parameters as its schema lists them: their names, schemas and whether each
 * is required, in the order of `properties` (an object; the caller checks). */
typedef struct {
    size_t n;
    const char **keys;
    const json_t **vals;
    bool *required;
} tool_params;
ts_status tool_params_read(const json_t *params, tool_params *p);
void tool_params_free(tool_params *p);

/* root ::= [ \t\n]{0,8} open call more close; more ::= "" | sep call more (when parallel) -
 * call the functions of tools_json (only the one named `only` when not NULL). */
ts_status tool_grammar_build(const char *tools_json, const char *only, bool parallel,
                             tool_format *f, ts_grammar **out);

#endif
