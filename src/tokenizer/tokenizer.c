/*
 * tokenizer.c - the encode and decode pipelines and the streaming detokenizer.
 *
 * Encoding follows Hugging Face `tokenizers`: added tokens are cut out of the raw text
 * first (leftmost, longest first, with their lstrip/rstrip/single_word flags), each
 * remaining piece is normalized and searched again for normalized added tokens, then
 * pre-tokenized and run through BPE; the post-processor adds template tokens when
 * asked. Decoding maps ids to token strings and runs the decoder chain. Loading is in
 * tok_load.c, the text stages in tok_text.c, BPE in tok_bpe.c.
 */
#include "tokenizer/tok_impl.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ==== Indices ==== */

static const char *id_token(const tokenizer *t, int32_t id, size_t *len);

/* qsort has no context argument in C11; tok_index runs inside one load at a time per
 * thread, so the tokenizer being sorted is kept thread-local. */
static _Thread_local const tokenizer *sort_ctx;

/* By first byte, then longest first, then by index (a stable, total order). */
static int cmp_match(const void *a, const void *b) {
    const tokenizer *t = sort_ctx;
    const added_token *x = &t->added[*(const int32_t *)a], *y = &t->added[*(const int32_t *)b];
    if ((uint8_t)x->pat[0] != (uint8_t)y->pat[0])
        return (uint8_t)x->pat[0] < (uint8_t)y->pat[0] ? -1 : 1;
    if (x->pat_n != y->pat_n) return x->pat_n > y->pat_n ? -1 : 1;
    return *(const int32_t *)a < *(const int32_t *)b ? -1 : 1;
}

celer_status tok_index(tokenizer *t, celer_error *e) {
    /* As Hugging Face does, a normalized added token is matched in its normalized form
     * (with a Prepend normalizer, "[X]" is found as "\u2581[X]"). */
    for (size_t i = 0; i < t->n_added; i++) {
        added_token *a = &t->added[i];
        a->pat = a->s, a->pat_n = a->n;
        if (!a->normalized || !t->norm) continue;
        sbuf b = {0};
        celer_status st = normalize(t->norm, a->s, a->n, &b, e);
        if (st != CELER_OK || b.n == 0) {
            free(b.p);
            if (st != CELER_OK) return st;
            continue;
        }
        a->pat = b.p, a->pat_n = b.n;
    }
    for (int k = 0; k < 2; k++) {
        size_t m = 0;
        if (!(t->match[k] = malloc(sizeof(int32_t) * (t->n_added ? t->n_added : 1))))
            return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        for (size_t i = 0; i < t->n_added; i++)
            if (t->added[i].normalized == (k == 1)) t->match[k][m++] = (int32_t)i;
        sort_ctx = t;
        qsort(t->match[k], m, sizeof(int32_t), cmp_match);
        size_t j = 0;
        for (int b = 0; b < 256; b++) {
            t->match_start[k][b] = j;
            while (j < m && (uint8_t)t->added[t->match[k][j]].pat[0] == b) j++;
        }
        t->match_start[k][256] = j;
    }
    t->n_total = t->model.n_ids > (int64_t)t->max_added_id + 1 ? t->model.n_ids
                                                               : (int64_t)t->max_added_id + 1;
    if (!(t->added_index = malloc(sizeof(int32_t) * (size_t)(t->n_total ? t->n_total : 1))))
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int64_t i = 0; i < t->n_total; i++) t->added_index[i] = -1;
    for (size_t i = 0; i < t->n_added; i++) t->added_index[t->added[i].id] = (int32_t)i;
    for (size_t i = 0; i < t->tmpl.n; i++) {
        size_t len;
        if (t->tmpl.ids[i] >= 0 && !id_token(t, t->tmpl.ids[i], &len))
            return error_set(e, CELER_STATUS_BAD_FILE,
                             "%s: post_processor: template token id %d is not in the vocabulary",
                             t->name, t->tmpl.ids[i]);
    }
    return CELER_OK;
}

/* ==== Lookups ==== */

void tok_free(tokenizer *t) {
    tok_destroy(t);
}

int64_t tok_vocab_size(const tokenizer *t) {
    return t->n_total;
}

int32_t tok_token_to_id(const tokenizer *t, const char *token, size_t len) {
    int32_t a = strmap_get(&t->added_map, token, len);
    if (a >= 0) return t->added[a].id;
    return strmap_get(&t->model.vocab, token, len);
}

static const char *id_token(const tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_total) return NULL;
    int32_t a = t->added_index[id];
    /* A normalized added token reads back in its normalized form, as in Hugging Face. */
    if (a >= 0) return *len = t->added[a].pat_n, t->added[a].pat;
    if (id >= t->model.n_ids || t->model.id_off[id] == SIZE_MAX) return NULL;
    *len = t->model.id_len[id];
    return t->model.strs + t->model.id_off[id];
}

const char *tok_id_to_token(const tokenizer *t, int32_t id) {
    size_t n;
    return id_token(t, id, &n);
}

bool tok_is_special(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_total && t->added_index[id] >= 0 &&
           t->added[t->added_index[id]].special;
}

/* ==== Added tokens ==== */

typedef struct seg {
    size_t a, b;
    int32_t added; /* index in t->added, or -1 for text */
} seg;

typedef struct segs {
    seg *v;
    size_t n, cap;
} segs;

static bool segs_add(segs *l, size_t a, size_t b, int32_t added) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        seg *v = realloc(l->v, sizeof *v * cap);
        if (!v) return false;
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = (seg){a, b, added};
    return true;
}

static bool is_word_char(uint32_t cp) {
    if (cp == '_') return true;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

/* The code point ending just before s[i] (s valid UTF-8, i > 0), and its length. */
static uint32_t prev_char(const char *s, size_t i, size_t *len) {
    size_t j = i - 1;
    while (j > 0 && ((uint8_t)s[j] & 0xc0) == 0x80) j--;
    uint32_t cp = 0;
    utf8_next(s + j, i - j, &cp, NULL);
    *len = i - j;
    return cp;
}

/* Cuts s[n] into text and added-token segments, matching the tokens of class k. */
static bool split_added(const tokenizer *t, int k, const char *s, size_t n, segs *out) {
    out->n = 0;
    size_t start = 0, i = 0;
    while (i < n) {
        uint8_t c0 = (uint8_t)s[i];
        int32_t hit = -1;
        for (size_t j = t->match_start[k][c0]; j < t->match_start[k][c0 + 1]; j++) {
            const added_token *a = &t->added[t->match[k][j]];
            if (a->pat_n <= n - i && !memcmp(s + i, a->pat, a->pat_n)) {
                hit = t->match[k][j];
                break;
            }
        }
        if (hit < 0) {
            i++;
            continue;
        }
        const added_token *a = &t->added[hit];
        size_t ma = i, mb = i + a->pat_n, cl;
        uint32_t cp;
        if (a->single_word) {
            bool ok = ma == 0 || !is_word_char(prev_char(s, ma, &cl));
            int l = mb < n ? utf8_next(s + mb, n - mb, &cp, NULL) : 0;
            ok &= mb == n || !(l && is_word_char(cp));
            if (!ok) {
                i = mb;
                continue;
            }
        }
        if (a->lstrip)
            while (ma > start && unicode_is_space(prev_char(s, ma, &cl))) ma -= cl;
        if (a->rstrip)
            for (int l;
                 mb < n && (l = utf8_next(s + mb, n - mb, &cp, NULL)) && unicode_is_space(cp);)
                mb += (size_t)l;
        if (ma > start && !segs_add(out, start, ma, -1)) return false;
        if (!segs_add(out, ma, mb, hit)) return false;
        start = i = mb;
    }
    if (start < n && !segs_add(out, start, n, -1)) return false;
    return true;
}

/* ==== Encode ==== */

/* Pre-tokenizes and runs BPE on one normalized text segment. */
static celer_status encode_text(const tokenizer *t, const char *s, size_t n, bool first,
                                int32_t **ids, int64_t *nid, int64_t *cap, celer_error *e) {
    pieces l = {0};
    if (!pieces_add(&l, s, n, first))
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    celer_status st = pretokenize(t->pre, &l, e);
    for (size_t i = 0; st == CELER_OK && i < l.n; i++)
        st = bpe_word(&t->model, l.v[i].s, l.v[i].n, ids, nid, cap, e);
    pieces_free(&l);
    return st;
}

celer_status tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special,
                        int32_t **ids, int64_t *n, celer_error *e) {
    *ids = NULL, *n = 0;
    size_t bad = utf8_check(text, len);
    if (bad != len)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "input text is not valid UTF-8 (byte %zu: 0x%02x)", bad,
                         (unsigned)(uint8_t)text[bad]);
    int32_t *out = NULL;
    int64_t nout = 0, cap = 0;
    segs raw = {0}, norm = {0};
    sbuf nb = {0};
    celer_status st = CELER_OK;
    if (!split_added(t, 0, text, len, &raw)) goto oom;
    for (size_t i = 0; i < raw.n && st == CELER_OK; i++) {
        const seg *r = &raw.v[i];
        if (r->added >= 0) {
            if (!ids_push(&out, &nout, &cap, t->added[r->added].id)) goto oom;
            continue;
        }
        if ((st = normalize(t->norm, text + r->a, r->b - r->a, &nb, e)) != CELER_OK) break;
        if (!split_added(t, 1, nb.p, nb.n, &norm)) goto oom;
        for (size_t j = 0; j < norm.n && st == CELER_OK; j++) {
            const seg *g = &norm.v[j];
            if (g->added >= 0) {
                if (!ids_push(&out, &nout, &cap, t->added[g->added].id)) goto oom;
            } else {
                st = encode_text(t, nb.p + g->a, g->b - g->a, r->a == 0 && g->a == 0, &out, &nout,
                                 &cap, e);
            }
        }
    }
    if (st == CELER_OK && add_special && t->tmpl.present) {
        int32_t *full = NULL;
        int64_t nf = 0, cf = 0;
        for (size_t i = 0; i < t->tmpl.n; i++) {
            if (t->tmpl.ids[i] >= 0) {
                if (!ids_push(&full, &nf, &cf, t->tmpl.ids[i])) goto oom_full;
            } else {
                for (int64_t j = 0; j < nout; j++)
                    if (!ids_push(&full, &nf, &cf, out[j])) goto oom_full;
            }
        }
        free(out);
        out = full, nout = nf;
        goto done;
    oom_full:
        free(full);
        goto oom;
    }
done:
    free(raw.v), free(norm.v), free(nb.p);
    if (st != CELER_OK) {
        free(out);
        return st;
    }
    if (!out && !(out = malloc(sizeof *out)))
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    *ids = out, *n = nout;
    return CELER_OK;
oom:
    st = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    goto done;
}

/* ==== Decode ==== */

/* The decoded bytes of ids[n] in *out; raw keeps invalid UTF-8 as it is. */
static celer_status decode_into(const tokenizer *t, const int32_t *ids, int64_t n,
                                bool skip_special, bool raw, sbuf *out, celer_error *e) {
    pieces l = {0};
    out->n = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t len;
        const char *s = id_token(t, ids[i], &len);
        if (!s) {
            pieces_free(&l);
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "token id %d is outside the vocabulary (%lld ids)", ids[i],
                             (long long)t->n_total);
        }
        if (skip_special && tok_is_special(t, ids[i])) continue;
        if (!pieces_add(&l, s, len, i == 0)) {
            pieces_free(&l);
            return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        }
    }
    celer_status st = decode_tokens(t->dec, &l, raw, e);
    sbuf joined = {0};
    bool ok = sbuf_add(&joined, "", 0);
    for (size_t i = 0; st == CELER_OK && i < l.n; i++) {
        if (!t->dec && i > 0) ok &= sbuf_addc(&joined, ' ');
        ok &= sbuf_add(&joined, l.v[i].s, l.v[i].n);
    }
    pieces_free(&l);
    if (st == CELER_OK && !ok) st = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    if (st == CELER_OK) {
        if (raw) {
            free(out->p);
            *out = joined;
            return CELER_OK;
        }
        if (!utf8_lossy(out, joined.p, joined.n))
            st = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    free(joined.p);
    return st;
}

celer_status tok_decode(const tokenizer *t, const int32_t *ids, int64_t n, bool skip_special,
                        char **text, size_t *len, celer_error *e) {
    sbuf b = {0};
    *text = NULL;
    celer_status st = decode_into(t, ids, n, skip_special, false, &b, e);
    if (st != CELER_OK) {
        free(b.p);
        return st;
    }
    if (!b.p && !sbuf_add(&b, "", 0))
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    *text = b.p;
    if (len) *len = b.n;
    return CELER_OK;
}

/* ==== Token bytes ==== */

/* The raw bytes token id adds in the middle of a stream: decoded after an anchor piece
 * ("a", which every supported decoder leaves as it is) so that a first-token rule
 * (Metaspace's prepend scheme, Strip) does not apply, then the anchor cut off. */
static celer_status token_bytes(const tokenizer *t, int32_t id, sbuf *out, celer_error *e) {
    size_t len;
    const char *s = id_token(t, id, &len);
    out->n = 0;
    if (!s || tok_is_special(t, id)) return CELER_OK;
    pieces l = {0};
    if (!pieces_add(&l, "a", 1, true) || !pieces_add(&l, s, len, false)) {
        pieces_free(&l);
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    celer_status st = decode_tokens(t->dec, &l, true, e);
    bool ok = true;
    for (size_t i = 0; st == CELER_OK && i < l.n; i++) {
        if (!t->dec && i > 0) ok &= sbuf_addc(out, ' ');
        ok &= sbuf_add(out, l.v[i].s, l.v[i].n);
    }
    pieces_free(&l);
    if (st != CELER_OK) return st;
    if (!ok) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    if (!out->n || out->p[0] != 'a')
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: the decoder changes the text before token %d", t->name, id);
    memmove(out->p, out->p + 1, --out->n);
    return CELER_OK;
}

celer_status tok_vocab_bytes(const tokenizer *t, char ***bytes, size_t **len, celer_error *e) {
    *bytes = NULL, *len = NULL;
    int64_t n = t->n_total;
    sbuf all = {0}, one = {0};
    size_t *lens = malloc(((size_t)n + 1) * sizeof *lens);
    celer_status st = CELER_OK;
    if (!lens) goto oom;
    for (int64_t id = 0; id < n; id++) {
        if ((st = token_bytes(t, (int32_t)id, &one, e)) != CELER_OK) goto fail;
        if (!sbuf_add(&all, one.p ? one.p : "", one.n)) goto oom;
        lens[id] = one.n;
    }
    char **ptrs = malloc((size_t)n * sizeof *ptrs + all.n + 1);
    if (!ptrs) goto oom;
    char *text = (char *)(ptrs + n);
    if (all.n) memcpy(text, all.p, all.n);
    for (int64_t id = 0, off = 0; id < n; off += (int64_t)lens[id], id++) ptrs[id] = text + off;
    free(all.p), free(one.p);
    *bytes = ptrs, *len = lens;
    return CELER_OK;
oom:
    st = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
fail:
    free(all.p), free(one.p), free(lens);
    return st;
}

void tok_vocab_bytes_free(char **bytes, size_t *len) {
    free(bytes);
    free(len);
}

/* ==== Streaming detokenizer ==== */

struct tok_stream {
    const tokenizer *t;
    bool skip_special;
    int32_t *win; /* ids whose decoding is the context of the next one */
    size_t n, cap;
    size_t done; /* bytes of decode(win) already given out */
    sbuf text, out;
};

celer_status tok_stream_create(const tokenizer *t, bool skip_special, tok_stream **out,
                               celer_error *e) {
    if (!(*out = calloc(1, sizeof **out)))
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    (*out)->t = t, (*out)->skip_special = skip_special;
    return CELER_OK;
}

void tok_stream_destroy(tok_stream *s) {
    if (!s) return;
    free(s->win), free(s->text.p), free(s->out.p);
    free(s);
}

/* Whether s[n] (n >= 1) is the start of a valid UTF-8 sequence cut short. */
static bool utf8_cut_short(const char *s, size_t n) {
    uint32_t cp;
    int bad;
    if (utf8_next(s, n, &cp, &bad) != 0) return false;
    uint8_t c = (uint8_t)s[0];
    size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
    return c >= 0xc2 && c <= 0xf4 && (size_t)bad == n && n < need;
}

celer_status tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len,
                             celer_error *e) {
    s->out.n = 0;
    *text = "", *len = 0;
    size_t tl;
    if (!id_token(s->t, id, &tl))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "token id %d is outside the vocabulary (%lld ids)", id,
                         (long long)s->t->n_total);
    if (s->skip_special && tok_is_special(s->t, id)) return CELER_OK;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        int32_t *w = realloc(s->win, sizeof *w * cap);
        if (!w) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        s->win = w, s->cap = cap;
    }
    s->win[s->n++] = id;
    celer_status st = decode_into(s->t, s->win, (int64_t)s->n, false, true, &s->text, e);
    if (st != CELER_OK) return st;
    const char *p = s->text.p ? s->text.p : "";
    size_t n = s->text.n, i = s->done < n ? s->done : n;
    /* Hand out complete characters; hold back a sequence cut short at the end. */
    while (i < n) {
        uint32_t cp;
        int bad, l = utf8_next(p + i, n - i, &cp, &bad);
        if (l) {
            if (!sbuf_add(&s->out, p + i, (size_t)l))
                return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
            i += (size_t)l;
        } else if (utf8_cut_short(p + i, n - i)) {
            break;
        } else {
            if (!sbuf_add(&s->out, "\xef\xbf\xbd", 3))
                return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
            i += (size_t)bad;
        }
    }
    s->done = i;
    if (i == n) { /* nothing held: keep only the last id as context for the next */
        s->win[0] = id, s->n = 1;
        if ((st = decode_into(s->t, s->win, 1, false, true, &s->text, e)) != CELER_OK) return st;
        s->done = s->text.n;
    }
    *text = s->out.p ? s->out.p : "", *len = s->out.n;
    return CELER_OK;
}

celer_status tok_stream_flush(tok_stream *s, const char **text, size_t *len, celer_error *e) {
    s->out.n = 0;
    const char *p = s->text.p ? s->text.p : "";
    bool ok = s->done >= s->text.n || utf8_lossy(&s->out, p + s->done, s->text.n - s->done);
    s->n = 0, s->done = 0, s->text.n = 0;
    if (!ok) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    *text = s->out.p ? s->out.p : "", *len = s->out.n;
    return CELER_OK;
}
