/*
 * gguf_checkpoint.c - a GGUF file presented as a checkpoint (see gguf.h): config fields
 * from the metadata, Hugging Face tensor names, MLX affine codes from ggml blocks.
 *
 * Q4_1 holds exactly MLX affine 4-bit group 32 with fp16 scale d and bias m; Q4_0
 * (w = d*(q-8)) and Q8_0 (w = d*q, q signed) become scale d and bias -8d / -128d, exact
 * in fp16 since they are d times a power of two. Inside a ggml block, byte j holds
 * elements j (low nibble) and j+16 (high nibble); MLX puts element k of a word in bits
 * 4k..4k+3, so only the nibble order changes. Q5_0 and Q5_1 add a fifth bit per element
 * from a 32-bit word (bit j for element j) and become 5-bit codes in the same bit-string
 * layout; Q5_0 (w = d*(q-16)) keeps no biases: its zero point 16 goes in a one-value I32
 * tensor "<module>.zero" (tensor.h: w = scale * (q - zero)), so it stays 5.5 bits a weight.
 *
 * The K-quants keep their two levels of scales (tensor.h): 256-element super-blocks with F16
 * factors ("<module>.super_scales", "<module>.super_biases") over small integer scales and
 * mins per group ("<module>.scales", "<module>.biases", U8 or I8). Q4_K and Q5_K (groups of
 * 32, 6-bit scale and min, w = d*sc*q - dmin*m) take the factor -dmin for the biases; Q6_K
 * (groups of 16, int8 scales, w = d*sc*(q - 32)) has a zero point of 32 instead of mins.
 * Q4_K keeps 4.625 bits a weight against the file's 4.5, Q5_K 5.625 against 5.5, Q6_K the
 * file's 6.5625. Q3_K (groups of 16, 6-bit scales stored as sc - 32, w = d*(sc-32)*(q - 4)
 * with q the 2 low bits and the high-mask bit) keeps 3.5625 for 3.4375. Q2_K (groups of 16,
 * a 4-bit scale and min in one byte, w = d*sc*q - dmin*m) keeps its bytes as they are: the
 * scales read their low nibbles (U4LO), the mins the high ones (U4HI), 2.625 bits a weight.
 *
 * A split file (llama.cpp's gguf-split: NAME-00001-of-0000N.gguf, split.no, split.count and
 * split.tensors.count in each part's metadata, the model's metadata in the first) opens from
 * its first part: the other parts' tensors join the first's table, their maps kept beside it.
 *
 * IQ4_NL and IQ4_XS map 4-bit codes through a fixed table of 16 values ("<module>.lut", I8)
 * with a zero point of 0: w = d * table[q] (IQ4_NL, Q4_0's block layout) or w = d * (ls -
 * 32) * table[q] (IQ4_XS: 6-bit scales per 32 under d per 256).
 *
 * Each converted matrix lives in an anonymous mapping of its own, with the re-layout that
 * filled it (gguf_derived). Once a backend holds its own copy of a matrix, the pages go
 * (checkpoint_release_range) as a mapped file's would; unlike a file's they do not fault
 * back, so whoever reads the tensors in place again first calls checkpoint_restore, which
 * runs the dropped matrices' re-layouts again from the file.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, madvise */
#include "io/gguf.h"

#include "base/half.h"
#include "base/threadpool.h"
#include "io/hf_cache.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* IQ4_NL's and IQ4_XS's code values (ggml's kvalues_iq4nl). */
static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};

/* ==== Metadata -> config.json fields ==== */

static bool kv_number(const gguf_file *g, const char *key, double *out) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return false;
    switch (kv->val.type) {
    case GGUF_TYPE_FLOAT32:
    case GGUF_TYPE_FLOAT64:
        *out = kv->val.num.f;
        return true;
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_INT16:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_INT64:
        *out = (double)kv->val.num.i;
        return true;
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_BOOL:
        *out = (double)kv->val.num.u;
        return true;
    default:
        return false;
    }
}

/* Copies arch.<suffix> into cfg[field] (as an integer unless real). */
static void map_field(const gguf_file *g, json_t *cfg, const char *arch, const char *suffix,
                      const char *field, bool real) {
    char key[128];
    double v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (kv_number(g, key, &v))
        json_object_set_new(cfg, field, real ? json_real(v) : json_integer((json_int_t)v));
}

/* Gemma: softcaps, the local RoPE base, and the query scale llama.cpp applies (GGUF has
 * no key for query_pre_attn_scalar): 1/sqrt(key_length), but hidden / heads for the 27B
 * sizes (gemma2 of 46 layers, gemma3 of 62). */
static void gemma_config(const gguf_file *g, json_t *cfg, const char *arch) {
    map_field(g, cfg, arch, "attn_logit_softcapping", "attn_logit_softcapping", true);
    map_field(g, cfg, arch, "final_logit_softcapping", "final_logit_softcapping", true);
    map_field(g, cfg, arch, "rope.freq_base_swa", "rope_local_base_freq", true);
    const json_int_t layers = json_integer_value(json_object_get(cfg, "num_hidden_layers"));
    const json_int_t d = json_integer_value(json_object_get(cfg, "hidden_size"));
    const json_int_t h = json_integer_value(json_object_get(cfg, "num_attention_heads"));
    const json_t *kl = json_object_get(cfg, "head_dim");
    const bool big =
        (!strcmp(arch, "gemma2") && layers == 46) || (!strcmp(arch, "gemma3") && layers == 62);
    if (big && h > 0)
        json_object_set_new(cfg, "query_pre_attn_scalar", json_integer(d / h));
    else if (kl)
        json_object_set_new(cfg, "query_pre_attn_scalar", json_integer(json_integer_value(kl)));
    else if (h > 0)
        json_object_set_new(cfg, "query_pre_attn_scalar", json_integer(d / h));
}

/* factors[n] of an F32 tensor as a JSON list, or NULL (e set) when it is not one. */
static json_t *factor_list(const checkpoint *ck, const gguf_tensor *t, int64_t n, celer_error *e) {
    if (t->ggml_type != GGML_F32 || t->ndim != 1 || t->ne[0] != n) {
        error_set(e, CELER_STATUS_BAD_FILE,
                  "%s: tensor %s: expected F32 [%lld] (rotary dimensions / 2)", ck->config_path,
                  t->name, (long long)n);
        return NULL;
    }
    json_t *a = json_array();
    for (int64_t i = 0; a && i < n; i++) {
        float v;
        memcpy(&v, t->data + 4 * i, 4);
        json_array_append_new(a, json_real(v));
    }
    return a;
}

/* Phi-3: rotary dimensions as partial_rotary_factor, and longrope from the factor tensors
 * (rope_factors_short/long), the original context and the stored attention factor. */
static celer_status phi3_config(checkpoint *ck, const gguf_file *g, json_t *cfg, celer_error *e) {
    double v, rot;
    const json_int_t d = json_integer_value(json_object_get(cfg, "hidden_size"));
    const json_int_t h = json_integer_value(json_object_get(cfg, "num_attention_heads"));
    const int64_t hd = h > 0 ? d / h : 0;
    if (!kv_number(g, "phi3.rope.dimension_count", &rot)) rot = (double)hd;
    if (hd > 0) json_object_set_new(cfg, "partial_rotary_factor", json_real(rot / (double)hd));
    const json_t *sw = json_object_get(cfg, "sliding_window");
    if (sw && json_integer_value(sw) <= 0)
        json_object_del(cfg, "sliding_window"); /* 0: no window */
    const gguf_tensor *ls = gguf_find_tensor(g, "rope_factors_short.weight"),
                      *ll = gguf_find_tensor(g, "rope_factors_long.weight");
    if (!ls && !ll) return CELER_OK;
    if (!ls || !ll)
        return error_set(
            e, CELER_STATUS_BAD_FILE,
            "%s: rope_factors_short.weight and rope_factors_long.weight: expected both",
            ck->config_path);
    json_t *rs = json_object(), *sf = factor_list(ck, ls, (int64_t)rot / 2, e),
           *lf = sf ? factor_list(ck, ll, (int64_t)rot / 2, e) : NULL;
    if (!rs || !sf || !lf) {
        json_decref(rs), json_decref(sf), json_decref(lf);
        return e->msg[0] ? CELER_STATUS_BAD_FILE
                         : error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    json_object_set_new(rs, "type", json_string("longrope"));
    json_object_set_new(rs, "short_factor", sf);
    json_object_set_new(rs, "long_factor", lf);
    if (kv_number(g, "phi3.rope.scaling.original_context_length", &v))
        json_object_set_new(cfg, "original_max_position_embeddings", json_integer((json_int_t)v));
    if (kv_number(g, "phi3.rope.scaling.attn_factor", &v))
        json_object_set_new(rs, "attention_factor", json_real(v));
    json_object_set_new(cfg, "rope_scaling", rs);
    return CELER_OK;
}

static celer_status synth_config(checkpoint *ck, const gguf_file *g, const char *arch,
                                 celer_error *e) {
    json_t *cfg = json_object();
    if (!cfg) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    ck->config = cfg;
    /* a gemma3 file holds the text model alone */
    json_object_set_new(cfg, "model_type",
                        json_string(strcmp(arch, "gemma3") ? arch : "gemma3_text"));
    map_field(g, cfg, arch, "embedding_length", "hidden_size", false);
    map_field(g, cfg, arch, "feed_forward_length", "intermediate_size", false);
    map_field(g, cfg, arch, "attention.head_count", "num_attention_heads", false);
    map_field(g, cfg, arch, "attention.head_count_kv", "num_key_value_heads", false);
    map_field(g, cfg, arch, "block_count", "num_hidden_layers", false);
    map_field(g, cfg, arch, "context_length", "max_position_embeddings", false);
    map_field(g, cfg, arch, "attention.layer_norm_rms_epsilon", "rms_norm_eps", true);
    map_field(g, cfg, arch, "rope.freq_base", "rope_theta", true);
    map_field(g, cfg, arch, "attention.key_length", "head_dim", false);
    map_field(g, cfg, arch, "vocab_size", "vocab_size", false);
    double v;
    if (kv_number(g, "tokenizer.ggml.eos_token_id", &v))
        json_object_set_new(cfg, "eos_token_id", json_integer((json_int_t)v));
    if (kv_number(g, "tokenizer.ggml.bos_token_id", &v))
        json_object_set_new(cfg, "bos_token_id", json_integer((json_int_t)v));
    if (!json_object_get(cfg, "vocab_size")) {
        const gguf_tensor *t = gguf_find_tensor(g, "token_embd.weight");
        if (t && t->ndim == 2) json_object_set_new(cfg, "vocab_size", json_integer(t->ne[1]));
    }
    json_object_set_new(cfg, "tie_word_embeddings",
                        json_boolean(!gguf_find_tensor(g, "output.weight")));
    map_field(g, cfg, arch, "attention.sliding_window", "sliding_window", false);
    if (!strncmp(arch, "gemma", 5)) gemma_config(g, cfg, arch);
    if (!strcmp(arch, "phi3")) {
        celer_status s = phi3_config(ck, g, cfg, e);
        if (s != CELER_OK) return s;
    }
    if (!strcmp(arch, "cohere2")) {
        map_field(g, cfg, arch, "logit_scale", "logit_scale", true);
        map_field(g, cfg, arch, "attention.layer_norm_epsilon", "layer_norm_eps", true);
        /* llama.cpp: an integer pattern (every n-th layer global, default 4) or one
         * flag per layer (true: sliding) */
        char key[128];
        snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
        const gguf_kv *p = gguf_find_kv(g, key);
        if (p && p->val.type == GGUF_TYPE_ARRAY && p->val.arr_type == GGUF_TYPE_BOOL) {
            json_t *types = json_array();
            for (uint64_t i = 0; i < p->val.arr_len; i++)
                json_array_append_new(types, json_string(p->val.arr_data[i] ? "sliding_attention"
                                                                            : "full_attention"));
            json_object_set_new(cfg, "layer_types", types);
        } else {
            map_field(g, cfg, arch, "attention.sliding_window_pattern", "sliding_window_pattern",
                      false);
        }
    }
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    const gguf_kv *st = gguf_find_kv(g, key);
    if (st && st->val.type == GGUF_TYPE_STRING &&
        !(st->val.str_len == 4 && !memcmp(st->val.str, "none", 4))) {
        json_t *rs = json_object();
        json_object_set_new(rs, "type", json_stringn(st->val.str, st->val.str_len));
        snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
        if (kv_number(g, key, &v)) json_object_set_new(rs, "factor", json_real(v));
        snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", arch);
        if (kv_number(g, key, &v))
            json_object_set_new(rs, "original_max_position_embeddings",
                                json_integer((json_int_t)v));
        json_object_set_new(cfg, "rope_scaling", rs);
    }
    return CELER_OK;
}

/* ==== Tensors ==== */

/* GGUF tensor name -> Hugging Face module path (without .weight/.bias), and whether
 * its rows carry llama.cpp's interleaved-RoPE permutation (q or k of arch llama). */
typedef struct name_map {
    const char *g, *hf;
    int qk;
} name_map;

/* Names that differ by arch, looked up before the common ones. */
static const name_map gemma_map[] = {
    {"post_attention_norm", "post_attention_layernorm", 0},
    {"ffn_norm", "pre_feedforward_layernorm", 0},
    {"post_ffw_norm", "post_feedforward_layernorm", 0},
    {NULL, NULL, 0},
};
static const name_map phi3_map[] = {
    {"attn_qkv", "self_attn.qkv_proj", 0}, /* rows q, k, v as Phi-3 stores them */
    {"ffn_up", "mlp.gate_up_proj", 0},     /* rows gate, then up */
    {NULL, NULL, 0},
};

static bool map_name(const char *arch, const char *gname, char *module, size_t size, char *suffix,
                     int *qk) {
    static const name_map layer_map[] = {
        {"attn_norm", "input_layernorm", 0},    {"ffn_norm", "post_attention_layernorm", 0},
        {"attn_q", "self_attn.q_proj", 1},      {"attn_k", "self_attn.k_proj", 2},
        {"attn_v", "self_attn.v_proj", 0},      {"attn_output", "self_attn.o_proj", 0},
        {"ffn_gate", "mlp.gate_proj", 0},       {"ffn_up", "mlp.up_proj", 0},
        {"ffn_down", "mlp.down_proj", 0},       {"attn_q_norm", "self_attn.q_norm", 0},
        {"attn_k_norm", "self_attn.k_norm", 0}, {NULL, NULL, 0},
    };
    const name_map *maps[2] = {!strncmp(arch, "gemma", 5) ? gemma_map
                               : !strcmp(arch, "phi3")    ? phi3_map
                                                          : NULL,
                               layer_map};
    const char *dot = strrchr(gname, '.');
    if (!dot || (strcmp(dot, ".weight") && strcmp(dot, ".bias"))) return false;
    snprintf(suffix, 8, "%s", dot + 1);
    const size_t base = (size_t)(dot - gname);
    *qk = 0;
    if (!strncmp(gname, "token_embd", base) && base == 10)
        return snprintf(module, size, "model.embed_tokens"), true;
    if (!strncmp(gname, "output_norm", base) && base == 11)
        return snprintf(module, size, "model.norm"), true;
    if (!strncmp(gname, "output", base) && base == 6)
        return snprintf(module, size, "lm_head"), true;
    int layer, n = 0;
    if (sscanf(gname, "blk.%d.%n", &layer, &n) != 1 || n == 0 || layer < 0) return false;
    for (int k = 0; k < 2; k++)
        for (const name_map *p = maps[k]; p && p->g; p++) {
            const size_t len = strlen(p->g);
            if ((size_t)n + len == base && !strncmp(gname + n, p->g, len)) {
                snprintf(module, size, "model.layers.%d.%s", layer, p->hf);
                *qk = p->qk;
                return true;
            }
        }
    return false;
}

/* The source row of HF row r when q/k rows were permuted for n_head heads. */
static int64_t unpermute_row(int64_t r, int64_t rows, int64_t n_head) {
    if (n_head <= 0) return r;
    const int64_t hd = rows / n_head, half = hd / 2, h = r / hd, rem = r % hd;
    return h * hd + 2 * (rem % half) + rem / half;
}

typedef struct table {
    safetensors *st; /* entries appended to st->tensors, counted as they are named */
    checkpoint *ck;  /* its derived matrices grow as blocks are converted */
    arena *mem;
    const char *path;
    celer_error *e;
    threadpool *pool; /* block re-layout spread over its threads (NULL: the caller's alone) */
} table;

/* Rows [r0, r1) of one block re-layout; rows are independent (each writes its own words
 * and scales). */
typedef void (*rows_fn)(const void *job, int64_t r0, int64_t r1);

struct rows_run {
    rows_fn fn;
    const void *job;
    int64_t rows;
    threadpool_counter counter;
};

static void rows_task(void *arg, int ith, int nth) {
    struct rows_run *run = arg;
    int64_t lo, hi;
    while (threadpool_chunk(&run->counter, run->rows, 16, &lo, &hi)) run->fn(run->job, lo, hi);
}

/* fn over every row of a matrix, on pool's threads (NULL: the caller's alone). */
static void for_rows(threadpool *pool, rows_fn fn, const void *job, int64_t rows) {
    if (!pool) {
        fn(job, 0, rows);
        return;
    }
    struct rows_run run = {.fn = fn, .job = job, .rows = rows};
    atomic_store(&run.counter.next, 0);
    threadpool_run(pool, rows_task, &run);
}

static st_tensor *add(table *tb, const char *module, const char *suffix, dtype type, int ndim,
                      int64_t r, int64_t c, const void *data, size_t nbytes) {
    st_tensor *t = &tb->st->tensors[tb->st->n_tensors];
    char name[256];
    snprintf(name, sizeof name, "%s.%s", module, suffix);
    if (!(t->name = strdup(name))) return NULL;
    tb->st->n_tensors++;
    t->type = type;
    t->ndim = ndim;
    t->shape[0] = ndim == 1 ? c : r;
    t->shape[1] = c;
    t->data = data;
    t->nbytes = nbytes;
    return t;
}

static celer_status oom(table *tb) {
    return error_set(tb->e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", tb->path);
}

/* The one-value tensor "<module>.zero" of a type with a zero point instead of biases. */
static bool add_zero(table *tb, const char *module, int32_t value) {
    int32_t *zero = arena_alloc(tb->mem, sizeof *zero);
    if (!zero) return false;
    *zero = value;
    return add(tb, module, "zero", DTYPE_I32, 1, 1, 1, zero, sizeof *zero) != NULL;
}

/* The tensor "<module>.lut" of a codebook type. */
static bool add_lut(table *tb, const char *module) {
    return add(tb, module, "lut", DTYPE_I8, 1, 1, 16, IQ4_VALUES, sizeof IQ4_VALUES) != NULL;
}

/* A dense tensor: a view into the map, or a row-reordered copy for permuted q/k. */
static celer_status add_dense(table *tb, const gguf_tensor *gt, const char *module,
                              const char *suffix, int64_t n_head) {
    const dtype type = gt->ggml_type == GGML_F32   ? DTYPE_F32
                       : gt->ggml_type == GGML_F16 ? DTYPE_F16
                                                   : DTYPE_BF16;
    const int64_t cols = gt->ne[0], rows = gt->ndim == 2 ? gt->ne[1] : 1;
    const uint8_t *data = gt->data;
    if (n_head) {
        const size_t rb = gt->nbytes / (size_t)rows;
        uint8_t *copy = arena_alloc(tb->mem, gt->nbytes);
        if (!copy) return oom(tb);
        /* A 1-D bias permutes element-wise: treat it as rows of one element. */
        const int64_t n = gt->ndim == 1 ? cols : rows;
        const size_t unit = gt->ndim == 1 ? dtype_size(type) : rb;
        for (int64_t r = 0; r < n; r++)
            memcpy(copy + (size_t)r * unit, gt->data + (size_t)unpermute_row(r, n, n_head) * unit,
                   unit);
        data = copy;
    }
    return add(tb, module, suffix, type, gt->ndim, rows, cols, data, gt->nbytes) ? CELER_OK
                                                                                 : oom(tb);
}

/* n codes q[n] into a row's bit string from code first on (code c at bits c*bits), as
 * whole words: the codes start and end on word boundaries (a block of 32 or 256 codes does
 * at every width), so every word is written, none OR-ed into. */
static void put_codes(uint32_t *row, int64_t first, const uint8_t *q, int n, int bits) {
    CELER_ASSERT(first * bits % 32 == 0 && n * bits % 32 == 0);
    if (bits == 4) { /* the common width, unrolled */
        for (int k = 0; k < n; k += 8)
            row[(first + k) / 8] = (uint32_t)q[k] | (uint32_t)q[k + 1] << 4 |
                                   (uint32_t)q[k + 2] << 8 | (uint32_t)q[k + 3] << 12 |
                                   (uint32_t)q[k + 4] << 16 | (uint32_t)q[k + 5] << 20 |
                                   (uint32_t)q[k + 6] << 24 | (uint32_t)q[k + 7] << 28;
        return;
    }
    uint32_t *out = row + first * bits / 32;
    uint64_t acc = 0;
    int have = 0;
    for (int k = 0; k < n; k++) {
        acc |= (uint64_t)q[k] << have, have += bits;
        if (have >= 32) *out++ = (uint32_t)acc, acc >>= 32, have -= 32;
    }
}

/* The codes (0 .. 2^bits - 1) of one 32-element block, its scale and its bias; bias is
 * untouched for the types with a zero point. */
static void decode_block(uint32_t gtype, const uint8_t *blk, uint8_t q[32], uint16_t *d,
                         uint16_t *m) {
    memcpy(d, blk, 2);
    if (gtype == GGML_Q8_0) {
        for (int k = 0; k < 32; k++) q[k] = (uint8_t)((int)(int8_t)blk[2 + k] + 128);
        *m = f32_to_f16(-128.0f * f16_to_f32(*d));
        return;
    }
    const bool with_m = gtype == GGML_Q4_1 || gtype == GGML_Q5_1,
               five = gtype == GGML_Q5_0 || gtype == GGML_Q5_1;
    if (with_m) memcpy(m, blk + 2, 2);
    uint32_t qh = 0;
    if (five) memcpy(&qh, blk + (with_m ? 4 : 2), 4);
    const uint8_t *qs = blk + (with_m ? 4 : 2) + (five ? 4 : 0);
    for (int k = 0; k < 32; k++)
        q[k] =
            (uint8_t)((k < 16 ? qs[k] & 15 : qs[k - 16] >> 4) | (five ? ((qh >> k) & 1u) << 4 : 0));
    if (gtype == GGML_Q4_0) *m = f32_to_f16(-8.0f * f16_to_f32(*d));
}

/* One Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL matrix's re-layout (add_blocks). */
struct blocks_job {
    const gguf_tensor *gt;
    int64_t n_head;
    int bits;
    size_t bsize;
    int64_t words;
    uint32_t *codes;
    uint16_t *scales, *biases;
};

/* One K-quant or IQ4_XS matrix's re-layout (add_kblocks). */
struct kblocks_job {
    const gguf_tensor *gt;
    int64_t n_head;
    int bits, per;
    size_t bsize;
    int64_t words;
    uint32_t *codes;
    uint8_t *scales, *mins;
    uint16_t *fd, *fm;
};

/* One converted matrix (see the top of the file): its mapping, and the re-layout that
 * fills it from the file. */
struct gguf_derived {
    rows_fn fn;
    union {
        struct blocks_job blocks;
        struct kblocks_job kblocks;
    } job;
    int64_t rows;
    uint8_t *base;
    size_t size, used;
    bool dropped; /* some of its pages went */
};

/* A new derived matrix of size bytes (its parts 64-byte aligned), or NULL. */
static struct gguf_derived *derived_new(table *tb, size_t size) {
    checkpoint *ck = tb->ck;
    struct gguf_derived *d = realloc(ck->derived, (ck->n_derived + 1) * sizeof *d);
    if (!d) return NULL;
    ck->derived = d;
    d += ck->n_derived;
    *d = (struct gguf_derived){.size = size ? size : 1}; /* a matrix of no rows maps a page */
    void *p = mmap(NULL, d->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    d->base = p;
    ck->n_derived++;
    return d;
}

/* The bytes of one part, rounded up as derived_take hands them out. */
static size_t part(size_t n) {
    return (n + 63) / 64 * 64;
}

/* The next n bytes of d (zeroed: fresh anonymous memory). */
static void *derived_take(struct gguf_derived *d, size_t n) {
    void *p = d->base + d->used;
    d->used += part(n);
    CELER_ASSERT(d->used <= d->size);
    return p;
}

void gguf_release_derived(const checkpoint *ck, const void *p, size_t n) {
    const uintptr_t lo = (uintptr_t)p, page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < ck->n_derived; i++) {
        struct gguf_derived *d = &ck->derived[i];
        const uintptr_t base = (uintptr_t)d->base;
        if (lo < base || lo - base >= d->size) continue;
        const uintptr_t hi = lo + (n < d->size - (lo - base) ? n : d->size - (lo - base));
        const uintptr_t a = (lo + page - 1) / page * page, b = hi / page * page;
        if (b > a && madvise((void *)a, b - a, MADV_DONTNEED) == 0) d->dropped = true;
        return;
    }
}

void gguf_restore_derived(checkpoint *ck) {
    threadpool *pool = NULL;
    for (size_t i = 0; i < ck->n_derived; i++) {
        struct gguf_derived *d = &ck->derived[i];
        if (!d->dropped) continue;
        if (!pool) pool = threadpool_create(threadpool_cpu_count()); /* NULL: this thread */
        for_rows(pool, d->fn, &d->job, d->rows);
        d->dropped = false;
    }
    threadpool_destroy(pool);
}

void gguf_free_derived(checkpoint *ck) {
    for (size_t i = 0; i < ck->n_derived; i++) munmap(ck->derived[i].base, ck->derived[i].size);
    free(ck->derived);
    ck->derived = NULL;
    ck->n_derived = 0;
}

static void blocks_rows(const void *arg, int64_t r0, int64_t r1) {
    const struct blocks_job *j = arg;
    const int64_t rows = j->gt->ne[1], nb = j->gt->ne[0] / 32;
    const int bits = j->bits;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *src =
            j->gt->data + (size_t)unpermute_row(r, rows, j->n_head) * (size_t)nb * j->bsize;
        uint32_t *row = j->codes + r * j->words;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t q[32];
            uint16_t d, m = 0;
            decode_block(j->gt->ggml_type, src + (size_t)b * j->bsize, q, &d, &m);
            put_codes(row, b * 32, q, 32, bits);
            j->scales[r * nb + b] = d;
            if (j->biases) j->biases[r * nb + b] = m;
        }
    }
}

/* A Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 matrix -> MLX codes [rows, cols*bits/32] + fp16 scales
 * and biases (Q5_0: a zero point instead of biases). */
static celer_status add_blocks(table *tb, const gguf_tensor *gt, const char *module,
                               int64_t n_head) {
    const uint32_t gtype = gt->ggml_type;
    const int bits = gtype == GGML_Q8_0 ? 8 : gtype == GGML_Q5_0 || gtype == GGML_Q5_1 ? 5 : 4;
    const bool zero_point = gtype == GGML_Q5_0 || gtype == GGML_IQ4_NL;
    const int64_t cols = gt->ne[0], rows = gt->ne[1], nb = cols / 32;
    const size_t bsize = gtype == GGML_Q4_0 || gtype == GGML_IQ4_NL ? 18
                         : gtype == GGML_Q4_1                       ? 20
                         : gtype == GGML_Q5_0                       ? 22
                         : gtype == GGML_Q5_1                       ? 24
                                                                    : 34;
    const int64_t words = cols * bits / 32;
    const size_t code_bytes = sizeof(uint32_t) * (size_t)(rows * words),
                 scale_bytes = sizeof(uint16_t) * (size_t)(rows * nb);
    struct gguf_derived *d =
        derived_new(tb, part(code_bytes) + (zero_point ? 1 : 2) * part(scale_bytes));
    if (!d) return oom(tb);
    uint32_t *codes = derived_take(d, code_bytes);
    uint16_t *scales = derived_take(d, scale_bytes);
    uint16_t *biases = zero_point ? NULL : derived_take(d, scale_bytes);
    d->job.blocks = (struct blocks_job){gt, n_head, bits, bsize, words, codes, scales, biases};
    d->fn = blocks_rows, d->rows = rows;
    for_rows(tb->pool, blocks_rows, &d->job, rows);
    if (!add(tb, module, "weight", DTYPE_U32, 2, rows, words, codes,
             sizeof(uint32_t) * (size_t)(rows * words)) ||
        !add(tb, module, "scales", DTYPE_F16, 2, rows, nb, scales,
             sizeof(uint16_t) * (size_t)(rows * nb)))
        return oom(tb);
    if (biases && !add(tb, module, "biases", DTYPE_F16, 2, rows, nb, biases,
                       sizeof(uint16_t) * (size_t)(rows * nb)))
        return oom(tb);
    if (zero_point && !add_zero(tb, module, gtype == GGML_IQ4_NL ? 0 : 16)) return oom(tb);
    if (gtype == GGML_IQ4_NL && !add_lut(tb, module)) return oom(tb);
    return CELER_OK;
}

/* The 256 codes of a K-quant or IQ4_XS super-block, in element order. */
static void kquant_codes(uint32_t gtype, const uint8_t *blk, uint8_t q[256]) {
    switch (gtype) {
    case GGML_Q2_K: /* scales[16], qs[64], d, dmin */
        for (int e = 0; e < 256; e++)
            q[e] = (uint8_t)((blk[16 + 32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3);
        return;
    case GGML_Q3_K: /* hmask[32], qs[64], scales[12], d */
        for (int e = 0; e < 256; e++)
            q[e] = (uint8_t)(((blk[32 + 32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3) |
                             ((blk[e % 32] >> (e / 32)) & 1) << 2);
        return;
    case GGML_IQ4_XS: /* d, scales_h (u16), scales_l[4], qs[128]: Q4_0's order per 32 */
        for (int e = 0; e < 256; e++)
            q[e] = (uint8_t)((blk[8 + 16 * (e / 32) + e % 16] >> (4 * (e % 32 / 16))) & 15);
        return;
    case GGML_Q6_K: /* ql[128], qh[64], then scales and d */
        for (int h = 0; h < 2; h++)
            for (int w = 0; w < 128; w++)
                q[128 * h + w] =
                    (uint8_t)(((blk[64 * h + w % 64] >> (4 * (w / 64))) & 15) |
                              ((blk[128 + 32 * h + w % 32] >> (2 * (w / 32))) & 3) << 4);
        return;
    default: { /* Q4_K: d, dmin, scales[12], qs[128]; Q5_K: the same with qh[32] before qs */
        const bool five = gtype == GGML_Q5_K;
        const uint8_t *qs = blk + 16 + (five ? 32 : 0);
        for (int g = 0; g < 8; g++)
            for (int i = 0; i < 32; i++)
                q[32 * g + i] = (uint8_t)(((qs[32 * (g / 2) + i] >> (4 * (g % 2))) & 15) |
                                          (five ? ((blk[16 + i] >> g) & 1) << 4 : 0));
    }
    }
}

/* Group j's 6-bit scale and min of a Q4_K / Q5_K super-block (its 12 packed bytes). */
static void kquant_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63, *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 15) | (s[j - 4] >> 6) << 4);
        *m = (uint8_t)((s[j + 4] >> 4) | (s[j] >> 6) << 4);
    }
}

/* Group j's scale of a Q3_K super-block (16 of 6 bits in 12 bytes), less 32. */
static int8_t q3k_scale(const uint8_t *s, int j) {
    const int lo = (s[j % 8] >> (4 * (j / 8))) & 15, hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (int8_t)((lo | hi << 4) - 32);
}

/* Group j's scale of an IQ4_XS super-block, less 32. */
static int8_t iq4xs_scale(const uint8_t *blk, int j) {
    const uint16_t h = (uint16_t)(blk[2] | blk[3] << 8);
    const int lo = (blk[4 + j / 2] >> (4 * (j % 2))) & 15, hi = (h >> (2 * j)) & 3;
    return (int8_t)((lo | hi << 4) - 32);
}

static void kblocks_rows(const void *arg, int64_t r0, int64_t r1) {
    const struct kblocks_job *j = arg;
    const uint32_t gtype = j->gt->ggml_type;
    const bool q2 = gtype == GGML_Q2_K, q3 = gtype == GGML_Q3_K, q6 = gtype == GGML_Q6_K,
               xs = gtype == GGML_IQ4_XS;
    const int64_t rows = j->gt->ne[1], nsup = j->gt->ne[0] / 256;
    const int bits = j->bits, per = j->per;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *src =
            j->gt->data + (size_t)unpermute_row(r, rows, j->n_head) * (size_t)nsup * j->bsize;
        uint32_t *row = j->codes + r * j->words;
        for (int64_t b = 0; b < nsup; b++) {
            const uint8_t *blk = src + (size_t)b * j->bsize;
            const int64_t k = r * nsup + b;
            uint8_t q[256];
            kquant_codes(gtype, blk, q);
            put_codes(row, b * 256, q, 256, bits);
            uint8_t *sc = j->scales + k * per;
            if (q6) {
                memcpy(sc, blk + 192, 16);
                memcpy(&j->fd[k], blk + 208, 2);
            } else if (q2) {
                memcpy(sc, blk, 16);
                memcpy(&j->fd[k], blk + 80, 2);
                memcpy(&j->fm[k], blk + 82, 2);
                j->fm[k] ^= 0x8000; /* -dmin */
            } else if (q3) {
                for (int i = 0; i < per; i++) sc[i] = (uint8_t)q3k_scale(blk + 96, i);
                memcpy(&j->fd[k], blk + 108, 2);
            } else if (xs) {
                for (int i = 0; i < per; i++) sc[i] = (uint8_t)iq4xs_scale(blk, i);
                memcpy(&j->fd[k], blk, 2);
            } else {
                memcpy(&j->fd[k], blk, 2);
                memcpy(&j->fm[k], blk + 2, 2);
                j->fm[k] ^= 0x8000; /* -dmin: the mins are subtracted */
                for (int i = 0; i < per; i++)
                    kquant_scale_min(blk + 4, i, &sc[i], &j->mins[k * per + i]);
            }
        }
    }
}

/* A K-quant or IQ4_XS matrix -> MLX codes, U8/I8 group scales (and mins), F16 factors. */
static celer_status add_kblocks(table *tb, const gguf_tensor *gt, const char *module,
                                int64_t n_head) {
    const uint32_t gtype = gt->ggml_type;
    /* no mins: a zero point (Q3_K 4, Q6_K 32) or a codebook (IQ4_XS) */
    const bool q2 = gtype == GGML_Q2_K, q3 = gtype == GGML_Q3_K, q6 = gtype == GGML_Q6_K,
               xs = gtype == GGML_IQ4_XS, no_mins = q3 || q6 || xs;
    const int bits = q2                   ? 2
                     : q3                 ? 3
                     : gtype == GGML_Q5_K ? 5
                     : q6                 ? 6
                                          : 4,
              group = q2 || q3 || q6 ? 16 : 32, per = 256 / group;
    const size_t bsize = q2                   ? 84
                         : q3                 ? 110
                         : gtype == GGML_Q4_K ? 144
                         : gtype == GGML_Q5_K ? 176
                         : q6                 ? 210
                                              : 136;
    const int64_t cols = gt->ne[0], rows = gt->ne[1], nsup = cols / 256, words = cols * bits / 32;
    /* Q2_K's scale and min share a byte: the mins are the same bytes' high nibbles */
    const bool with_mins = !no_mins && !q2;
    const size_t code_bytes = sizeof(uint32_t) * (size_t)(rows * words),
                 scale_bytes = (size_t)(rows * nsup * per),
                 factor_bytes = sizeof(uint16_t) * (size_t)(rows * nsup);
    struct gguf_derived *d =
        derived_new(tb, part(code_bytes) + (with_mins ? 2 : 1) * part(scale_bytes) +
                            (no_mins ? 1 : 2) * part(factor_bytes));
    if (!d) return oom(tb);
    uint32_t *codes = derived_take(d, code_bytes);
    uint8_t *scales = derived_take(d, scale_bytes);
    uint8_t *mins = with_mins ? derived_take(d, scale_bytes) : NULL;
    uint16_t *fd = derived_take(d, factor_bytes);
    uint16_t *fm = no_mins ? NULL : derived_take(d, factor_bytes);
    d->job.kblocks =
        (struct kblocks_job){gt, n_head, bits, per, bsize, words, codes, scales, mins, fd, fm};
    d->fn = kblocks_rows, d->rows = rows;
    for_rows(tb->pool, kblocks_rows, &d->job, rows);
    const dtype st = no_mins ? DTYPE_I8 : q2 ? DTYPE_U4LO : DTYPE_U8;
    if (!add(tb, module, "weight", DTYPE_U32, 2, rows, words, codes,
             sizeof(uint32_t) * (size_t)(rows * words)) ||
        !add(tb, module, "scales", st, 2, rows, nsup * per, scales, (size_t)(rows * nsup * per)) ||
        !add(tb, module, "super_scales", DTYPE_F16, 2, rows, nsup, fd,
             sizeof(uint16_t) * (size_t)(rows * nsup)))
        return oom(tb);
    if (no_mins)
        return add_zero(tb, module,
                        q3   ? 4
                        : q6 ? 32
                             : 0) &&
                       (!xs || add_lut(tb, module))
                   ? CELER_OK
                   : oom(tb);
    if (!add(tb, module, "biases", q2 ? DTYPE_U4HI : st, 2, rows, nsup * per, q2 ? scales : mins,
             (size_t)(rows * nsup * per)) ||
        !add(tb, module, "super_biases", DTYPE_F16, 2, rows, nsup, fm,
             sizeof(uint16_t) * (size_t)(rows * nsup)))
        return oom(tb);
    return CELER_OK;
}

static celer_status build_tensors(checkpoint *ck, const gguf_file *g, const char *arch,
                                  threadpool *pool, celer_error *e) {
    safetensors *st = calloc(1, sizeof *st);
    if (!st) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    ck->shards = st;
    ck->n_shards = 1;
    if (!(st->path = strdup(ck->config_path)) ||
        !(st->tensors = calloc(6 * g->n_tensors + 1, sizeof *st->tensors)))
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    table tb = {st, ck, &ck->mem, ck->config_path, e, pool};
    double heads = 0, kv_heads = 0;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.head_count", arch);
    kv_number(g, key, &heads);
    snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
    if (!kv_number(g, key, &kv_heads)) kv_heads = heads;
    /* llama.cpp's converter permutes q/k rows for arch llama only (qwen2 keeps NeoX order). */
    const bool permuted = strcmp(arch, "llama") == 0;
    celer_status s = CELER_OK;
    for (size_t i = 0; i < g->n_tensors && s == CELER_OK; i++) {
        const gguf_tensor *gt = &g->tensors[i];
        char module[200], suffix[8];
        int qk;
        if (!strcmp(gt->name, "rope_freqs.weight"))
            return error_set(
                e, CELER_STATUS_UNSUPPORTED,
                "%s: tensor rope_freqs.weight: RoPE frequency factors are not supported yet",
                ck->config_path);
        if (!map_name(arch, gt->name, module, sizeof module, suffix, &qk))
            continue; /* not a weight celer reads */
        const int64_t n_head = permuted ? (qk == 1   ? (int64_t)heads
                                           : qk == 2 ? (int64_t)kv_heads
                                                     : 0)
                                        : 0;
        if (gt->ndim > 2)
            return error_set(e, CELER_STATUS_BAD_FILE,
                             "%s: tensor %s: %d dimensions (expected 1 or 2)", ck->config_path,
                             gt->name, gt->ndim);
        const int64_t rows = gt->ndim == 2 ? gt->ne[1] : gt->ne[0];
        if (n_head && (rows % n_head || (rows / n_head) % 2))
            return error_set(e, CELER_STATUS_BAD_FILE,
                             "%s: tensor %s: %lld rows do not split into %lld heads of even size",
                             ck->config_path, gt->name, (long long)rows, (long long)n_head);
        switch (gt->ggml_type) {
        case GGML_F32:
        case GGML_F16:
        case GGML_BF16:
            s = add_dense(&tb, gt, module, suffix, n_head);
            break;
        default:
            if (gt->ndim != 2 || strcmp(suffix, "weight"))
                return error_set(e, CELER_STATUS_UNSUPPORTED,
                                 "%s: tensor %s: block-quantized vectors are not supported",
                                 ck->config_path, gt->name);
            s = gt->ggml_type == GGML_Q2_K || gt->ggml_type == GGML_Q3_K ||
                        gt->ggml_type == GGML_Q4_K || gt->ggml_type == GGML_Q5_K ||
                        gt->ggml_type == GGML_Q6_K || gt->ggml_type == GGML_IQ4_XS
                    ? add_kblocks(&tb, gt, module, n_head)
                    : add_blocks(&tb, gt, module, n_head);
            /* the blocks are read again only if the converted pages go and come back */
            checkpoint_release_range(ck, gt->data, gt->nbytes);
        }
    }
    safetensors_index(st);
    return s;
}

/* A part's split.no and split.count; an error naming label when either is missing or not a
 * count. */
static celer_status split_fields(const gguf_file *g, const char *label, int64_t *no, int64_t *count,
                                 celer_error *e) {
    double n = -1, c = -1;
    if (!kv_number(g, "split.no", &n) || !kv_number(g, "split.count", &c) || n < 0 || c < 1 ||
        n != (double)(int64_t)n || c != (double)(int64_t)c || c > 99999)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: split.no and split.count: expected the part's number and the "
                         "count of parts of a split GGUF",
                         label);
    *no = (int64_t)n, *count = (int64_t)c;
    return CELER_OK;
}

/* The other parts of a split file whose first part ck->gguf is: mapped, parsed, checked, and
 * their tensors moved into ck->gguf's table. */
static celer_status open_parts(checkpoint *ck, const char *path, celer_error *e) {
    gguf_file *g = ck->gguf;
    if (!gguf_find_kv(g, "split.count")) return CELER_OK;
    int64_t no, count;
    celer_status s = split_fields(g, path, &no, &count, e);
    if (s != CELER_OK) return s;
    if (no != 0)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "%s: part %lld of %lld of a split GGUF: open the first part "
                         "(-00001-of-%05lld.gguf)",
                         path, (long long)no + 1, (long long)count, (long long)count);
    int part, parts;
    if (count > 1 && (!hf_gguf_shard(path, &part, &parts) || part != 1 || parts != count))
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: split.count says %lld parts, but the name does not end in "
                         "-00001-of-%05lld.gguf, which names them",
                         path, (long long)count, (long long)count);
    if (!(ck->gguf_parts = calloc((size_t)count, sizeof *ck->gguf_parts)))
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    const size_t at = strlen(path) - 19; /* where the part number starts */
    for (int64_t k = 1; k < count; k++) {
        char name[4096];
        snprintf(name, sizeof name, "%.*s%05lld%s", (int)at, path, (long long)k + 1, path + at + 5);
        mapped_file *map = &ck->gguf_parts[ck->n_gguf_parts];
        celer_error pe = {{0}};
        if ((s = mapped_file_open(name, map, &pe)) != CELER_OK)
            return error_set(e, s, "%s (part %lld of %lld of %s)", pe.msg, (long long)k + 1,
                             (long long)count, path);
        ck->n_gguf_parts++;
        gguf_file pg;
        s = gguf_parse(&pg, name, map->data, map->size, e);
        int64_t pno = 0, pcount = 0;
        if (s == CELER_OK) s = split_fields(&pg, name, &pno, &pcount, e);
        if (s == CELER_OK && (pno != k || pcount != count))
            s = error_set(e, CELER_STATUS_BAD_FILE,
                          "%s: split.no %lld of split.count %lld, expected part %lld of %lld "
                          "(the parts of %s)",
                          name, (long long)pno + 1, (long long)pcount, (long long)k + 1,
                          (long long)count, path);
        gguf_tensor *t =
            s == CELER_OK
                ? realloc(g->tensors, (g->n_tensors + pg.n_tensors + 1) * sizeof *g->tensors)
                : NULL;
        if (s == CELER_OK && !t) s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        if (s == CELER_OK) { /* the names move with the entries */
            g->tensors = t;
            memcpy(t + g->n_tensors, pg.tensors, pg.n_tensors * sizeof *t);
            g->n_tensors += pg.n_tensors;
            pg.n_tensors = 0;
        }
        gguf_free(&pg);
        if (s != CELER_OK) return s;
    }
    double want = 0;
    if (kv_number(g, "split.tensors.count", &want) && want != (double)g->n_tensors)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: split.tensors.count says %.0f tensors, the %lld parts hold %zu", path,
                         want, (long long)count, g->n_tensors);
    for (size_t i = 0; i < g->n_tensors; i++) /* a name twice across parts */
        for (size_t j = 0; j < i; j++)
            if (!strcmp(g->tensors[i].name, g->tensors[j].name))
                return error_set(e, CELER_STATUS_BAD_FILE,
                                 "%s: tensor %s is in more than one part of the split file", path,
                                 g->tensors[i].name);
    return CELER_OK;
}

celer_status gguf_open_checkpoint(checkpoint *ck, const char *path, celer_error *e) {
    celer_status s;
    if (!(ck->dir = strdup(path)) || !(ck->config_path = strdup(path)) ||
        !(ck->gguf = calloc(1, sizeof *ck->gguf))) {
        s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    if ((s = mapped_file_open(path, &ck->gguf_map, e)) != CELER_OK) goto fail;
    if ((s = gguf_parse(ck->gguf, path, ck->gguf_map.data, ck->gguf_map.size, e)) != CELER_OK ||
        (s = open_parts(ck, path, e)) != CELER_OK)
        goto fail;
    const gguf_kv *a = gguf_find_kv(ck->gguf, "general.architecture");
    char arch[32] = "";
    if (a && a->val.type == GGUF_TYPE_STRING && a->val.str_len < sizeof arch)
        memcpy(arch, a->val.str, a->val.str_len);
    static const char *const archs[] = {"llama",  "qwen2",  "qwen3", "cohere2",
                                        "gemma2", "gemma3", "phi3"};
    bool known = false;
    for (size_t i = 0; i < sizeof archs / sizeof *archs; i++)
        known = known || !strcmp(arch, archs[i]);
    if (!known) {
        s = error_set(e, CELER_STATUS_UNSUPPORTED,
                      "%s: general.architecture: expected llama, qwen2, qwen3, cohere2, gemma2, "
                      "gemma3 or phi3, found %s",
                      path, a ? (arch[0] ? arch : "a non-string or over-long value") : "nothing");
        goto fail;
    }
    if ((s = synth_config(ck, ck->gguf, arch, e)) != CELER_OK) goto fail;
    /* the blocks' re-layout on every CPU once there are enough of them (a pool's threads
     * cost more than a small file's re-layout); without a pool, on this thread alone */
    int64_t weights = 0;
    for (size_t i = 0; i < ck->gguf->n_tensors; i++)
        if (ck->gguf->tensors[i].ndim == 2)
            weights += ck->gguf->tensors[i].ne[0] * ck->gguf->tensors[i].ne[1];
    threadpool *pool =
        weights >= ((int64_t)1 << 22) ? threadpool_create(threadpool_cpu_count()) : NULL;
    s = build_tensors(ck, ck->gguf, arch, pool, e);
    threadpool_destroy(pool);
    if (s != CELER_OK) goto fail;
    return CELER_OK;
fail:
    checkpoint_close(ck);
    return s;
}
