/*
 * celer_grammar.c - the public structured-output API of celer.h: a JSON Schema or a regex
 * (as text) to a GBNF grammar, over json_schema.h and regex_gbnf.h. It parses the schema
 * text with jansson and reports errors into the caller's buffer; it compiles nothing itself.
 */
#include "celer.h"

#include "base/error.h"
#include "sampling/json_schema.h"
#include "sampling/regex_gbnf.h"

#include <string.h>

celer_status celer_json_schema_to_grammar(const char *schema_json, char **gbnf, char *err,
                                          size_t err_size) {
    return celer_json_schema_to_grammar_rules(schema_json, "root", "", gbnf, err, err_size);
}

celer_status celer_json_schema_to_grammar_rules(const char *schema_json, const char *root,
                                                const char *prefix, char **gbnf, char *err,
                                                size_t err_size) {
    celer_error e = {{0}};
    celer_status st;
    *gbnf = NULL;
    json_error_t je;
    json_t *schema =
        schema_json ? json_loads(schema_json, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je) : NULL;
    if (!schema)
        st = error_set(&e, CELER_STATUS_INVALID_ARGUMENT, "schema: line %d, column %d: %s",
                       schema_json ? je.line : 0, schema_json ? je.column : 0,
                       schema_json ? je.text : "no schema given");
    else
        st = json_schema_to_gbnf(schema, root, prefix, gbnf, &e);
    json_decref(schema);
    if (st != CELER_OK) error_copy(&e, err, err_size);
    return st;
}

celer_status celer_regex_to_grammar(const char *regex, char **gbnf, char *err, size_t err_size) {
    celer_error e = {{0}};
    *gbnf = NULL;
    celer_status st = regex ? regex_to_gbnf(regex, strlen(regex), "root", "", gbnf, &e)
                            : error_set(&e, CELER_STATUS_INVALID_ARGUMENT, "regex: no regex given");
    if (st != CELER_OK) error_copy(&e, err, err_size);
    return st;
}
