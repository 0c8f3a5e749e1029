/*
 * json_schema.h - JSON Schema (a parsed jansson value) compiled to GBNF, llama.cpp's grammar
 * syntax, for constrained decoding of structured outputs (OpenAI response_format
 * json_schema / json_object, llama-server's json_schema, tool parameter schemas).
 *
 * The compiler fails closed: a keyword it does not enforce is an error naming the keyword
 * and its JSON pointer, never silently ignored. docs/structured_outputs.md lists every
 * supported keyword, what is enforced, the refused ones, the accepted format forms and the
 * caps. It does not validate instances itself (the grammar engine does, token by token).
 *
 * Whitespace rule: where JSON allows whitespace (after '{' '[' ',' ':' and before ':' ','
 * '}' ']'), the grammar accepts nothing, one space, or one newline followed by at most
 * JSON_SCHEMA_INDENT_MAX spaces:  ws ::= ( " " | "\n" " "{0,24} )?
 * Nothing before or after the top-level value.
 */
#ifndef CELER_SAMPLING_JSON_SCHEMA_H
#define CELER_SAMPLING_JSON_SCHEMA_H

#include "base/error.h"

#include <jansson.h>

#define JSON_SCHEMA_INDENT_MAX 24
/* Schemas nested deeper than this (subschemas within subschemas, $ref hops included) are
 * refused. */
#define JSON_SCHEMA_DEPTH_MAX 64

/* JSON Schema -> GBNF text whose start rule is `root` and whose other rules all begin with
 * `prefix` (so several compiled schemas can sit in one grammar). prefix "" and root "root"
 * for a plain response format. *gbnf is malloc'd; the caller frees it. On error *gbnf is
 * NULL and e holds one line such as
 *   schema: "/properties/age/multipleOf": keyword multipleOf is not supported
 * Annotations that constrain nothing (title, description, examples, $comment, default,
 * $schema, $id, deprecated, readOnly, writeOnly) are accepted. */
celer_status json_schema_to_gbnf(const json_t *schema, const char *root, const char *prefix,
                                 char **gbnf, celer_error *e);

/* Any JSON object at the top level (OpenAI json_object), values of any JSON type inside. */
celer_status json_object_gbnf(const char *root, const char *prefix, char **gbnf, celer_error *e);

#endif
