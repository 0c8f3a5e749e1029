/*
 * tok_impl.h - the insides of a tokenizer shared by its source files: the component
 * tree read from tokenizer.json, growable byte strings and string lists, UTF-8 helpers.
 *
 * Only src/tokenizer/ includes this; everyone else sees tokenizer.h.
 */
#ifndef CELER_TOKENIZER_TOK_IMPL_H
#define CELER_TOKENIZER_TOK_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/strmap.h"
#include "tokenizer/tokenizer.h"

#include <pcre2.h>

/* ==== Strings ==== */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

bool sbuf_add(sbuf *b, const void *p, size_t n);
bool sbuf_addc(sbuf *b, char c);

/* A piece of text during encoding: owned bytes and whether it starts at byte 0 of the
 * input (Metaspace's prepend_scheme "first" asks). */
typedef struct piece {
    char *s;
    size_t n;
    bool first;
} piece;

typedef struct pieces {
    piece *v;
    size_t n, cap;
} pieces;

bool pieces_add(pieces *l, const char *s, size_t n, bool first);
void pieces_free(pieces *l);

/* ==== UTF-8 ==== */

/* Length of the valid UTF-8 sequence at s[0..n) (1-4), or 0 when invalid; *cp gets the
 * code point. *bad (if not NULL) gets the length of the maximal invalid subpart. */
int utf8_next(const char *s, size_t n, uint32_t *cp, int *bad);
/* Byte offset of the first invalid sequence, or n when s is valid. */
size_t utf8_check(const char *s, size_t n);
int utf8_put(char *out, uint32_t cp);
/* Appends s with every invalid subpart replaced by U+FFFD (Rust from_utf8_lossy). */
bool utf8_lossy(sbuf *out, const char *s, size_t n);
/* Appends id to the growing array *ids (*n used, *cap allocated); false when out of memory. */
bool ids_push(int32_t **ids, int64_t *n, int64_t *cap, int32_t id);
bool unicode_is_space(uint32_t cp);

/* ==== Components ==== */

typedef enum split_behavior {
    SPLIT_REMOVED,
    SPLIT_ISOLATED,
    SPLIT_MERGED_WITH_PREVIOUS,
    SPLIT_MERGED_WITH_NEXT,
    SPLIT_CONTIGUOUS,
} split_behavior;

/* A Split/Replace pattern: a literal string or a compiled regex. */
typedef struct pattern {
    char *lit;
    size_t lit_n;
    pcre2_code *re; /* NULL for a literal */
} pattern;

typedef enum norm_kind { NORM_NFC, NORM_NFKC, NORM_PREPEND, NORM_REPLACE, NORM_SEQUENCE } norm_kind;

typedef struct normalizer {
    norm_kind kind;
    pattern pat;   /* Replace */
    char *str;     /* Prepend's prepend, Replace's content */
    size_t str_n;
    struct normalizer *sub; /* Sequence */
    size_t n_sub;
} normalizer;

typedef enum pretok_kind { PRE_SPLIT, PRE_BYTE_LEVEL, PRE_METASPACE, PRE_DIGITS, PRE_SEQUENCE } pretok_kind;

typedef enum prepend_scheme { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } prepend_scheme;

typedef struct pretok {
    pretok_kind kind;
    pattern pat; /* Split; ByteLevel's GPT-2 regex when use_regex */
    split_behavior behavior;
    bool invert;
    bool add_prefix_space, use_regex; /* ByteLevel */
    uint32_t replacement;             /* Metaspace */
    prepend_scheme scheme;
    bool split;
    bool individual_digits; /* Digits */
    struct pretok *sub;
    size_t n_sub;
} pretok;

typedef enum decoder_kind {
    DEC_BYTE_LEVEL,
    DEC_BYTE_FALLBACK,
    DEC_FUSE,
    DEC_STRIP,
    DEC_REPLACE,
    DEC_METASPACE,
    DEC_SEQUENCE,
} decoder_kind;

typedef struct decoder {
    decoder_kind kind;
    pattern pat; /* Replace */
    char *str;   /* Replace's content */
    size_t str_n;
    uint32_t ch; /* Strip's content, Metaspace's replacement */
    int64_t start, stop;
    prepend_scheme scheme;
    struct decoder *sub;
    size_t n_sub;
} decoder;

typedef struct added_token {
    int32_t id;
    char *s;
    size_t n;
    char *pat;    /* what is matched: s, or s normalized when normalized is set */
    size_t pat_n;
    bool lstrip, rstrip, normalized, single_word, special;
} added_token;

/* The BPE model. Token strings live in one buffer; id_tok[id] indexes it. */
typedef struct bpe {
    char *strs;        /* every token string, each NUL-terminated */
    size_t *id_off;    /* [n_ids] offset into strs, SIZE_MAX for an unused id */
    uint32_t *id_len;  /* [n_ids] */
    int64_t n_ids;     /* max id + 1 */
    strmap vocab;
    u64map merges;     /* (left id << 32 | right id) -> merge index */
    int32_t *merge_rank, *merge_new; /* [n_merges] */
    int64_t n_merges;
    int32_t unk;       /* -1 = none */
    int32_t byte_id[256]; /* <0xNN> ids when byte_fallback, else -1 */
    bool byte_fallback, fuse_unk, ignore_merges;
    char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix, or NULL */
    size_t prefix_n, suffix_n;
} bpe;

/* TemplateProcessing "single": a list of ids with -1 marking where sequence A goes. */
typedef struct template_proc {
    int32_t *ids;
    size_t n;
    bool present;
} template_proc;

struct tokenizer {
    char *name; /* the file, for messages */
    bpe model;
    added_token *added;
    size_t n_added;
    normalizer *norm;
    pretok *pre;
    decoder *dec;
    template_proc tmpl;
    strmap added_map; /* added token content -> index in added */
    int32_t max_added_id;
    /* Added tokens to match before pre-tokenization, [0] on the raw text (normalized
     * false), [1] after normalization: indices into added, grouped by first byte
     * (match_start[k][b] .. match_start[k][b + 1]), longest first within a group. */
    int32_t *match[2];
    size_t match_start[2][257];
    int32_t *added_index; /* [n_total] id -> index in added, or -1 */
    int64_t n_total;      /* every id below this is the model's or an added token's */
};

/* ==== Functions across files ==== */

/* tok_load.c: frees every part of t, then t. */
void tok_destroy(tokenizer *t);
/* tokenizer.c: builds the match and id indices once the components are loaded. */
celer_status tok_index(tokenizer *t, celer_error *e);

/* tok_text.c */
celer_status pattern_compile(pattern *p, const char *re, size_t n, const char *where,
                             const char *file, celer_error *e);
void pattern_free(pattern *p);
void normalizer_free(normalizer *n);
void pretok_free(pretok *p);
void decoder_free(decoder *d);
celer_status normalize(const normalizer *nz, const char *s, size_t n, sbuf *out, celer_error *e);
/* Applies p to every piece of *l in place. */
celer_status pretokenize(const pretok *p, pieces *l, celer_error *e);
/* Decodes token strings tok[n] into out. raw keeps invalid UTF-8 bytes as they are (for
 * the streaming detokenizer) instead of U+FFFD. */
celer_status decode_tokens(const decoder *d, pieces *toks, bool raw, celer_error *e);
/* The GPT-2 byte -> code point map of ByteLevel. */
uint32_t byte_level_char(uint8_t b);

/* tok_bpe.c: appends the ids of one pre-tokenized word. */
celer_status bpe_word(const bpe *m, const char *w, size_t n, int32_t **ids, int64_t *n_ids,
                      int64_t *cap, celer_error *e);
void bpe_free(bpe *m);

#endif
