/*
 * chat_template_parse.c - lexer and parser of the chat template Jinja subset.
 *
 * The lexer splits the source into text and tags the way Jinja's does under
 * transformers' settings: newlines normalized to \n, one trailing newline dropped,
 * trim_blocks (the newline after a block or comment tag goes), lstrip_blocks (spaces
 * before a block or comment tag alone on its line go), and the "-" / "+" whitespace
 * controls. The parser builds the tree of chat_template_impl.h with Jinja's operator
 * precedence. Every error names the line and column. It evaluates nothing and knows no
 * filter or method names: those are checked when rendering reaches them.
 */
#include "tokenizer/chat_template_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== Pool ==== */

struct ct_pool {
    ct_pool *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *ct_pool_alloc(ct_pool **p, size_t size) {
    size = (size + 15) & ~(size_t)15;
    if (!*p || (*p)->cap - (*p)->used < size) {
        size_t cap = size > 65536 ? size : 65536;
        ct_pool *b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = *p, b->used = 0, b->cap = cap;
        *p = b;
    }
    void *r = (*p)->data + (*p)->used;
    (*p)->used += size;
    memset(r, 0, size);
    return r;
}

void ct_pool_free(ct_pool *p) {
    while (p) {
        ct_pool *n = p->next;
        free(p);
        p = n;
    }
}

/* ==== Lexer ==== */

enum { T_EOF, T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STR, T_INT, T_FLOAT, T_OP };

/* operator tokens beyond the CT_OP_* codes */
enum { P_LPAREN = 64, P_RPAREN, P_LBRACK, P_RBRACK, P_LBRACE, P_RBRACE, P_COMMA, P_DOT, P_COLON, P_PIPE, P_ASSIGN };

typedef struct tok {
    int type, op;
    int line, col;
    const char *s;
    size_t len;
    int64_t i;
    double f;
} tok;

typedef struct parser {
    const char *src;
    size_t len;
    size_t *line_start;
    size_t n_lines;
    tok *t;
    size_t nt, cap, p;
    ct_pool **pool;
    celer_error *e;
    int depth;
} parser;

static void where(const parser *ps, size_t pos, int *line, int *col) {
    size_t lo = 0, hi = ps->n_lines;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (ps->line_start[mid] <= pos) lo = mid;
        else hi = mid;
    }
    *line = (int)lo + 1;
    *col = (int)(pos - ps->line_start[lo]) + 1;
}

static celer_status fail_at(parser *ps, int line, int col, const char *msg, const char *arg) {
    return error_set(ps->e, CELER_STATUS_BAD_FILE, "template line %d column %d: %s%s%s%s", line, col, msg,
                     arg ? " '" : "", arg ? arg : "", arg ? "'" : "");
}

static celer_status fail_pos(parser *ps, size_t pos, const char *msg) {
    int l, c;
    where(ps, pos, &l, &c);
    return fail_at(ps, l, c, msg, NULL);
}

static tok *push(parser *ps, int type, size_t pos) {
    if (ps->nt == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 256;
        tok *t = realloc(ps->t, cap * sizeof *t);
        if (!t) return NULL;
        ps->t = t, ps->cap = cap;
    }
    tok *t = &ps->t[ps->nt++];
    memset(t, 0, sizeof *t);
    t->type = type;
    where(ps, pos, &t->line, &t->col);
    return t;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Appends the UTF-8 encoding of cp to out; returns bytes written. */
static size_t put_utf8(char *out, uint32_t cp) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | ((cp >> 6) & 63)),
               out[2] = (char)(0x80 | (cp & 63)), 3;
    return out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | ((cp >> 12) & 63)),
           out[2] = (char)(0x80 | ((cp >> 6) & 63)), out[3] = (char)(0x80 | (cp & 63)), 4;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A quoted literal at src[*pos] (the quote); Python escapes. */
static celer_status lex_string(parser *ps, size_t *pos) {
    const char *s = ps->src;
    size_t start = *pos, i = start + 1;
    char q = s[start];
    char *out = ct_pool_alloc(ps->pool, ps->len - start + 1);
    if (!out) return error_set(ps->e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory");
    size_t n = 0;
    for (;; i++) {
        if (i >= ps->len) return fail_pos(ps, start, "unterminated string literal");
        char c = s[i];
        if (c == q) break;
        if (c != '\\') {
            out[n++] = c;
            continue;
        }
        if (++i >= ps->len) return fail_pos(ps, start, "unterminated string literal");
        c = s[i];
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (digits) {
            uint32_t cp = 0;
            for (int k = 0; k < digits; k++) {
                int h = i + 1 + (size_t)k < ps->len ? hexval(s[i + 1 + k]) : -1;
                if (h < 0) return fail_pos(ps, i - 1, "bad escape in string literal");
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return fail_pos(ps, i - 1, "bad escape in string literal");
            i += (size_t)digits;
            n += put_utf8(out + n, cp);
            continue;
        }
        switch (c) {
        case 'n': out[n++] = '\n'; break;
        case 't': out[n++] = '\t'; break;
        case 'r': out[n++] = '\r'; break;
        case '0': out[n++] = '\0'; break;
        case 'a': out[n++] = '\a'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'v': out[n++] = '\v'; break;
        case '\\': case '\'': case '"': out[n++] = c; break;
        case '\n': break; /* line continuation */
        default: out[n++] = '\\', out[n++] = c; break;
        }
    }
    tok *t = push(ps, T_STR, start);
    if (!t) return error_set(ps->e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory");
    out[n] = 0;
    t->s = out, t->len = n;
    *pos = i + 1;
    return CELER_OK;
}

static const struct {
    const char *s;
    int op;
} ops[] = {
    {"//", CT_OP_FLOORDIV}, {"**", CT_OP_POW}, {"==", CT_OP_EQ}, {"!=", CT_OP_NE}, {"<=", CT_OP_LE},
    {">=", CT_OP_GE},       {"+", CT_OP_ADD},  {"-", CT_OP_SUB}, {"*", CT_OP_MUL}, {"/", CT_OP_DIV},
    {"%", CT_OP_MOD},       {"~", CT_OP_CONCAT}, {"<", CT_OP_LT}, {">", CT_OP_GT}, {"(", P_LPAREN},
    {")", P_RPAREN},        {"[", P_LBRACK},   {"]", P_RBRACK},  {"{", P_LBRACE},  {"}", P_RBRACE},
    {",", P_COMMA},         {".", P_DOT},      {":", P_COLON},   {"|", P_PIPE},    {"=", P_ASSIGN},
};

/* Tokens of one tag from *pos (just past the opener and its sign) to its closer. */
static celer_status lex_tag(parser *ps, size_t *pos, bool block, bool *line_starting) {
    const char *s = ps->src;
    size_t i = *pos;
    int depth = 0;
    for (;;) {
        while (i < ps->len && is_space(s[i])) i++;
        if (i >= ps->len) return fail_pos(ps, *pos - 2, block ? "unclosed '{%' tag" : "unclosed '{{' tag");
        char c = s[i];
        /* the closer, with its whitespace control */
        char end = block ? '%' : '}';
        size_t k = i;
        int sign = 0;
        if ((c == '-' || c == '+') && k + 2 < ps->len + 1 && s[k + 1] == end && k + 2 < ps->len && s[k + 2] == '}')
            sign = c, k++;
        if (depth == 0 && k + 1 < ps->len && s[k] == end && s[k + 1] == '}') {
            if (!push(ps, block ? T_BLOCK_END : T_VAR_END, i))
                return error_set(ps->e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory");
            i = k + 2;
            if (sign == '-') {
                while (i < ps->len && is_space(s[i])) i++;
            } else if (block && sign != '+' && i < ps->len && s[i] == '\n') {
                i++;
            }
            *line_starting = i > 0 && s[i - 1] == '\n';
            *pos = i;
            return CELER_OK;
        }
        if (c == '\'' || c == '"') {
            celer_status st = lex_string(ps, &i);
            if (st != CELER_OK) return st;
            continue;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t j = i;
            while (j < ps->len && ((s[j] >= 'a' && s[j] <= 'z') || (s[j] >= 'A' && s[j] <= 'Z') ||
                                   (s[j] >= '0' && s[j] <= '9') || s[j] == '_'))
                j++;
            tok *t = push(ps, T_NAME, i);
            if (!t) return error_set(ps->e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory");
            char *nm = ct_pool_alloc(ps->pool, j - i + 1);
            if (!nm) return error_set(ps->e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory");
            memcpy(nm, s + i, j - i);
            t->s = nm, t->len = j - i;
            i = j;
            continue;
        }
        if (c >= '0' && c <= '9') {
            size_t j = i;
            bool is_float = false;
            while (j < ps->len && ((s[j] >= '0' && s[j] <= '9') || s[j] == '_')) j++;
            if (j + 1 < ps->len && s[j] == '.' && s[j + 1] >= '0' && s[j + 1] <= '9') {
                is_float = true;
                for (j++; j < ps->len && ((s[j] >= '0' && s[j] <= '9') || s[j] == '_'); j++) {}
            }
            if (j < ps->len && (s[j] == 'e' || s[j] == 'E')) {
                size_t m = j + 1;
                if (m < ps->len && (s[m] == '+' || s[m] == '-')) m++;
                if (m < ps->len && s[m] >= '0' && s[m] <= '9') {
                    is_float = true;
                    for (j = m; j < ps->len && s[j] >= '0' && s[j] <= '9'; j++) {}
                }
            }
            char buf[64];
            size_t nb = 0;
            for (size_t m = i; m < j && nb < sizeof buf - 1; m++)
                if (s[m] != '_') buf[nb++] = s[m];
            buf[nb] = 0;
            if (j - i >= sizeof buf - 1) return fail_pos(ps, i, "number literal too long");
            tok *t = push(ps, is_float ? T_FLOAT : T_INT, i);
            if (!t) return error_set(ps->e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory");
            if (is_float) t->f = strtod(buf, NULL);
            else {
                char *endp;
                unsigned long long v = strtoull(buf, &endp, 10);
                if (v > INT64_MAX) return fail_pos(ps, i, "integer literal too large");
                t->i = (int64_t)v;
            }
            i = j;
            continue;
        }
        size_t o = 0;
        for (; o < sizeof ops / sizeof ops[0]; o++) {
            size_t l = strlen(ops[o].s);
            if (i + l <= ps->len && !memcmp(s + i, ops[o].s, l)) break;
        }
        if (o == sizeof ops / sizeof ops[0]) return fail_pos(ps, i, "unexpected character in tag");
        tok *t = push(ps, T_OP, i);
        if (!t) return error_set(ps->e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory");
        t->op = ops[o].op;
        if (t->op == P_LPAREN || t->op == P_LBRACK || t->op == P_LBRACE) depth++;
        if ((t->op == P_RPAREN || t->op == P_RBRACK || t->op == P_RBRACE) && depth > 0) depth--;
        i += strlen(ops[o].s);
    }
}

static celer_status lex(parser *ps) {
    const char *s = ps->src;
    size_t i = 0;
    bool line_starting = true;
    while (i < ps->len) {
        /* next opener */
        size_t m = i;
        int kind = 0; /* '{', '%', '#' */
        for (; m + 1 < ps->len; m++)
            if (s[m] == '{' && (s[m + 1] == '{' || s[m + 1] == '%' || s[m + 1] == '#')) {
                kind = s[m + 1];
                break;
            }
        if (!kind) m = ps->len;
        size_t text_end = m;
        int sign = kind && m + 2 < ps->len && (s[m + 2] == '-' || s[m + 2] == '+') ? s[m + 2] : 0;
        if (sign == '-') {
            while (text_end > i && is_space(s[text_end - 1])) text_end--;
        } else if (kind && sign != '+' && kind != '{') {
            size_t l = text_end;
            while (l > i && s[l - 1] != '\n') l--;
            bool at_line = l > i || (l == i && line_starting);
            bool ws = l < text_end;
            for (size_t k = l; k < text_end; k++) ws = ws && is_space(s[k]);
            if (at_line && ws) text_end = l;
        }
        if (text_end > i) {
            tok *t = push(ps, T_TEXT, i);
            if (!t) return error_set(ps->e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory");
            t->s = s + i, t->len = text_end - i;
        }
        if (!kind) break;
        size_t body = m + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t k = body;
            while (k + 1 < ps->len && !(s[k] == '#' && s[k + 1] == '}')) k++;
            if (k + 1 >= ps->len) return fail_pos(ps, m, "unclosed comment");
            bool strip = k > body && s[k - 1] == '-';
            i = k + 2;
            if (strip) {
                while (i < ps->len && is_space(s[i])) i++;
            } else if (!(k > body && s[k - 1] == '+') && i < ps->len && s[i] == '\n') {
                i++;
            }
            line_starting = i > 0 && s[i - 1] == '\n';
            continue;
        }
        bool block = kind == '%';
        if (!push(ps, block ? T_BLOCK_BEGIN : T_VAR_BEGIN, m))
            return error_set(ps->e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory");
        i = body;
        celer_status st = lex_tag(ps, &i, block, &line_starting);
        if (st != CELER_OK) return st;
    }
    if (!push(ps, T_EOF, ps->len)) return error_set(ps->e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory");
    return CELER_OK;
}

/* ==== Parser ==== */

#define MAX_DEPTH 200

static tok *cur(parser *ps) { return &ps->t[ps->p]; }
static bool is_op(parser *ps, int op) { return cur(ps)->type == T_OP && cur(ps)->op == op; }
static bool is_name(parser *ps, const char *nm) { return cur(ps)->type == T_NAME && !strcmp(cur(ps)->s, nm); }

static celer_status fail_tok(parser *ps, const char *msg, const char *arg) {
    tok *t = cur(ps);
    return fail_at(ps, t->line, t->col, msg, arg);
}

static const char *tok_desc(const tok *t) {
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_TEXT: return "text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_NAME: return "a name";
    case T_STR: return "a string";
    case T_INT: case T_FLOAT: return "a number";
    default: return "an operator";
    }
}

static celer_status unexpected(parser *ps, const char *wanted) {
    char msg[160];
    snprintf(msg, sizeof msg, "expected %s, found %s", wanted, tok_desc(cur(ps)));
    return fail_tok(ps, msg, cur(ps)->type == T_NAME ? cur(ps)->s : NULL);
}

static ct_node *mk(parser *ps, ct_kind k, const tok *at) {
    ct_node *n = ct_pool_alloc(ps->pool, sizeof *n);
    if (!n) return NULL;
    n->kind = k;
    n->line = at->line, n->col = at->col;
    return n;
}

#define OOM() error_set(ps->e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory")
#define TRY(x)                                                                                               \
    do {                                                                                                     \
        celer_status st_ = (x);                                                                              \
        if (st_ != CELER_OK) return st_;                                                                     \
    } while (0)

/* Growable child lists, copied into the pool once complete. */
typedef struct kidlist {
    ct_node **v;
    const char **kw;
    size_t n, cap;
} kidlist;

static bool kid_push(kidlist *l, ct_node *n, const char *kw) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        ct_node **v = realloc(l->v, cap * sizeof *v);
        if (!v) return false;
        l->v = v;
        const char **k = realloc(l->kw, cap * sizeof *k);
        if (!k) return false;
        l->kw = k, l->cap = cap;
    }
    l->v[l->n] = n, l->kw[l->n] = kw;
    l->n++;
    return true;
}

static bool kid_finish(parser *ps, kidlist *l, ct_node *n) {
    n->n = l->n;
    bool ok = true;
    if (l->n) {
        n->kids = ct_pool_alloc(ps->pool, l->n * sizeof *n->kids);
        n->kw = ct_pool_alloc(ps->pool, l->n * sizeof *n->kw);
        if (n->kids && n->kw) {
            memcpy(n->kids, l->v, l->n * sizeof *n->kids);
            memcpy(n->kw, l->kw, l->n * sizeof *n->kw);
        } else ok = false;
    }
    free(l->v), free(l->kw);
    memset(l, 0, sizeof *l);
    return ok;
}

static celer_status parse_expr(parser *ps, bool with_cond, ct_node **out);
static celer_status parse_unary(parser *ps, bool with_filter, ct_node **out);

static celer_status expect_op(parser *ps, int op, const char *what) {
    if (!is_op(ps, op)) return unexpected(ps, what);
    ps->p++;
    return CELER_OK;
}

/* Call arguments after '(' up to ')': positional and name=value. */
static celer_status parse_args(parser *ps, ct_node *n) {
    kidlist l = {0};
    celer_status st = CELER_OK;
    while (!is_op(ps, P_RPAREN)) {
        if (l.n && (st = expect_op(ps, P_COMMA, "',' or ')'")) != CELER_OK) break;
        if (is_op(ps, P_RPAREN)) break;
        const char *kw = NULL;
        if (cur(ps)->type == T_NAME && ps->t[ps->p + 1].type == T_OP && ps->t[ps->p + 1].op == P_ASSIGN) {
            kw = cur(ps)->s;
            ps->p += 2;
        }
        ct_node *a;
        if ((st = parse_expr(ps, true, &a)) != CELER_OK) break;
        if (!kid_push(&l, a, kw)) {
            st = OOM();
            break;
        }
    }
    if (st == CELER_OK) ps->p++;
    if (!kid_finish(ps, &l, n) && st == CELER_OK) st = OOM();
    return st;
}

static celer_status parse_primary(parser *ps, ct_node **out) {
    tok *t = cur(ps);
    ct_node *n = NULL;
    if (t->type == T_STR) {
        /* adjacent literals concatenate */
        size_t total = 0, k = ps->p;
        while (ps->t[k].type == T_STR) total += ps->t[k++].len;
        char *s = ct_pool_alloc(ps->pool, total + 1);
        if (!(n = mk(ps, CT_LIT, t)) || !s) return OOM();
        size_t o = 0;
        while (cur(ps)->type == T_STR) memcpy(s + o, cur(ps)->s, cur(ps)->len), o += cur(ps)->len, ps->p++;
        n->lit = CT_LIT_STR, n->s = s, n->slen = total;
    } else if (t->type == T_INT || t->type == T_FLOAT) {
        if (!(n = mk(ps, CT_LIT, t))) return OOM();
        n->lit = t->type == T_INT ? CT_LIT_INT : CT_LIT_FLOAT;
        n->i = t->i, n->f = t->f;
        ps->p++;
    } else if (t->type == T_NAME) {
        const char *s = t->s;
        if (!(n = mk(ps, CT_LIT, t))) return OOM();
        if (!strcmp(s, "true") || !strcmp(s, "True")) n->lit = CT_LIT_BOOL, n->i = 1;
        else if (!strcmp(s, "false") || !strcmp(s, "False")) n->lit = CT_LIT_BOOL, n->i = 0;
        else if (!strcmp(s, "none") || !strcmp(s, "None")) n->lit = CT_LIT_NONE;
        else n->kind = CT_NAME, n->s = s, n->slen = t->len;
        ps->p++;
    } else if (is_op(ps, P_LPAREN)) {
        ps->p++;
        if (is_op(ps, P_RPAREN)) {
            ps->p++;
            if (!(n = mk(ps, CT_TUPLE, t))) return OOM();
        } else {
            TRY(parse_expr(ps, true, &n));
            if (is_op(ps, P_COMMA)) {
                kidlist l = {0};
                ct_node *tu = mk(ps, CT_TUPLE, t);
                if (!tu || !kid_push(&l, n, NULL)) return kid_finish(ps, &l, tu), OOM();
                celer_status st = CELER_OK;
                while (is_op(ps, P_COMMA)) {
                    ps->p++;
                    if (is_op(ps, P_RPAREN)) break;
                    ct_node *a;
                    if ((st = parse_expr(ps, true, &a)) != CELER_OK) break;
                    if (!kid_push(&l, a, NULL)) {
                        st = OOM();
                        break;
                    }
                }
                if (!kid_finish(ps, &l, tu) && st == CELER_OK) st = OOM();
                if (st != CELER_OK) return st;
                n = tu;
            }
            TRY(expect_op(ps, P_RPAREN, "')'"));
        }
    } else if (is_op(ps, P_LBRACK) || is_op(ps, P_LBRACE)) {
        bool dict = is_op(ps, P_LBRACE);
        int close = dict ? P_RBRACE : P_RBRACK;
        ps->p++;
        if (!(n = mk(ps, dict ? CT_DICT : CT_LIST, t))) return OOM();
        kidlist l = {0};
        celer_status st = CELER_OK;
        while (!is_op(ps, close)) {
            if (l.n && (st = expect_op(ps, P_COMMA, dict ? "',' or '}'" : "',' or ']'")) != CELER_OK) break;
            if (is_op(ps, close)) break;
            ct_node *a;
            if ((st = parse_expr(ps, true, &a)) != CELER_OK) break;
            if (!kid_push(&l, a, NULL)) {
                st = OOM();
                break;
            }
            if (dict) {
                if ((st = expect_op(ps, P_COLON, "':'")) != CELER_OK) break;
                if ((st = parse_expr(ps, true, &a)) != CELER_OK) break;
                if (!kid_push(&l, a, NULL)) {
                    st = OOM();
                    break;
                }
            }
        }
        if (st == CELER_OK) ps->p++;
        if (!kid_finish(ps, &l, n) && st == CELER_OK) st = OOM();
        if (st != CELER_OK) return st;
    } else {
        return unexpected(ps, "an expression");
    }
    *out = n;
    return CELER_OK;
}

/* `(args)` after *io: *io becomes a call of it. The cursor is at the '('. */
static celer_status parse_call(parser *ps, tok *t, ct_node **io) {
    ps->p++;
    ct_node *n = mk(ps, CT_CALL, t);
    if (!n) return OOM();
    n->a = *io;
    n->line = (*io)->line, n->col = (*io)->col; /* errors point at the callee */
    TRY(parse_args(ps, n));
    *io = n;
    return CELER_OK;
}

static celer_status parse_postfix(parser *ps, ct_node **io) {
    for (;;) {
        tok *t = cur(ps);
        if (is_op(ps, P_DOT)) {
            ps->p++;
            ct_node *n;
            if (cur(ps)->type == T_NAME) {
                if (!(n = mk(ps, CT_ATTR, cur(ps)))) return OOM();
                n->s = cur(ps)->s, n->slen = cur(ps)->len;
            } else if (cur(ps)->type == T_INT) {
                ct_node *k = mk(ps, CT_LIT, cur(ps));
                if (!(n = mk(ps, CT_INDEX, t)) || !k) return OOM();
                k->lit = CT_LIT_INT, k->i = cur(ps)->i;
                n->b = k;
            } else {
                return unexpected(ps, "an attribute name");
            }
            ps->p++;
            n->a = *io;
            *io = n;
        } else if (is_op(ps, P_LBRACK)) {
            ps->p++;
            ct_node *parts[3] = {NULL, NULL, NULL};
            int np = 0;
            bool slice = false;
            for (;;) {
                if (!is_op(ps, P_COLON) && !is_op(ps, P_RBRACK)) TRY(parse_expr(ps, true, &parts[np]));
                if (is_op(ps, P_COLON) && np < 2) {
                    slice = true;
                    np++;
                    ps->p++;
                    continue;
                }
                break;
            }
            TRY(expect_op(ps, P_RBRACK, "']'"));
            ct_node *n;
            if (slice) {
                kidlist l = {0};
                if (!(n = mk(ps, CT_SLICE, t))) return OOM();
                for (int k = 0; k < 3; k++)
                    if (!kid_push(&l, parts[k], NULL)) return kid_finish(ps, &l, n), OOM();
                if (!kid_finish(ps, &l, n)) return OOM();
            } else {
                if (!parts[0]) return fail_at(ps, t->line, t->col, "empty subscript", NULL);
                if (!(n = mk(ps, CT_INDEX, t))) return OOM();
                n->b = parts[0];
            }
            n->a = *io;
            *io = n;
        } else if (is_op(ps, P_LPAREN)) {
            TRY(parse_call(ps, t, io));
        } else {
            return CELER_OK;
        }
    }
}

static celer_status parse_filters(parser *ps, ct_node **io) {
    for (;;) {
        tok *t = cur(ps);
        if (is_op(ps, P_PIPE)) {
            ps->p++;
            if (cur(ps)->type != T_NAME) return unexpected(ps, "a filter name");
            ct_node *n = mk(ps, CT_FILTER, cur(ps));
            if (!n) return OOM();
            n->s = cur(ps)->s, n->slen = cur(ps)->len;
            ps->p++;
            if (is_op(ps, P_LPAREN)) {
                ps->p++;
                TRY(parse_args(ps, n));
            }
            n->a = *io;
            *io = n;
        } else if (is_name(ps, "is")) {
            ps->p++;
            ct_node *n = mk(ps, CT_TEST, t);
            if (!n) return OOM();
            if (is_name(ps, "not")) n->i = 1, ps->p++;
            if (cur(ps)->type != T_NAME) return unexpected(ps, "a test name");
            n->s = cur(ps)->s, n->slen = cur(ps)->len;
            n->line = cur(ps)->line, n->col = cur(ps)->col;
            ps->p++;
            tok *c = cur(ps);
            if (is_op(ps, P_LPAREN)) {
                ps->p++;
                TRY(parse_args(ps, n));
            } else if ((c->type == T_NAME || c->type == T_STR || c->type == T_INT || c->type == T_FLOAT ||
                        is_op(ps, P_LPAREN) || is_op(ps, P_LBRACK) || is_op(ps, P_LBRACE)) &&
                       !is_name(ps, "else") && !is_name(ps, "or") && !is_name(ps, "and")) {
                ct_node *arg;
                TRY(parse_primary(ps, &arg));
                TRY(parse_postfix(ps, &arg));
                kidlist l = {0};
                if (!kid_push(&l, arg, NULL)) return kid_finish(ps, &l, n), OOM();
                if (!kid_finish(ps, &l, n)) return OOM();
            }
            n->a = *io;
            *io = n;
        } else if (is_op(ps, P_LPAREN)) {
            TRY(parse_call(ps, t, io));
        } else {
            return CELER_OK;
        }
    }
}

static celer_status parse_unary(parser *ps, bool with_filter, ct_node **out) {
    tok *t = cur(ps);
    if (++ps->depth > MAX_DEPTH) return fail_tok(ps, "expression nested too deeply", NULL);
    celer_status st;
    if (is_op(ps, CT_OP_SUB) || is_op(ps, CT_OP_ADD)) {
        ps->p++;
        ct_node *n = mk(ps, CT_UNARY, t);
        if (!n) return OOM();
        n->op = t->op;
        if ((st = parse_unary(ps, false, &n->a)) != CELER_OK) return st;
        *out = n;
    } else {
        if ((st = parse_primary(ps, out)) != CELER_OK) return st;
        if ((st = parse_postfix(ps, out)) != CELER_OK) return st;
    }
    if (with_filter && (st = parse_filters(ps, out)) != CELER_OK) return st;
    ps->depth--;
    return CELER_OK;
}

static celer_status binary(parser *ps, const tok *t, int op, ct_node *l, ct_node *r, ct_node **out) {
    ct_node *n = mk(ps, CT_BINARY, t);
    if (!n) return OOM();
    n->op = op, n->a = l, n->b = r;
    *out = n;
    return CELER_OK;
}

static celer_status parse_pow(parser *ps, ct_node **out) {
    TRY(parse_unary(ps, true, out));
    while (is_op(ps, CT_OP_POW)) {
        tok *t = cur(ps);
        ps->p++;
        ct_node *r;
        TRY(parse_unary(ps, true, &r));
        TRY(binary(ps, t, CT_OP_POW, *out, r, out));
    }
    return CELER_OK;
}

static celer_status parse_math2(parser *ps, ct_node **out) {
    TRY(parse_pow(ps, out));
    while (is_op(ps, CT_OP_MUL) || is_op(ps, CT_OP_DIV) || is_op(ps, CT_OP_FLOORDIV) || is_op(ps, CT_OP_MOD)) {
        tok *t = cur(ps);
        ps->p++;
        ct_node *r;
        TRY(parse_pow(ps, &r));
        TRY(binary(ps, t, t->op, *out, r, out));
    }
    return CELER_OK;
}

static celer_status parse_concat(parser *ps, ct_node **out) {
    TRY(parse_math2(ps, out));
    while (is_op(ps, CT_OP_CONCAT)) {
        tok *t = cur(ps);
        ps->p++;
        ct_node *r;
        TRY(parse_math2(ps, &r));
        TRY(binary(ps, t, CT_OP_CONCAT, *out, r, out));
    }
    return CELER_OK;
}

static celer_status parse_math1(parser *ps, ct_node **out) {
    TRY(parse_concat(ps, out));
    while (is_op(ps, CT_OP_ADD) || is_op(ps, CT_OP_SUB)) {
        tok *t = cur(ps);
        ps->p++;
        ct_node *r;
        TRY(parse_concat(ps, &r));
        TRY(binary(ps, t, t->op, *out, r, out));
    }
    return CELER_OK;
}

static celer_status parse_compare(parser *ps, ct_node **out) {
    ct_node *left;
    TRY(parse_math1(ps, &left));
    ct_node *result = NULL;
    for (;;) {
        tok *t = cur(ps);
        int op = 0;
        if (t->type == T_OP && t->op >= CT_OP_EQ && t->op <= CT_OP_GE) op = t->op, ps->p++;
        else if (is_name(ps, "in")) op = CT_OP_IN, ps->p++;
        else if (is_name(ps, "not") && ps->t[ps->p + 1].type == T_NAME && !strcmp(ps->t[ps->p + 1].s, "in"))
            op = CT_OP_NOTIN, ps->p += 2;
        else break;
        ct_node *right, *cmp = NULL;
        TRY(parse_math1(ps, &right));
        TRY(binary(ps, t, op, left, right, &cmp));
        if (result) {
            ct_node *a = mk(ps, CT_AND, t);
            if (!a) return OOM();
            a->a = result, a->b = cmp;
            result = a;
        } else {
            result = cmp;
        }
        left = right;
    }
    *out = result ? result : left;
    return CELER_OK;
}

static celer_status parse_not(parser *ps, ct_node **out) {
    if (is_name(ps, "not")) {
        ct_node *n = mk(ps, CT_NOT, cur(ps));
        if (!n) return OOM();
        ps->p++;
        if (++ps->depth > MAX_DEPTH) return fail_tok(ps, "expression nested too deeply", NULL);
        TRY(parse_not(ps, &n->a));
        ps->depth--;
        *out = n;
        return CELER_OK;
    }
    return parse_compare(ps, out);
}

static celer_status parse_and(parser *ps, ct_node **out) {
    TRY(parse_not(ps, out));
    while (is_name(ps, "and")) {
        ct_node *n = mk(ps, CT_AND, cur(ps));
        if (!n) return OOM();
        ps->p++;
        n->a = *out;
        TRY(parse_not(ps, &n->b));
        *out = n;
    }
    return CELER_OK;
}

static celer_status parse_or(parser *ps, ct_node **out) {
    TRY(parse_and(ps, out));
    while (is_name(ps, "or")) {
        ct_node *n = mk(ps, CT_OR, cur(ps));
        if (!n) return OOM();
        ps->p++;
        n->a = *out;
        TRY(parse_and(ps, &n->b));
        *out = n;
    }
    return CELER_OK;
}

static celer_status parse_expr(parser *ps, bool with_cond, ct_node **out) {
    if (++ps->depth > MAX_DEPTH) return fail_tok(ps, "expression nested too deeply", NULL);
    TRY(parse_or(ps, out));
    while (with_cond && is_name(ps, "if")) {
        ct_node *n = mk(ps, CT_COND, cur(ps));
        if (!n) return OOM();
        ps->p++;
        n->b = *out;
        TRY(parse_or(ps, &n->a));
        if (is_name(ps, "else")) {
            ps->p++;
            TRY(parse_expr(ps, true, &n->c));
        }
        *out = n;
    }
    ps->depth--;
    return CELER_OK;
}

/* ==== Statements ==== */

static celer_status expect_block_end(parser *ps) {
    if (cur(ps)->type != T_BLOCK_END) return unexpected(ps, "'%}'");
    ps->p++;
    return CELER_OK;
}

/* Parses statements until a block tag named in ends[] (which is consumed with its
 * '{%'; *found says which). opener names the block for "unclosed" errors. */
static celer_status parse_body(parser *ps, const char *const *ends, const tok *opener, const char *opener_name,
                               ct_node **out, const char **found);

static celer_status parse_targets(parser *ps, ct_node *n, bool allow_attr) {
    kidlist l = {0};
    celer_status st = CELER_OK;
    for (;;) {
        if (cur(ps)->type != T_NAME) {
            st = unexpected(ps, "a variable name");
            break;
        }
        ct_node *v = mk(ps, CT_NAME, cur(ps));
        if (!v || !kid_push(&l, v, NULL)) {
            st = OOM();
            break;
        }
        v->s = cur(ps)->s, v->slen = cur(ps)->len;
        ps->p++;
        if (allow_attr && l.n == 1 && is_op(ps, P_DOT)) {
            ps->p++;
            if (cur(ps)->type != T_NAME) {
                st = unexpected(ps, "an attribute name");
                break;
            }
            n->kind = CT_SET_ATTR;
            n->a = v;
            n->s = cur(ps)->s, n->slen = cur(ps)->len;
            ps->p++;
            break;
        }
        if (!is_op(ps, P_COMMA)) break;
        ps->p++;
    }
    if (!kid_finish(ps, &l, n) && st == CELER_OK) st = OOM();
    return st;
}

static celer_status parse_stmt(parser *ps, const tok *open, ct_node **out) {
    tok *kw = cur(ps);
    const char *name = kw->s;
    ps->p++;
    ct_node *n;
    const char *found;
    if (!strcmp(name, "if") || !strcmp(name, "elif")) {
        if (!(n = mk(ps, CT_IF, open))) return OOM();
        TRY(parse_expr(ps, true, &n->a));
        TRY(expect_block_end(ps));
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        TRY(parse_body(ps, ends, open, "if", &n->b, &found));
        if (!strcmp(found, "elif")) {
            ps->p--; /* re-read the elif name as a nested if */
            tok *el = &ps->t[ps->p - 1];
            TRY(parse_stmt(ps, el, &n->c));
        } else if (!strcmp(found, "else")) {
            TRY(expect_block_end(ps));
            static const char *const ends2[] = {"endif", NULL};
            TRY(parse_body(ps, ends2, open, "if", &n->c, &found));
            TRY(expect_block_end(ps));
        } else {
            TRY(expect_block_end(ps));
        }
    } else if (!strcmp(name, "for")) {
        if (!(n = mk(ps, CT_FOR, open))) return OOM();
        TRY(parse_targets(ps, n, false));
        if (!is_name(ps, "in")) return unexpected(ps, "'in'");
        ps->p++;
        TRY(parse_expr(ps, false, &n->a));
        if (is_name(ps, "if")) {
            ps->p++;
            TRY(parse_expr(ps, true, &n->d));
        }
        if (is_name(ps, "recursive")) return fail_tok(ps, "recursive loops are not supported", NULL);
        TRY(expect_block_end(ps));
        static const char *const ends[] = {"else", "endfor", NULL};
        TRY(parse_body(ps, ends, open, "for", &n->b, &found));
        if (!strcmp(found, "else")) {
            TRY(expect_block_end(ps));
            static const char *const ends2[] = {"endfor", NULL};
            TRY(parse_body(ps, ends2, open, "for", &n->c, &found));
        }
        TRY(expect_block_end(ps));
    } else if (!strcmp(name, "set")) {
        if (!(n = mk(ps, CT_SET, open))) return OOM();
        TRY(parse_targets(ps, n, true));
        if (is_op(ps, P_ASSIGN)) {
            ps->p++;
            ct_node *v;
            TRY(parse_expr(ps, true, &v));
            if (is_op(ps, P_COMMA)) {
                kidlist l = {0};
                ct_node *tu = mk(ps, CT_TUPLE, cur(ps));
                if (!tu || !kid_push(&l, v, NULL)) return kid_finish(ps, &l, tu), OOM();
                celer_status st = CELER_OK;
                while (is_op(ps, P_COMMA) && st == CELER_OK) {
                    ps->p++;
                    ct_node *a = NULL;
                    if ((st = parse_expr(ps, true, &a)) == CELER_OK && !kid_push(&l, a, NULL)) st = OOM();
                }
                if (!kid_finish(ps, &l, tu) && st == CELER_OK) st = OOM();
                if (st != CELER_OK) return st;
                v = tu;
            }
            if (n->kind == CT_SET_ATTR) n->b = v;
            else n->a = v;
            TRY(expect_block_end(ps));
        } else {
            if (n->kind != CT_SET || n->n != 1) return unexpected(ps, "'='");
            TRY(expect_block_end(ps));
            n->kind = CT_SET_BLOCK;
            n->s = n->kids[0]->s, n->slen = n->kids[0]->slen;
            static const char *const ends[] = {"endset", NULL};
            TRY(parse_body(ps, ends, open, "set", &n->b, &found));
            TRY(expect_block_end(ps));
        }
    } else if (!strcmp(name, "macro")) {
        if (!(n = mk(ps, CT_MACRO, open))) return OOM();
        if (cur(ps)->type != T_NAME) return unexpected(ps, "a macro name");
        n->s = cur(ps)->s, n->slen = cur(ps)->len;
        ps->p++;
        TRY(expect_op(ps, P_LPAREN, "'('"));
        kidlist l = {0};
        celer_status st = CELER_OK;
        while (!is_op(ps, P_RPAREN)) {
            if (l.n && (st = expect_op(ps, P_COMMA, "',' or ')'")) != CELER_OK) break;
            if (cur(ps)->type != T_NAME) {
                st = unexpected(ps, "a parameter name");
                break;
            }
            ct_node *pn = mk(ps, CT_NAME, cur(ps));
            if (!pn || !kid_push(&l, pn, NULL)) {
                st = OOM();
                break;
            }
            pn->s = cur(ps)->s, pn->slen = cur(ps)->len;
            ps->p++;
            if (is_op(ps, P_ASSIGN)) {
                ps->p++;
                if ((st = parse_expr(ps, true, &pn->a)) != CELER_OK) break;
            }
        }
        if (st == CELER_OK) ps->p++;
        if (!kid_finish(ps, &l, n) && st == CELER_OK) st = OOM();
        if (st != CELER_OK) return st;
        TRY(expect_block_end(ps));
        static const char *const ends[] = {"endmacro", NULL};
        TRY(parse_body(ps, ends, open, "macro", &n->b, &found));
        TRY(expect_block_end(ps));
    } else if (!strcmp(name, "generation")) {
        TRY(expect_block_end(ps));
        static const char *const ends[] = {"endgeneration", NULL};
        TRY(parse_body(ps, ends, open, "generation", &n, &found));
        TRY(expect_block_end(ps));
    } else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        if (!(n = mk(ps, name[0] == 'b' ? CT_BREAK : CT_CONTINUE, open))) return OOM();
        TRY(expect_block_end(ps));
    } else {
        ps->p--;
        return fail_tok(ps, "unknown tag", name);
    }
    *out = n;
    return CELER_OK;
}

static celer_status parse_body(parser *ps, const char *const *ends, const tok *opener, const char *opener_name,
                               ct_node **out, const char **found) {
    ct_node *body = mk(ps, CT_BODY, cur(ps));
    if (!body) return OOM();
    if (++ps->depth > MAX_DEPTH) return fail_tok(ps, "blocks nested too deeply", NULL);
    kidlist l = {0};
    celer_status st = CELER_OK;
    for (;;) {
        tok *t = cur(ps);
        ct_node *n = NULL;
        if (t->type == T_EOF) {
            if (ends) {
                char msg[96];
                snprintf(msg, sizeof msg, "unclosed '%s' block (no '%s' before the end of the template)", opener_name,
                         ends[0] && !strcmp(ends[0], "elif") ? "endif" : ends[0] && !strcmp(ends[0], "else") ? "endfor" : ends[0]);
                st = fail_at(ps, opener->line, opener->col, msg, NULL);
            }
            break;
        } else if (t->type == T_TEXT) {
            if (!(n = mk(ps, CT_TEXT, t))) {
                st = OOM();
                break;
            }
            n->s = t->s, n->slen = t->len;
            ps->p++;
        } else if (t->type == T_VAR_BEGIN) {
            ps->p++;
            if (!(n = mk(ps, CT_OUTPUT, t))) {
                st = OOM();
                break;
            }
            if ((st = parse_expr(ps, true, &n->a)) != CELER_OK) break;
            if (cur(ps)->type != T_VAR_END) {
                st = unexpected(ps, "'}}'");
                break;
            }
            ps->p++;
        } else if (t->type == T_BLOCK_BEGIN) {
            ps->p++;
            if (cur(ps)->type != T_NAME) {
                st = unexpected(ps, "a tag name");
                break;
            }
            const char *nm = cur(ps)->s;
            bool is_end = false;
            for (size_t k = 0; ends && ends[k]; k++)
                if (!strcmp(ends[k], nm)) is_end = true, *found = ends[k];
            if (is_end) {
                ps->p++;
                break;
            }
            if (!strncmp(nm, "end", 3) || !strcmp(nm, "else") || !strcmp(nm, "elif")) {
                st = fail_tok(ps, "unexpected tag", nm);
                break;
            }
            if ((st = parse_stmt(ps, t, &n)) != CELER_OK) break;
        } else {
            st = unexpected(ps, "text or a tag");
            break;
        }
        if (!kid_push(&l, n, NULL)) {
            st = OOM();
            break;
        }
    }
    if (!kid_finish(ps, &l, body) && st == CELER_OK) st = OOM();
    ps->depth--;
    *out = body;
    return st;
}

/* ==== Entry point ==== */

celer_status chat_template_parse(const char *src, size_t len, chat_template **out, celer_error *e) {
    *out = NULL;
    parser ps = {0};
    ps.e = e;
    chat_template *t = calloc(1, sizeof *t);
    celer_status st = CELER_OK;
    if (!t) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory");
    ps.pool = &t->pool;
    /* normalize newlines; drop one trailing newline (Jinja's keep_trailing_newline=False) */
    char *norm = ct_pool_alloc(ps.pool, len + 1);
    if (!norm) {
        st = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory");
        goto out;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n') n--;
    norm[n] = 0;
    ps.src = norm, ps.len = n;
    size_t lines = 1;
    for (size_t i = 0; i < n; i++) lines += norm[i] == '\n';
    ps.line_start = malloc(lines * sizeof *ps.line_start);
    if (!ps.line_start) {
        st = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory");
        goto out;
    }
    ps.line_start[0] = 0;
    ps.n_lines = 1;
    for (size_t i = 0; i < n; i++)
        if (norm[i] == '\n') ps.line_start[ps.n_lines++] = i + 1;
    if ((st = lex(&ps)) != CELER_OK) goto out;
    const char *found = NULL;
    if ((st = parse_body(&ps, NULL, NULL, NULL, &t->root, &found)) != CELER_OK) goto out;
out:
    free(ps.line_start);
    free(ps.t);
    if (st != CELER_OK) {
        chat_template_free(t);
        return st;
    }
    *out = t;
    return CELER_OK;
}

void chat_template_free(chat_template *t) {
    if (!t) return;
    ct_pool_free(t->pool);
    free(t);
}
