/* JSON Schema `pattern` (an ECMA-262 regular expression) as grammar rules for the content of a
 * JSON string: the text between the quotes of the strings whose decoded value the pattern
 * matches. json_schema.c writes '"' content '"' with the rule this returns.
 *
 * Matching is over code points, as ECMA-262 with the u flag does it (a character outside the BMP
 * is one character to `.` and to classes). The subset:
 * - literal characters (any code point);
 * - `.`: any code point but the line terminators \n \r U+2028 U+2029, as ECMA-262 says;
 * - classes [...] and [^...] with code point ranges, [] (nothing) and [^] (anything);
 * - \d \D \w \W \s \S in and out of classes: \d and \w are ASCII; \s is ECMA-262's white space
 *   and line terminators, not only the ASCII ones (else \S would take U+00A0):
 *   [\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff];
 * - \n \t \r \f \v \0, \xHH, \uXXXX (a surrogate pair of two escapes is one code point), [\b]
 *   (backspace); a backslash before ASCII punctuation or a non-ASCII character is that character;
 * - groups ( ) and (?: ), alternation |;
 * - quantifiers * + ? {n} {n,} {n,m} with bounds up to 1000, greedy or lazy (a grammar has no
 *   preference, so both are the same);
 * - `{`, `}` and `]` that do not make a quantifier or close a class are literals (Annex B);
 * - anchors: ^ at the start and $ at the end of the pattern or of one of its top-level
 *   alternatives (`^a|b$` is "starts with a or ends with b"). Without them the pattern is
 *   searched for: any characters may come before and after the match.
 *
 * Refused (TS_ERR_UNSUPPORTED, naming the construct and its byte offset): backreferences \1
 * \k<..>, lookahead and lookbehind, \b \B, named groups, (?flags), \p{..} \P{..}, \cX, \u{..},
 * octal escapes, escaped letters and digits with no meaning above, anchors anywhere else, a
 * class escape as a range end ([\d-z]), bounds above 1000, groups nested over 64 deep, and a
 * pattern whose rules would exceed 100000 grammar elements. TS_ERR_INVALID for malformed
 * patterns: unclosed groups and classes, an unmatched ), a quantifier with nothing to repeat,
 * {n,m} with n > m, [z-a], a bad \x or \u escape, invalid UTF-8.
 *
 * Spelling: one per character. The characters the pattern matches are written as themselves
 * (their exact UTF-8 bytes, never an ill-formed sequence, a surrogate or a code point above
 * U+10FFFF), except '"' and '\' as \" and \\, and U+0000-U+001F as \b \t \n \f \r where JSON
 * has a short escape and \u00xx (lowercase hex) otherwise; '/' is written as itself. The
 * characters before and after an unanchored match are free: there any JSON string content is
 * allowed, escapes included (like a string without a pattern).
 *
 * ts_grammar_from_regex (tessera.h) reads the same subset for plain text (vLLM's
 * guided_regex): the whole text must match (as if anchored at both ends), and every character
 * is written as itself, quotes, backslashes and controls included. */
#ifndef TS_TEXT_REGEX_GRAMMAR_H
#define TS_TEXT_REGEX_GRAMMAR_H

#include "text/grammar.h"

#include <stdbool.h>
#include <stddef.h>

/* Adds to b the rules of the JSON string contents (without the quotes) whose decoded value
 * matches pattern (len bytes, UTF-8) in the sense of JSON Schema: a search, not anchored,
 * unless the pattern starts with ^ and/or ends with $. *rule is their start. TS_ERR_UNSUPPORTED
 * (message naming the construct and its byte offset) for regex features outside the subset,
 * TS_ERR_INVALID for a malformed pattern. The pattern is read whole before b is written to, so
 * on those errors b is unchanged. With python, the free characters' escapes are the ones
 * Python reads as JSON does (no "\/", no \u of a surrogate): a string of the list form of
 * tool calls (text/tool_grammar_py.c). */
ts_status ts_regex_rule(ts_gbuild *b, const char *pattern, size_t len, bool python, int *rule);

#endif
