/*
 * regex_gbnf.h - regular expressions (the ECMAScript/PCRE subset that JSON Schema `pattern`
 * and a regex response constraint use) compiled to GBNF, llama.cpp's grammar syntax.
 *
 * Supported: literals (UTF-8), `.` (any code point but \n), classes [...] and [^...] with
 * ranges, \d \w \s \D \W \S (ASCII meanings, as PCRE2 without UCP), escapes \n \r \t \f \v
 * \0 \xHH \x{H...} \uHHHH \u{H...} and escaped punctuation, groups (...) (?:...)
 * (?<name>...), alternation, quantifiers * + ? {m} {m,} {m,n} (lazy forms too; counts at
 * most GBNF_REPEAT_MAX), and `^`/`$` at the ends of top-level branches. Refused by name:
 * backreferences, lookahead and lookbehind, word boundaries, \p{...} properties, inline
 * flags, possessive quantifiers, POSIX classes, \A \z \Z \G, \Q...\E, \c.
 * docs/structured_outputs.md lists the same.
 */
#ifndef CELER_SAMPLING_REGEX_GBNF_H
#define CELER_SAMPLING_REGEX_GBNF_H

#include "base/error.h"
#include "sampling/gbnf_text.h"

#include <stddef.h>

/* re[len] (UTF-8) -> GBNF text "ROOT ::= ..." matching exactly the strings the regex matches
 * in full (anchored at both ends; `^`/`$` at the ends accepted). The text has the one rule
 * root (prefix is accepted for symmetry with json_schema_to_gbnf: no other rule is needed).
 * *gbnf is malloc'd; the caller frees it. On error *gbnf is NULL and e names the construct
 * and its byte offset: `regex at offset 3: backreference \1 is not supported`. */
celer_status regex_to_gbnf(const char *re, size_t len, const char *root, const char *prefix,
                           char **gbnf, celer_error *e);

/* For JSON Schema `pattern`: appends to out one parenthesized GBNF expression matching the
 * body of a JSON string (between the quotes) whose decoded value the regex matches with
 * search semantics (a branch without `^` may start anywhere, one without `$` may end
 * anywhere). Characters are written raw except those JSON requires escaped (" \ and
 * controls, as \" \\ \b \f \n \r \t or \u00XX). any_char is the rule name matching one
 * JSON string character of any kind (used before and after unanchored branches). */
celer_status regex_gbnf_json_pattern(const char *re, size_t len, const char *any_char,
                                     gbnf_buf *out, celer_error *e);

#endif
