/*
 * chat_template_impl.h - the syntax tree shared by the chat template parser
 * (chat_template_parse.c) and evaluator (chat_template.c). Not a public interface.
 */
#ifndef CELER_TOKENIZER_CHAT_TEMPLATE_IMPL_H
#define CELER_TOKENIZER_CHAT_TEMPLATE_IMPL_H

#include "tokenizer/chat_template.h"

typedef enum ct_kind {
    /* statements */
    CT_TEXT,    /* s: literal output */
    CT_OUTPUT,  /* a: expression to print */
    CT_IF,      /* a: condition, b: then body, c: else body (another CT_IF for elif) */
    CT_FOR,     /* kids: target names, a: iterable, b: body, c: else body, d: filter */
    CT_SET,     /* kids: target names (one may be "ns.attr" via a), a: value */
    CT_SET_ATTR,/* a: object name expr, s: attribute, b: value */
    CT_SET_BLOCK, /* s: name, b: body */
    CT_MACRO,   /* s: name, kids: params (CT_NAME with a = default or NULL), b: body */
    CT_BODY,    /* kids: statements */
    CT_BREAK,
    CT_CONTINUE,
    /* expressions */
    CT_LIT,     /* v: literal (str/int/float/bool/none) */
    CT_NAME,    /* s */
    CT_LIST,    /* kids */
    CT_TUPLE,   /* kids */
    CT_DICT,    /* kids: key, value, key, value... */
    CT_ATTR,    /* a . s */
    CT_INDEX,   /* a [ b ] */
    CT_SLICE,   /* a [ kids[0] : kids[1] : kids[2] ] (NULL parts) */
    CT_CALL,    /* a ( kids ) with kw names in kw[] (NULL for positional) */
    CT_FILTER,  /* a | s ( kids ) */
    CT_TEST,    /* a is [not] s ( kids ); i = negated */
    CT_UNARY,   /* op a */
    CT_BINARY,  /* a op b */
    CT_AND,
    CT_OR,
    CT_NOT,
    CT_COND,    /* b if a else c */
} ct_kind;

enum { CT_LIT_NONE, CT_LIT_BOOL, CT_LIT_INT, CT_LIT_FLOAT, CT_LIT_STR };

typedef struct ct_node ct_node;
struct ct_node {
    ct_kind kind;
    int line, col;
    int op;         /* operator token for UNARY/BINARY */
    int lit;        /* CT_LIT_* */
    int64_t i;
    double f;
    const char *s;  /* NUL-terminated, slen bytes */
    size_t slen;
    ct_node *a, *b, *c, *d;
    ct_node **kids;
    const char **kw; /* per kid: keyword name or NULL */
    size_t n;
};

/* binary operator codes (also tokens) */
enum {
    CT_OP_ADD = 1, CT_OP_SUB, CT_OP_MUL, CT_OP_DIV, CT_OP_FLOORDIV, CT_OP_MOD, CT_OP_POW,
    CT_OP_CONCAT, CT_OP_EQ, CT_OP_NE, CT_OP_LT, CT_OP_LE, CT_OP_GT, CT_OP_GE, CT_OP_IN,
    CT_OP_NOTIN,
};

typedef struct ct_pool ct_pool;

struct chat_template {
    ct_pool *pool; /* owns every node and string */
    ct_node *root; /* CT_BODY */
};

/* Bump allocation from the template's pool (zeroed); NULL when out of memory. */
void *ct_pool_alloc(ct_pool **p, size_t size);
void ct_pool_free(ct_pool *p);

#endif
