/*
 * rope.c - what every text family reads the same way from its config: the shapes
 * (model_read_dims) and the rotary embedding frequencies (model_read_rope: default,
 * linear, llama3 and YaRN scaling, as transformers' modeling_rope_utils defines them).
 * The rotation itself is the backend's rope op.
 */
#include "models/model.h"

#include <math.h>
#include <string.h>

#define ROPE_PI 3.14159265358979323846

/* ==== RoPE frequencies ==== */

/* inv_freq[dims/2] and the cos/sin factor for the rope_scaling block (NULL: plain RoPE)
 * of dims rotated values a head, following the definitions of Hugging Face transformers'
 * modeling_rope_utils. */
static celer_status rope_frequencies(celer_model *m, const json_t *scaling, double theta, int64_t dims,
                                     float *inv_freq, float *mscale, celer_error *e) {
    const checkpoint *ck = &m->ck;
    const int64_t hd = dims, half = hd / 2;
    for (int64_t i = 0; i < half; i++) inv_freq[i] = (float)(1.0 / pow(theta, (double)(2 * i) / (double)hd));
    *mscale = 1.0f;
    if (!scaling || json_is_null(scaling)) return CELER_OK;
    if (!json_is_object(scaling))
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: rope_scaling: expected an object or null",
                         ck->config_path);
    const char *type;
    celer_status s = config_str(ck, scaling, "rope_type", &type, e);
    if (s == CELER_OK && !type) s = config_str(ck, scaling, "type", &type, e);
    if (s != CELER_OK) return s;
    if (!type || strcmp(type, "default") == 0) return CELER_OK;
    double factor;
    if ((s = config_num(ck, scaling, "factor", 1.0, &factor, e)) != CELER_OK) return s;
    if (factor <= 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: rope_scaling.factor: expected > 0, found %g",
                         ck->config_path, factor);
    if (strcmp(type, "linear") == 0) {
        for (int64_t i = 0; i < half; i++) inv_freq[i] = (float)(inv_freq[i] / factor);
        return CELER_OK;
    }
    int64_t orig;
    if ((s = config_int(ck, scaling, "original_max_position_embeddings", m->dims.n_ctx_train, &orig, e)) != CELER_OK)
        return s;
    if (orig <= 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: rope_scaling.original_max_position_embeddings: expected > 0",
                         ck->config_path);
    if (strcmp(type, "llama3") == 0) {
        double lo_f, hi_f;
        if ((s = config_num(ck, scaling, "low_freq_factor", 1.0, &lo_f, e)) != CELER_OK ||
            (s = config_num(ck, scaling, "high_freq_factor", 4.0, &hi_f, e)) != CELER_OK)
            return s;
        if (hi_f <= lo_f)
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "%s: rope_scaling: high_freq_factor %g must exceed low_freq_factor %g",
                             ck->config_path, hi_f, lo_f);
        const double lo_wavelen = (double)orig / lo_f, hi_wavelen = (double)orig / hi_f;
        for (int64_t i = 0; i < half; i++) {
            const double f = inv_freq[i], wavelen = 2.0 * ROPE_PI / f;
            double out = wavelen > lo_wavelen ? f / factor : f;
            if (!(wavelen < hi_wavelen) && !(wavelen > lo_wavelen)) {
                const double smooth = ((double)orig / wavelen - lo_f) / (hi_f - lo_f);
                out = (1.0 - smooth) * f / factor + smooth * f;
            }
            inv_freq[i] = (float)out;
        }
        return CELER_OK;
    }
    if (strcmp(type, "yarn") == 0) {
        double attn_factor, ms, ms_all, beta_fast, beta_slow;
        bool truncate;
        if ((s = config_num(ck, scaling, "attention_factor", -1.0, &attn_factor, e)) != CELER_OK ||
            (s = config_num(ck, scaling, "mscale", 0.0, &ms, e)) != CELER_OK ||
            (s = config_num(ck, scaling, "mscale_all_dim", 0.0, &ms_all, e)) != CELER_OK ||
            (s = config_num(ck, scaling, "beta_fast", 32.0, &beta_fast, e)) != CELER_OK ||
            (s = config_num(ck, scaling, "beta_slow", 1.0, &beta_slow, e)) != CELER_OK ||
            (s = config_bool(ck, scaling, "truncate", true, &truncate, e)) != CELER_OK)
            return s;
        if (beta_fast == 0) beta_fast = 32.0; /* transformers treats 0 as unset */
        if (beta_slow == 0) beta_slow = 1.0;
#define YARN_MSCALE(scale, k) ((scale) <= 1.0 ? 1.0 : 0.1 * (k) * log(scale) + 1.0)
        if (attn_factor < 0)
            attn_factor = (ms != 0 && ms_all != 0) ? YARN_MSCALE(factor, ms) / YARN_MSCALE(factor, ms_all)
                                                   : YARN_MSCALE(factor, 1.0);
#undef YARN_MSCALE
        const double dim = (double)hd;
#define YARN_DIM(rot) (dim * log((double)orig / ((rot) * 2.0 * ROPE_PI)) / (2.0 * log(theta)))
        double lo = YARN_DIM(beta_fast), hi = YARN_DIM(beta_slow);
#undef YARN_DIM
        if (truncate) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        if (lo < 0) lo = 0;
        if (hi > dim - 1) hi = dim - 1;
        if (lo == hi) hi += 0.001;
        for (int64_t i = 0; i < half; i++) {
            double ramp = ((double)i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            const double extra = 1.0 - ramp; /* weight of the unscaled frequency */
            const double f = inv_freq[i];
            inv_freq[i] = (float)(f / factor * (1.0 - extra) + f * extra);
        }
        *mscale = (float)attn_factor;
        return CELER_OK;
    }
    return error_set(e, CELER_STATUS_UNSUPPORTED,
                     "%s: rope_scaling type \"%s\" is not supported (expected default, linear, "
                     "llama3 or yarn)",
                     ck->config_path, type);
}

celer_status model_rope_from(celer_model *m, const json_t *scaling, double theta, int64_t dims, bool traditional,
                             rope_params *out, celer_error *e) {
    if (dims <= 0 || dims > m->dims.hd || dims % 2)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: rotary dimensions: expected an even number in [2, head_dim %lld], found %lld",
                         m->ck.config_path, (long long)m->dims.hd, (long long)dims);
    /* a weight vector: a backend with memory of its own reads its mirror */
    float *inv_freq = arena_alloc(&m->vectors, sizeof(float) * (size_t)(dims / 2));
    if (!inv_freq) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    *out = (rope_params){.inv_freq = inv_freq, .dims = dims == m->dims.hd ? 0 : dims, .mscale = 1.0f,
                         .traditional = traditional};
    if (m->rope_kinds < MODEL_MAX_ROPE_KINDS) m->rope_kinds++;
    return rope_frequencies(m, scaling, theta, dims, inv_freq, &out->mscale, e);
}

/* factors[n] from the list key of obj, each > 0. */
static celer_status read_factors(const checkpoint *ck, const json_t *obj, const char *key, int64_t n, double *out,
                                 celer_error *e) {
    const json_t *a = json_object_get(obj, key);
    if (!json_is_array(a) || (int64_t)json_array_size(a) != n)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: rope_scaling.%s: expected a list of %lld factors (rotary dimensions / 2), found %s",
                         ck->config_path, key, (long long)n,
                         json_is_array(a) ? "a list of another length" : "no list");
    for (int64_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, (size_t)i);
        out[i] = json_number_value(v);
        if (!json_is_number(v) || !(out[i] > 0))
            return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: rope_scaling.%s[%lld]: expected a number > 0",
                             ck->config_path, key, (long long)i);
    }
    return CELER_OK;
}

celer_status model_read_longrope(celer_model *m, const json_t *scaling, double theta, int64_t dims,
                                 rope_params *short_rp, rope_params *long_rp, int64_t *orig, celer_error *e) {
    const checkpoint *ck = &m->ck;
    const int64_t half = dims / 2;
    double attn_factor, factor, sf[512], lf[512];
    celer_status s;
    if (half > 512)
        return error_set(e, CELER_STATUS_UNSUPPORTED, "%s: longrope over %lld rotary dimensions (at most 1024)",
                         ck->config_path, (long long)dims);
    if ((s = model_rope_from(m, NULL, theta, dims, false, short_rp, e)) != CELER_OK ||
        (s = model_rope_from(m, NULL, theta, dims, false, long_rp, e)) != CELER_OK)
        return s;
    if ((s = config_int(ck, m->cfg, "original_max_position_embeddings", m->dims.n_ctx_train, orig, e)) != CELER_OK ||
        (s = config_int(ck, scaling, "original_max_position_embeddings", *orig, orig, e)) != CELER_OK ||
        (s = read_factors(ck, scaling, "short_factor", half, sf, e)) != CELER_OK ||
        (s = read_factors(ck, scaling, "long_factor", half, lf, e)) != CELER_OK ||
        (s = config_num(ck, scaling, "factor", (double)m->dims.n_ctx_train / (double)(*orig > 0 ? *orig : 1), &factor,
                        e)) != CELER_OK ||
        (s = config_num(ck, scaling, "attention_factor", -1.0, &attn_factor, e)) != CELER_OK)
        return s;
    if (*orig <= 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: original_max_position_embeddings: expected > 0",
                         ck->config_path);
    /* transformers: sqrt(1 + ln(factor) / ln(original)) unless given; 1 for factor <= 1 */
    if (attn_factor < 0) attn_factor = factor <= 1.0 ? 1.0 : sqrt(1.0 + log(factor) / log((double)*orig));
    float *si = (float *)short_rp->inv_freq, *li = (float *)long_rp->inv_freq;
    for (int64_t i = 0; i < half; i++) {
        const double base = pow(theta, (double)(2 * i) / (double)dims);
        si[i] = (float)(1.0 / (sf[i] * base));
        li[i] = (float)(1.0 / (lf[i] * base));
    }
    short_rp->mscale = long_rp->mscale = (float)attn_factor;
    return CELER_OK;
}

celer_status model_read_rope(celer_model *m, bool traditional, rope_params *out, celer_error *e) {
    const checkpoint *ck = &m->ck;
    const json_t *cfg = m->cfg;
    /* transformers 5 writes rope_theta and the scaling type into one rope_parameters
     * block; older configs have rope_theta and rope_scaling at the top level. */
    const json_t *params = json_object_get(cfg, "rope_parameters");
    const json_t *scaling = json_object_get(cfg, "rope_scaling");
    if (!json_is_object(params)) params = NULL;
    if ((!scaling || json_is_null(scaling)) && params) scaling = params;
    double theta;
    celer_status s = config_num(ck, params ? params : cfg, "rope_theta", 10000.0, &theta, e);
    if (s != CELER_OK) return s;
    return model_rope_from(m, scaling, theta, m->dims.hd, traditional, out, e);
}

celer_status model_read_dims(celer_model *m, celer_error *e) {
    const checkpoint *ck = &m->ck;
    const json_t *cfg = m->cfg;
    model_dims *dm = &m->dims;
    celer_status s;
    if ((s = config_pos_int(ck, cfg, "hidden_size", &dm->d, e)) != CELER_OK ||
        (s = config_pos_int(ck, cfg, "intermediate_size", &dm->f, e)) != CELER_OK ||
        (s = config_pos_int(ck, cfg, "num_attention_heads", &dm->h, e)) != CELER_OK ||
        (s = config_pos_int(ck, cfg, "num_hidden_layers", &dm->n_layer, e)) != CELER_OK ||
        (s = config_pos_int(ck, cfg, "vocab_size", &dm->v, e)) != CELER_OK ||
        (s = config_int(ck, cfg, "num_key_value_heads", dm->h, &dm->hk, e)) != CELER_OK ||
        (s = config_int(ck, cfg, "head_dim", dm->d / dm->h, &dm->hd, e)) != CELER_OK ||
        (s = config_int(ck, cfg, "max_position_embeddings", 4096, &dm->n_ctx_train, e)) != CELER_OK)
        return s;
    if (dm->hk <= 0 || dm->h % dm->hk != 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: num_key_value_heads: expected a divisor of num_attention_heads %lld, "
                         "found %lld",
                         ck->config_path, (long long)dm->h, (long long)dm->hk);
    if (dm->hd <= 0 || dm->hd % 2 != 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: head_dim: expected a positive even number, found %lld",
                         ck->config_path, (long long)dm->hd);
    return CELER_OK;
}
