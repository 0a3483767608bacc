/* JSON Schema inside other grammars, and tool calls as a grammar (tool_grammar.c). The
 * stand-alone JSON Schema grammar is public: ts_grammar_from_json_schema (tessera.h). */
#ifndef TS_TEXT_JSON_SCHEMA_H
#define TS_TEXT_JSON_SCHEMA_H

#include "text/grammar.h"

#include <stdbool.h>

/* Adds to b the rules of the JSON values valid against a schema (its JSON text, len bytes),
 * with no whitespace before or after the value; *rule is their start. With python the values
 * are written as Python literals instead (True, False, None; strings with only the escapes
 * Python reads as JSON does), for the list form of tool calls. The errors of
 * ts_grammar_from_json_schema; b is unusable after one. */
ts_status ts_json_schema_rule(ts_gbuild *b, const char *schema, size_t len, bool python, int *rule);

/* The grammar of an answer made of tool calls in the Qwen3.5 chat format: calls of the
 * functions of tools_json (the request's validated `tools` array) - only of the one named
 * `only` when it is not NULL - one call, or several in a row when parallel. */
ts_status ts_grammar_tool_calls(const char *tools_json, const char *only, bool parallel,
                                ts_grammar **out);

/* The same for a chat format without tool calls of its own (Gemma 3's), whose calls are a
 * Python list, [name(key=value, ...), ...] (text/chat_gemma.c asks for it, serve/toolcall_py.c
 * reads it): one call in the list, or several when parallel. TS_ERR_INVALID also for a function
 * or parameter name that cannot be written in a call there. */
ts_status ts_grammar_tool_list(const char *tools_json, const char *only, bool parallel,
                               ts_grammar **out);

#endif
