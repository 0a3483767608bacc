/* JSON Schema inside other grammars, and tool calls as a grammar (tool_grammar.c). The
 * stand-alone JSON Schema grammar is public: ts_grammar_from_json_schema (tessera.h). */
#ifndef TS_TEXT_JSON_SCHEMA_H
#define TS_TEXT_JSON_SCHEMA_H

#include "text/grammar.h"

#include <stdbool.h>

/* Adds to b the rules of the JSON values valid against a schema (its JSON text, len bytes),
 * with no whitespace before or after the value; *rule is their start. The errors of
 * ts_grammar_from_json_schema; b is unusable after one. */
ts_status ts_json_schema_rule(ts_gbuild *b, const char *schema, size_t len, int *rule);

/* The grammar of an answer made of tool calls in the Qwen3.5 chat format: calls of the
 * functions of tools_json (the request's validated `tools` array) - only of the one named
 * `only` when it is not NULL - one call, or several in a row when parallel. */
ts_status ts_grammar_tool_calls(const char *tools_json, const char *only, bool parallel,
                                ts_grammar **out);

#endif
