/*
 * fuzz_regex.c - libFuzzer target for the regex compiler.
 *
 * The input is a regex. Compiling must fail with a message or give GBNF that the grammar
 * engine parses; the same holds for the JSON-string form used by JSON Schema `pattern`.
 * Never crash, leak, or run unbounded.
 */
#include "sampling/grammar.h"
#include "sampling/regex_gbnf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void must_parse(const char *text) {
    grammar *g = NULL;
    celer_error e;
    if (grammar_parse(text, strlen(text), &g, &e) != CELER_OK) {
        fprintf(stderr, "compiled grammar does not parse: %s\n%s\n", e.msg, text);
        abort();
    }
    grammar_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = NULL;
    celer_error e;
    if (regex_to_gbnf((const char *)data, size, "root", "", &text, &e) == CELER_OK) {
        must_parse(text);
        free(text);
    }
    gbnf_buf b = {0};
    gbnf_buf_puts(&b, "root ::= \"\\\"\" ");
    if (regex_gbnf_json_pattern((const char *)data, size, "c", &b, &e) == CELER_OK) {
        gbnf_buf_puts(&b, " \"\\\"\"\nc ::= [^\"\\\\] | \"\\\\\" [\"\\\\nt]\n");
        if (!b.failed) must_parse(b.s);
    }
    gbnf_buf_free(&b);
    return 0;
}
