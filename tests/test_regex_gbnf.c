/*
 * test_regex_gbnf.c - regex -> GBNF (sampling/regex_gbnf.h) against PCRE2 itself: for each
 * pattern, random strings over an alphabet drawn from the pattern (plus a few others) and
 * random sentences drawn from the compiled grammar are matched both by PCRE2 (UTF, anchored
 * at both ends) and by the grammar; the verdicts must agree. Then the refusals, each named.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "harness.h"

#include "grammar_walk.h"
#include "sampling/regex_gbnf.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const patterns[] = {
    "abc",          "a|b|cd",       "a*",       "a+b?",
    "(ab)*c",       "a{3}",         "a{2,}",    "a{1,3}b{0,2}",
    "[a-c]+",       "[^a-c]x",      "\\d{2,4}", "\\w+",
    "\\s?x\\S",     "\\D\\W",       ".a.",      "(a|bc)+d?",
    "(?:ab|cd){2}", "x(?<n>y|z)*",  "[\\d.]+",  "[-a]b[a-]",
    "\\.\\*\\+\\?", "\\x41\\x{42}", "é+ü?",     "[α-ω]{1,2}",
    "^ab$",         "^a|b$",        "a\\tb",    "[\\]\\[]+",
    "((a|b)c)*",    "a{0,2}?b",     "[^\\n]+",  "\\u00e9|\\u0041\\x42",
    "(a*)*b",       "\\n|\\r",      "[a-z&&]",  "z{0}y",
};

static bool pcre_full(pcre2_code *re, const char *s, size_t n) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

static void check_pattern(const char *pat, grammar_vocab *v, int *n_checked) {
    int errcode;
    PCRE2_SIZE erroff;
    /* \uHHHH is ECMAScript's; PCRE2 reads it with PCRE2_ALT_BSUX (which then takes \x as
     * exactly two hex digits, no \x{...}) */
    uint32_t opts = PCRE2_UTF | (strstr(pat, "\\u") ? PCRE2_ALT_BSUX : 0);
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opts, &errcode, &erroff, NULL);
    if (!CHECK(re != NULL, "%s: PCRE2 compiles it", pat)) return;
    char *text = NULL;
    celer_error e;
    grammar *g = NULL;
    if (!CHECK(regex_to_gbnf(pat, strlen(pat), "root", "", &text, &e) == CELER_OK,
               "%s compiles: %s", pat, e.msg) ||
        !CHECK(grammar_parse(text, strlen(text), &g, &e) == CELER_OK, "%s: grammar parses: %s\n%s",
               pat, e.msg, text)) {
        free(text);
        pcre2_code_free(re);
        return;
    }
    /* the alphabet: the pattern's own bytes as characters, plus a few others */
    const char *extra[] = {"a", "b", "x", "0", "9", " ", "\n", "é",
                           "ω", "_", "-", ".", "z", "A", "😀"};
    const char *alpha[64];
    int na = 0;
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) alpha[na++] = extra[i];
    static char singles[64][2];
    for (size_t i = 0; pat[i] && na < 64; i++)
        if ((unsigned char)pat[i] < 0x80) singles[na][0] = pat[i], alpha[na] = singles[na], na++;
    uint64_t rng = 0x12345678ull + strlen(pat) * 7919;
    int bad = 0, pos = 0;
    char buf[256];
    for (int t = 0; t < 400; t++) {
        size_t n = 0;
        if (t % 2) {
            long k = walk_sentence(g, v, &rng, buf, 64);
            if (k < 0) continue;
            n = (size_t)k;
        } else {
            int len = (int)(walk_rand(&rng) % 7);
            for (int i = 0; i < len; i++) {
                const char *c = alpha[walk_rand(&rng) % (uint64_t)na];
                memcpy(buf + n, c, strlen(c)), n += strlen(c);
            }
            buf[n] = 0;
        }
        bool want = pcre_full(re, buf, n), got = walk_accepts(g, v, buf, n);
        pos += want;
        if (want != got && bad++ < 3)
            CHECK(false, "/%s/ on \"%s\": PCRE2 %s, the grammar %s", pat, buf,
                  want ? "matches" : "does not match", got ? "accepts" : "rejects");
        (*n_checked)++;
    }
    CHECK(bad == 0, "/%s/: grammar and PCRE2 agree (%d matches)", pat, pos);
    CHECK(pos > 0, "/%s/: some strings match", pat);
    grammar_free(g);
    free(text);
    pcre2_code_free(re);
}

static void expect_refused(const char *pat, const char *want) {
    char *text = NULL;
    celer_error e = {{0}};
    celer_status st = regex_to_gbnf(pat, strlen(pat), "root", "", &text, &e);
    CHECK(st != CELER_OK && !text && strstr(e.msg, want), "/%s/: error containing '%s', got '%s'",
          pat, want, st == CELER_OK ? "(compiled)" : e.msg);
    free(text);
}

int main(void) {
    grammar_vocab *v = walk_vocab();
    int n = 0;
    for (size_t i = 0; i < sizeof patterns / sizeof *patterns; i++)
        check_pattern(patterns[i], v, &n);
    printf("regex: %zu patterns, %d strings checked against PCRE2\n",
           sizeof patterns / sizeof *patterns, n);
    expect_refused("(a)\\1", "regex at offset 3: backreference \\1 is not supported");
    expect_refused("(?<x>a)\\k<x>", "backreference \\k");
    expect_refused("a(?=b)", "regex at offset 1: lookahead is not supported");
    expect_refused("a(?!b)", "lookahead");
    expect_refused("(?<=a)b", "lookbehind");
    expect_refused("(?<!a)b", "lookbehind");
    expect_refused("\\bword", "word boundary \\b");
    expect_refused("\\p{L}+", "Unicode property \\p");
    expect_refused("(?i)abc", "inline flags");
    expect_refused("a++", "possessive quantifier");
    expect_refused("[[:alpha:]]", "POSIX class");
    expect_refused("a{1001}", "repetition count above 1000");
    expect_refused("a{3,2}", "n < m");
    expect_refused("a^b", "anchor ^ inside the pattern");
    expect_refused("a$b", "anchor $ inside the pattern");
    expect_refused("(ab", "unbalanced parenthesis");
    expect_refused("ab)", "unbalanced parenthesis");
    expect_refused("[abc", "unterminated character class");
    expect_refused("[z-a]", "range out of order");
    expect_refused("*a", "quantifier * without an atom");
    expect_refused("a**", "quantifier follows a quantifier");
    expect_refused("\\", "ends with a backslash");
    expect_refused("\\q", "unknown escape \\q");
    expect_refused("\xff", "not valid UTF-8");
    expect_refused("\\Aa", "anchor \\A");
    /* bounded: nested groups beyond the cap */
    char deep[400];
    memset(deep, '(', 100), memset(deep + 100, 'a', 1), memset(deep + 101, ')', 100), deep[201] = 0;
    expect_refused(deep, "nested deeper than 64");
    grammar_vocab_free(v);
    return harness_done("test_regex_gbnf");
}
