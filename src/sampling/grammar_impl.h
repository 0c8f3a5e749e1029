/*
 * grammar_impl.h - the insides of a compiled grammar, shared by grammar_parse.c (which
 * builds them), grammar.c (which runs them) and the tests (whose reference recognizer
 * reads the parsed rules).
 *
 * Two views of one grammar: the rule tree as parsed (gnode, over code points), and the
 * byte-level automaton compiled from it (gstate/gedge): each rule is a small NFA of byte
 * ranges, epsilon moves and calls of other rules. Only src/sampling/ and tests include it.
 */
#ifndef CELER_SAMPLING_GRAMMAR_IMPL_H
#define CELER_SAMPLING_GRAMMAR_IMPL_H

#include "sampling/grammar.h"

/* Limits that keep a hostile grammar bounded; each is refused with a clear error. */
#define GRAMMAR_MAX_NESTING 128       /* parentheses inside one rule */
#define GRAMMAR_MAX_REPEAT  2000      /* {m,n}: m above it is refused, n above it is "no limit" */
#define GRAMMAR_MAX_STATES  (1 << 22) /* automaton states */
#define GRAMMAR_NO_MAX      UINT32_MAX

/* ==== Rule tree ==== */

typedef enum gnode_kind {
    GN_ALT,    /* kids: alternatives (each a GN_SEQ) */
    GN_SEQ,    /* kids: elements in order */
    GN_CHARS,  /* a literal: pool[off .. off + n) code points */
    GN_CLASS,  /* pool[off .. off + 2n) inclusive [lo, hi] pairs, sorted and merged; negated */
    GN_ANY,    /* '.' */
    GN_REF,    /* ref: rule index */
    GN_REPEAT, /* kids[0] repeated min..max times (max GRAMMAR_NO_MAX: no limit) */
} gnode_kind;

typedef struct gnode {
    gnode_kind kind;
    bool negated;
    int32_t kid, n_kid; /* into grammar.kids */
    int32_t off, n;     /* into grammar.pool */
    int32_t ref;
    uint32_t min, max;
} gnode;

typedef struct grule {
    char *name;
    int32_t body;        /* a GN_ALT node, -1 while only referenced */
    int32_t line, col;   /* of the definition (or first reference while undefined) */
    uint32_t start, end; /* automaton states */
    int32_t owner;       /* the named rule a synthesized one (a repetition) belongs to */
    bool nullable;
} grule;

/* ==== Automaton ==== */

typedef enum gedge_kind { GE_BYTE, GE_EPS, GE_CALL } gedge_kind;

typedef struct gedge {
    uint8_t kind, lo, hi; /* GE_BYTE: bytes lo..hi */
    uint32_t to;          /* the next state; for GE_CALL the state to return to */
    int32_t rule;         /* GE_CALL: the rule called */
} gedge;

#define GSTATE_END   1u /* a rule's end state */
#define GSTATE_BYTES 2u /* has at least one GE_BYTE edge */

struct grammar {
    gnode *nodes;
    int32_t n_nodes;
    int32_t *kids;
    int32_t n_kids;
    uint32_t *pool;
    int32_t n_pool;
    grule *rules;
    int32_t n_rules; /* named rules first (n_named), then synthesized ones */
    int32_t n_named;
    int32_t root;
    /* automaton: state s's edges are edges[edge_start[s] .. edge_start[s + 1]) */
    uint32_t n_states;
    uint32_t *edge_start;
    gedge *edges;
    uint8_t *flags;
    /* bytes no edge tells apart share a class: byte_class[b] in 0 .. n_classes - 1 */
    uint8_t byte_class[256];
    uint8_t class_byte[256]; /* a representative byte of each class */
    int n_classes;
};

#endif
