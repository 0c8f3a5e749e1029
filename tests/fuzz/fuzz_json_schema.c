/*
 * fuzz_json_schema.c - libFuzzer target for the JSON Schema compiler.
 *
 * The input is a JSON document parsed with jansson, then compiled to GBNF. Compiling must
 * fail with a message or give text that the grammar engine parses (the compiler never
 * writes GBNF that fails to parse); never crash, leak, or run unbounded.
 */
#include "sampling/grammar.h"
#include "sampling/json_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *s = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!s) return 0;
    char *text = NULL;
    celer_error e;
    if (json_schema_to_gbnf(s, "root", "p-", &text, &e) == CELER_OK) {
        grammar *g = NULL;
        if (grammar_parse(text, strlen(text), &g, &e) != CELER_OK) {
            fprintf(stderr, "compiled grammar does not parse: %s\n%s\n", e.msg, text);
            abort();
        }
        grammar_free(g);
        free(text);
    }
    json_decref(s);
    return 0;
}
