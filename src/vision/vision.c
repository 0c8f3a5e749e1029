/*
 * vision.c - image preprocessing (see vision.h): resampling, LLaVA-NeXT's anyres layout and
 * tiles, Gemma 3's pan-and-scan crops, normalization, LLaVA-NeXT's prompt feature count, and
 * the preprocessor config loader.
 *
 * Every size computation follows the Python it replicates, operation for operation and in
 * the same floating type (Python floats are doubles; torch's normalize runs in float32), so
 * that truncations and roundings land on the same integers. The file does not decode images
 * (src/io/image.c) and does not run any model.
 */
#define _POSIX_C_SOURCE 200809L
#include "vision/vision.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* No intermediate image may be larger than this per side (a config asking for more is
 * refused rather than allocated). */
#define VISION_MAX_SIDE IMAGE_MAX_SIDE
/* ... nor hold more pixels than this (16 Mpixel; llava-v1.6 needs 5 x 336 x 336 in all). */
#define VISION_MAX_PIXELS ((int64_t)16 * 1024 * 1024)
#define VISION_MAX_TILES  1024

/* ==== Resampling (torch's uint8 antialiased kernel) ==== */

/* Keys' cubic with a = -0.5 (PIL and torch with antialias), written as torch writes it. */
static double filter_cubic(double x) {
    const double a = -0.5;
    if (x < 0) x = -x;
    if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0.0;
}

static double filter_linear(double x) {
    if (x < 0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* One axis: for each output index, the first input index, the number of taps and the taps
 * as integers scaled by 2^precision. */
typedef struct resample_axis {
    int64_t *xmin, *xsize;
    int32_t *w; /* [n_out, ksize] */
    int64_t ksize;
    int precision;
} resample_axis;

static void resample_axis_free(resample_axis *a) {
    free(a->xmin), free(a->xsize), free(a->w);
    memset(a, 0, sizeof *a);
}

static celer_status resample_axis_init(resample_axis *a, int64_t n_in, int64_t n_out,
                                       vision_resample filter, celer_error *e) {
    memset(a, 0, sizeof *a);
    const int interp_size = filter == VISION_RESAMPLE_BICUBIC ? 4 : 2;
    double (*fn)(double) = filter == VISION_RESAMPLE_BICUBIC ? filter_cubic : filter_linear;
    const double scale = (double)n_in / (double)n_out;
    const double support = scale >= 1.0 ? (interp_size * 0.5) * scale : interp_size * 0.5;
    a->ksize = (int64_t)ceil(support) * 2 + 1;
    double *wd = malloc(sizeof *wd * (size_t)(n_out * a->ksize));
    a->xmin = malloc(sizeof *a->xmin * (size_t)n_out);
    a->xsize = malloc(sizeof *a->xsize * (size_t)n_out);
    a->w = malloc(sizeof *a->w * (size_t)(n_out * a->ksize));
    if (!wd || !a->xmin || !a->xsize || !a->w) {
        free(wd);
        resample_axis_free(a);
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "resize: out of memory for weights");
    }
    double wt_max = 0.0;
    for (int64_t i = 0; i < n_out; i++) {
        double *w = wd + i * a->ksize;
        const double center = scale * ((double)i + 0.5);
        const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
        int64_t xmin = (int64_t)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int64_t xmax = (int64_t)(center + support + 0.5);
        if (xmax > n_in) xmax = n_in;
        int64_t xsize = xmax - xmin;
        if (xsize < 0) xsize = 0;
        if (xsize > a->ksize) xsize = a->ksize;
        double total = 0.0;
        int64_t j = 0;
        for (; j < xsize; j++) {
            w[j] = fn(((double)(j + xmin) - center + 0.5) * invscale);
            total += w[j];
        }
        if (total != 0.0)
            for (j = 0; j < xsize; j++) {
                w[j] /= total;
                if (w[j] > wt_max) wt_max = w[j];
            }
        for (; j < a->ksize; j++) w[j] = 0.0;
        a->xmin[i] = xmin;
        a->xsize[i] = xsize;
    }
    /* The most bits that keep the largest weight inside int16. */
    int p = 0;
    for (p = 0; p < 22; p++)
        if ((int)(0.5 + wt_max * (double)(1 << (p + 1))) >= (1 << 15)) break;
    a->precision = p;
    for (int64_t k = 0; k < n_out * a->ksize; k++) {
        double v = wd[k] * (double)(1 << p);
        a->w[k] = v < 0 ? (int32_t)(int16_t)(int)(-0.5 + v) : (int32_t)(int16_t)(int)(0.5 + v);
    }
    free(wd);
    return CELER_OK;
}

static inline uint8_t clamp_u8(int32_t v) {
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* dst[rows, n_out, c] from src[rows, n_in, c] along the row. */
static void resample_horizontal(uint8_t *dst, const uint8_t *src, int64_t rows, int64_t n_in,
                                int64_t n_out, int c, const resample_axis *a) {
    const int32_t half = (int32_t)1 << (a->precision - 1);
    for (int64_t y = 0; y < rows; y++) {
        const uint8_t *s = src + y * n_in * c;
        uint8_t *d = dst + y * n_out * c;
        for (int64_t x = 0; x < n_out; x++) {
            const int32_t *w = a->w + x * a->ksize;
            const uint8_t *p = s + a->xmin[x] * c;
            for (int ch = 0; ch < c; ch++) {
                int32_t acc = half;
                for (int64_t j = 0; j < a->xsize[x]; j++) acc += (int32_t)p[j * c + ch] * w[j];
                d[x * c + ch] = clamp_u8(acc >> a->precision);
            }
        }
    }
}

/* dst[n_out, cols, c] from src[n_in, cols, c] down the columns. */
static void resample_vertical(uint8_t *dst, const uint8_t *src, int64_t cols, int64_t n_out, int c,
                              const resample_axis *a) {
    const int32_t half = (int32_t)1 << (a->precision - 1);
    const int64_t stride = cols * c;
    for (int64_t y = 0; y < n_out; y++) {
        const int32_t *w = a->w + y * a->ksize;
        const uint8_t *s = src + a->xmin[y] * stride;
        uint8_t *d = dst + y * stride;
        for (int64_t k = 0; k < stride; k++) {
            int32_t acc = half;
            for (int64_t j = 0; j < a->xsize[y]; j++) acc += (int32_t)s[j * stride + k] * w[j];
            d[k] = clamp_u8(acc >> a->precision);
        }
    }
}

celer_status vision_resize_u8(uint8_t *dst, int64_t dw, int64_t dh, const uint8_t *src, int64_t sw,
                              int64_t sh, int c, vision_resample filter, celer_error *e) {
    CELER_ASSERT(dw > 0 && dh > 0 && sw > 0 && sh > 0 && c > 0);
    if (dw == sw && dh == sh) {
        memcpy(dst, src, (size_t)(dw * dh * c));
        return CELER_OK;
    }
    celer_status s = CELER_OK;
    resample_axis ax = {0}, ay = {0};
    uint8_t *tmp = NULL;
    const uint8_t *rows = src; /* the horizontal pass's result, or src when skipped */
    if (dw != sw) {
        if ((s = resample_axis_init(&ax, sw, dw, filter, e)) != CELER_OK) goto out;
        uint8_t *h_out = dst;
        if (dh != sh) {
            if (!(tmp = malloc((size_t)(sh * dw * c)))) {
                s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "resize: out of memory");
                goto out;
            }
            h_out = tmp;
        }
        resample_horizontal(h_out, src, sh, sw, dw, c, &ax);
        rows = h_out;
    }
    if (dh != sh) {
        if ((s = resample_axis_init(&ay, sh, dh, filter, e)) != CELER_OK) goto out;
        resample_vertical(dst, rows, dw, dh, c, &ay);
    }
out:
    free(tmp);
    resample_axis_free(&ax);
    resample_axis_free(&ay);
    return s;
}

/* ==== Layout ==== */

void vision_config_default(vision_config *cfg) {
    static const int64_t pins[][2] = {{336, 672}, {672, 336}, {672, 672}, {1008, 336}, {336, 1008}};
    memset(cfg, 0, sizeof *cfg);
    cfg->do_resize = cfg->do_center_crop = cfg->do_rescale = cfg->do_normalize = true;
    cfg->size_shortest_edge = 224;
    cfg->crop_h = cfg->crop_w = 224;
    cfg->resample = VISION_RESAMPLE_BICUBIC;
    cfg->rescale_factor = 1.0 / 255.0;
    const double mean[3] = {0.48145466, 0.4578275, 0.40821073};
    const double std[3] = {0.26862954, 0.26130258, 0.27577711};
    memcpy(cfg->image_mean, mean, sizeof mean);
    memcpy(cfg->image_std, std, sizeof std);
    cfg->n_pinpoints = 5;
    memcpy(cfg->pinpoints, pins, sizeof pins);
    cfg->strategy = VISION_FEATURES_DEFAULT;
    cfg->pas_min_crop = 256, cfg->pas_max_crops = 4, cfg->pas_min_ratio = 1.2;
}

void vision_config_default_gemma3(vision_config *cfg) {
    vision_config_default(cfg);
    cfg->kind = VISION_GEMMA3;
    cfg->do_center_crop = false;
    cfg->size_shortest_edge = 0;
    cfg->size_h = cfg->size_w = cfg->crop_h = cfg->crop_w = 224;
    cfg->resample = VISION_RESAMPLE_BILINEAR;
    for (int c = 0; c < 3; c++) cfg->image_mean[c] = cfg->image_std[c] = 0.5;
    cfg->n_pinpoints = 0;
}

celer_status vision_config_check(const vision_config *cfg, const char *label, celer_error *e) {
    const int64_t m = VISION_MAX_SIDE;
    const bool size_se = cfg->size_shortest_edge > 0 && cfg->size_shortest_edge <= m &&
                         cfg->size_h == 0 && cfg->size_w == 0;
    const bool size_hw = cfg->size_shortest_edge == 0 && cfg->size_h > 0 && cfg->size_h <= m &&
                         cfg->size_w > 0 && cfg->size_w <= m;
    if (!size_se && !size_hw)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: size: expected shortest_edge, or height and width, "
                         "in 1..%lld; found shortest_edge %lld, height %lld, width %lld",
                         label, (long long)m, (long long)cfg->size_shortest_edge,
                         (long long)cfg->size_h, (long long)cfg->size_w);
    if (cfg->crop_h <= 0 || cfg->crop_w <= 0 || cfg->crop_h > m || cfg->crop_w > m)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: crop_size: expected height and width in 1..%lld, "
                         "found %lldx%lld",
                         label, (long long)m, (long long)cfg->crop_h, (long long)cfg->crop_w);
    if (cfg->resample != VISION_RESAMPLE_BICUBIC && cfg->resample != VISION_RESAMPLE_BILINEAR)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: resample: expected 2 (bilinear) or 3 (bicubic), "
                         "found %d",
                         label, (int)cfg->resample);
    if (!(cfg->rescale_factor > 0) || !isfinite(cfg->rescale_factor))
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: rescale_factor: expected a positive number, found %g", label,
                         cfg->rescale_factor);
    for (int i = 0; i < 3; i++)
        if (cfg->image_std[i] == 0 || !isfinite(cfg->image_std[i]) || !isfinite(cfg->image_mean[i]))
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "%s: image_std[%d] = %g, image_mean[%d] = %g: "
                             "expected finite values and a nonzero std",
                             label, i, cfg->image_std[i], i, cfg->image_mean[i]);
    if (cfg->kind == VISION_GEMMA3) {
        if (!size_hw || !cfg->do_resize || cfg->do_center_crop)
            return error_set(e, CELER_STATUS_UNSUPPORTED,
                             "%s: Gemma3ImageProcessor: expected do_resize to a size of height and "
                             "width, and no "
                             "center crop",
                             label);
        if (cfg->pas_min_crop <= 0 || cfg->pas_max_crops < 1 ||
            cfg->pas_max_crops >= VISION_MAX_TILES || !(cfg->pas_min_ratio > 0) ||
            !isfinite(cfg->pas_min_ratio))
            return error_set(
                e, CELER_STATUS_BAD_CONFIG,
                "%s: pan_and_scan_min_crop_size %lld, pan_and_scan_max_num_crops %lld, "
                "pan_and_scan_min_ratio_to_activate %g: expected a positive size, 1..%d crops and "
                "a "
                "positive ratio",
                label, (long long)cfg->pas_min_crop, (long long)cfg->pas_max_crops,
                cfg->pas_min_ratio, VISION_MAX_TILES - 1);
        return CELER_OK;
    }
    if (cfg->n_pinpoints < 1 || cfg->n_pinpoints > VISION_MAX_PINPOINTS)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: image_grid_pinpoints: expected 1..%d resolutions, "
                         "found %d",
                         label, VISION_MAX_PINPOINTS, cfg->n_pinpoints);
    for (int i = 0; i < cfg->n_pinpoints; i++) {
        int64_t h = cfg->pinpoints[i][0], w = cfg->pinpoints[i][1];
        if (h <= 0 || w <= 0 || h > m || w > m)
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "%s: image_grid_pinpoints[%d] = [%lld, %lld]: expected "
                             "a height and width in 1..%lld",
                             label, i, (long long)h, (long long)w, (long long)m);
        if (h * w > VISION_MAX_PIXELS)
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "%s: image_grid_pinpoints[%d] = [%lld, %lld]: more than %lld pixels",
                             label, i, (long long)h, (long long)w, (long long)VISION_MAX_PIXELS);
        int64_t tiles =
            ((h + cfg->crop_h - 1) / cfg->crop_h) * ((w + cfg->crop_h - 1) / cfg->crop_h);
        if (tiles > VISION_MAX_TILES)
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "%s: image_grid_pinpoints[%d] = [%lld, %lld] makes "
                             "%lld tiles of %lld, at most %d",
                             label, i, (long long)h, (long long)w, (long long)tiles,
                             (long long)cfg->crop_h, VISION_MAX_TILES);
    }
    if (cfg->patch_size < 0 || cfg->patch_size > m || cfg->num_additional_image_tokens < 0 ||
        cfg->num_additional_image_tokens > m)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: patch_size %lld, num_additional_image_tokens %lld: expected "
                         "values in 0..%lld",
                         label, (long long)cfg->patch_size,
                         (long long)cfg->num_additional_image_tokens, (long long)m);
    return CELER_OK;
}

celer_status vision_best_resolution(int64_t *best_h, int64_t *best_w, const vision_config *cfg,
                                    int64_t image_h, int64_t image_w, celer_error *e) {
    int64_t max_eff = 0;
    double min_wasted = INFINITY;
    int best = -1;
    for (int i = 0; i < cfg->n_pinpoints; i++) {
        const int64_t h = cfg->pinpoints[i][0], w = cfg->pinpoints[i][1];
        const double sw = (double)w / (double)image_w, sh = (double)h / (double)image_h;
        const double scale = sw < sh ? sw : sh;
        const int64_t dw = (int64_t)((double)image_w * scale);
        const int64_t dh = (int64_t)((double)image_h * scale);
        int64_t eff = dw * dh;
        if (eff > image_w * image_h) eff = image_w * image_h;
        const double wasted = (double)(w * h - eff);
        if (eff > max_eff || (eff == max_eff && wasted < min_wasted)) {
            max_eff = eff;
            min_wasted = wasted;
            best = i;
        }
    }
    if (best < 0 || max_eff == 0)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "image %lldx%lld: every image_grid_pinpoints entry scales it to nothing",
                         (long long)image_w, (long long)image_h);
    *best_h = cfg->pinpoints[best][0];
    *best_w = cfg->pinpoints[best][1];
    return CELER_OK;
}

/* transformers' get_patch_output_size: fit (h, w) into (th, tw), aspect kept. */
static void patch_output_size(int64_t *nh, int64_t *nw, int64_t h, int64_t w, int64_t th,
                              int64_t tw) {
    const double scale_w = (double)tw / (double)w, scale_h = (double)th / (double)h;
    if (scale_w < scale_h) {
        *nw = tw;
        int64_t v = (int64_t)ceil((double)h * scale_w);
        *nh = v < th ? v : th;
    } else {
        *nh = th;
        int64_t v = (int64_t)ceil((double)w * scale_h);
        *nw = v < tw ? v : tw;
    }
}

/* The size do_resize gives an h x w image (TorchvisionBackend.resize with cfg's size). */
static void resize_target(int64_t *nh, int64_t *nw, const vision_config *cfg, int64_t h,
                          int64_t w) {
    if (!cfg->size_shortest_edge) {
        *nh = cfg->size_h, *nw = cfg->size_w;
        return;
    }
    const int64_t s = cfg->size_shortest_edge;
    const int64_t shorter = w <= h ? w : h, longer = w <= h ? h : w;
    const int64_t new_long = (int64_t)((double)(s * longer) / (double)shorter);
    if (w <= h)
        *nw = s, *nh = new_long;
    else
        *nh = s, *nw = new_long;
}

/* Final size of an h x w piece after do_resize and do_center_crop. */
static void piece_output_size(int64_t *oh, int64_t *ow, const vision_config *cfg, int64_t h,
                              int64_t w) {
    if (cfg->do_resize) resize_target(&h, &w, cfg, h, w);
    if (cfg->do_center_crop) h = cfg->crop_h, w = cfg->crop_w;
    *oh = h, *ow = w;
}

/* Gemma3ImageProcessor.pan_and_scan_batched's crops of an h x w image: their rows and
 * columns and each one's size (none: 0). Python's float division and floor as it runs them. */
static void pan_and_scan(vision_layout *lay, const vision_config *cfg, int64_t h, int64_t w) {
    lay->grid_rows = lay->grid_cols = lay->crop_h = lay->crop_w = 0;
    if (!cfg->do_pan_and_scan) return;
    const bool landscape = w >= h;
    const int64_t longer = landscape ? w : h, shorter = landscape ? h : w;
    const double ratio = (double)longer / (double)shorter;
    if (ratio < cfg->pas_min_ratio) return;
    int64_t n = (int64_t)floor(ratio + 0.5);
    const int64_t by_size = (int64_t)floor((double)longer / (double)cfg->pas_min_crop);
    if (by_size < n) n = by_size;
    if (n < 2) n = 2;
    if (n > cfg->pas_max_crops) n = cfg->pas_max_crops;
    const int64_t nh = landscape ? 1 : n, nw = landscape ? n : 1;
    const int64_t ch = (int64_t)ceil((double)h / (double)nh),
                  cw = (int64_t)ceil((double)w / (double)nw);
    if ((ch < cw ? ch : cw) < cfg->pas_min_crop) return;
    lay->grid_rows = nh, lay->grid_cols = nw, lay->crop_h = ch, lay->crop_w = cw;
}

celer_status vision_layout_compute(vision_layout *lay, const vision_config *cfg, int64_t image_h,
                                   int64_t image_w, celer_error *e) {
    memset(lay, 0, sizeof *lay);
    celer_status s = vision_config_check(cfg, "image processor", e);
    if (s != CELER_OK) return s;
    if (image_h <= 0 || image_w <= 0 || image_h > IMAGE_MAX_SIDE || image_w > IMAGE_MAX_SIDE)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "image size %lldx%lld: expected 1..%d per side", (long long)image_w,
                         (long long)image_h, IMAGE_MAX_SIDE);
    lay->image_h = image_h, lay->image_w = image_w;
    if (cfg->kind == VISION_GEMMA3) {
        pan_and_scan(lay, cfg, image_h, image_w);
        lay->n_tiles = 1 + lay->grid_rows * lay->grid_cols;
        lay->out_h = cfg->size_h, lay->out_w = cfg->size_w;
        if (lay->n_tiles * lay->out_h * lay->out_w > VISION_MAX_PIXELS)
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "image processor: %lld pieces of %lldx%lld exceed %lld pixels",
                             (long long)lay->n_tiles, (long long)lay->out_w, (long long)lay->out_h,
                             (long long)VISION_MAX_PIXELS);
        return CELER_OK;
    }
    if ((s = vision_best_resolution(&lay->best_h, &lay->best_w, cfg, image_h, image_w, e)) !=
        CELER_OK)
        return s;
    patch_output_size(&lay->resized_h, &lay->resized_w, image_h, image_w, lay->best_h, lay->best_w);
    lay->pad_top = (lay->best_h - lay->resized_h) / 2;
    lay->pad_left = (lay->best_w - lay->resized_w) / 2;
    lay->tile = cfg->crop_h;
    lay->grid_rows = (lay->best_h + lay->tile - 1) / lay->tile;
    lay->grid_cols = (lay->best_w + lay->tile - 1) / lay->tile;
    lay->n_tiles = 1 + lay->grid_rows * lay->grid_cols;
    /* torch.stack needs one shape: the base image and every tile (the last row and column
     * may be partial) must come out the same size, and no step may exceed the side limit. */
    int64_t bh = cfg->size_shortest_edge ? cfg->size_shortest_edge : cfg->size_h;
    int64_t bw = cfg->size_shortest_edge ? cfg->size_shortest_edge : cfg->size_w;
    piece_output_size(&lay->out_h, &lay->out_w, cfg, bh, bw);
    for (int k = 0; k < 4; k++) {
        int64_t th = k & 1 ? lay->best_h - (lay->grid_rows - 1) * lay->tile : lay->tile;
        int64_t tw = k & 2 ? lay->best_w - (lay->grid_cols - 1) * lay->tile : lay->tile;
        if (th > lay->best_h) th = lay->best_h;
        if (tw > lay->best_w) tw = lay->best_w;
        int64_t rh = th, rw = tw, oh, ow;
        if (cfg->do_resize) resize_target(&rh, &rw, cfg, th, tw);
        piece_output_size(&oh, &ow, cfg, th, tw);
        if (rh <= 0 || rw <= 0 || rh > VISION_MAX_SIDE || rw > VISION_MAX_SIDE ||
            rh * rw > VISION_MAX_PIXELS)
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "image processor: a %lldx%lld tile resizes to %lldx%lld, outside "
                             "1..%d per side or above %lld pixels",
                             (long long)tw, (long long)th, (long long)rw, (long long)rh,
                             VISION_MAX_SIDE, (long long)VISION_MAX_PIXELS);
        if (oh != lay->out_h || ow != lay->out_w)
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "image processor: tiles come out %lldx%lld but the base image "
                             "%lldx%lld (size, crop_size and do_* flags disagree)",
                             (long long)ow, (long long)oh, (long long)lay->out_w,
                             (long long)lay->out_h);
    }
    if (bh * bw > VISION_MAX_PIXELS || lay->n_tiles * lay->out_h * lay->out_w > VISION_MAX_PIXELS)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "image processor: a %lldx%lld base image and %lld pieces of %lldx%lld "
                         "exceed %lld pixels",
                         (long long)bw, (long long)bh, (long long)lay->n_tiles,
                         (long long)lay->out_w, (long long)lay->out_h,
                         (long long)VISION_MAX_PIXELS);
    return CELER_OK;
}

/* ==== Preprocessing ==== */

/* One piece src[h, w, 3] (uint8) -> resize -> center crop -> float32 [3, out_h, out_w]. */
static celer_status process_piece(float *out, const vision_config *cfg, const uint8_t *src,
                                  int64_t h, int64_t w, celer_error *e) {
    celer_status s = CELER_OK;
    uint8_t *resized = NULL;
    const uint8_t *p = src;
    if (cfg->do_resize) {
        int64_t nh, nw;
        resize_target(&nh, &nw, cfg, h, w);
        if (nh != h || nw != w) {
            if (!(resized = malloc((size_t)(nh * nw * 3)))) {
                s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "preprocess: out of memory");
                goto out;
            }
            if ((s = vision_resize_u8(resized, nw, nh, src, w, h, 3, cfg->resample, e)) != CELER_OK)
                goto out;
            p = resized, h = nh, w = nw;
        }
    }
    /* Center crop (zero padding first when the crop is larger), as TorchvisionBackend. */
    int64_t oh = h, ow = w, top = 0, left = 0;
    if (cfg->do_center_crop) {
        oh = cfg->crop_h, ow = cfg->crop_w;
        int64_t ph = h, pw = w, pad_t = 0, pad_l = 0;
        if (ow > w || oh > h) {
            pad_l = ow > w ? (ow - w) / 2 : 0;
            pad_t = oh > h ? (oh - h) / 2 : 0;
            pw = ow > w ? w + pad_l + (ow - w + 1) / 2 : w;
            ph = oh > h ? h + pad_t + (oh - h + 1) / 2 : h;
        }
        /* Crop origin in padded coordinates, then shifted into src's. */
        top = (int64_t)((double)(ph - oh) / 2.0) - pad_t;
        left = (int64_t)((double)(pw - ow) / 2.0) - pad_l;
    }
    /* Rescale and normalize, fused as transformers fuses them when both are on. */
    float mean[3], std[3], scale = (float)cfg->rescale_factor;
    for (int c = 0; c < 3; c++) {
        mean[c] = (float)cfg->image_mean[c];
        std[c] = (float)cfg->image_std[c];
        if (cfg->do_rescale && cfg->do_normalize) {
            const float inv = (float)(1.0 / cfg->rescale_factor);
            mean[c] = mean[c] * inv;
            std[c] = std[c] * inv;
        }
    }
    for (int c = 0; c < 3; c++)
        for (int64_t y = 0; y < oh; y++)
            for (int64_t x = 0; x < ow; x++) {
                const int64_t sy = y + top, sx = x + left;
                const uint8_t v =
                    sy >= 0 && sy < h && sx >= 0 && sx < w ? p[(sy * w + sx) * 3 + c] : 0;
                float f = (float)v;
                if (cfg->do_normalize)
                    f = (f - mean[c]) / std[c]; /* sub_ then div_ */
                else if (cfg->do_rescale) {
                    f = f * scale;
                }
                out[(c * oh + y) * ow + x] = f;
            }
out:
    free(resized);
    return s;
}

/* Gemma 3: the whole image, then each pan-and-scan crop (row-major), through process_piece
 * (resize to size, rescale, normalize) into px[n_tiles, 3, out_h, out_w]. */
static celer_status preprocess_gemma3(float *px, const vision_layout *lay, const vision_config *cfg,
                                      const image_rgb *img, celer_error *e) {
    const int64_t plane = 3 * lay->out_h * lay->out_w, w = img->width, h = img->height;
    celer_status s = process_piece(px, cfg, img->data, h, w, e);
    if (s != CELER_OK || lay->n_tiles == 1) return s;
    uint8_t *crop = malloc((size_t)(lay->crop_h * lay->crop_w * 3));
    if (!crop)
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "preprocess: out of memory for a crop");
    for (int64_t r = 0; r < lay->grid_rows && s == CELER_OK; r++)
        for (int64_t c = 0; c < lay->grid_cols && s == CELER_OK; c++) {
            const int64_t y0 = r * lay->crop_h, x0 = c * lay->crop_w;
            const int64_t ch = h - y0 < lay->crop_h ? h - y0 : lay->crop_h,
                          cw = w - x0 < lay->crop_w ? w - x0 : lay->crop_w;
            for (int64_t y = 0; y < ch; y++)
                memcpy(crop + y * cw * 3, img->data + ((y0 + y) * w + x0) * 3, (size_t)(cw * 3));
            s = process_piece(px + (1 + r * lay->grid_cols + c) * plane, cfg, crop, ch, cw, e);
        }
    free(crop);
    return s;
}

celer_status vision_preprocess(float **pixel_values, vision_layout *lay, const vision_config *cfg,
                               const image_rgb *img, celer_error *e) {
    *pixel_values = NULL;
    celer_status s = vision_layout_compute(lay, cfg, img->height, img->width, e);
    if (s != CELER_OK) return s;
    if (cfg->kind == VISION_GEMMA3) {
        float *px = malloc(sizeof *px * (size_t)(lay->n_tiles * 3 * lay->out_h * lay->out_w));
        if (!px)
            return error_set(e, CELER_STATUS_OUT_OF_MEMORY,
                             "preprocess: out of memory for %lld tiles", (long long)lay->n_tiles);
        if ((s = preprocess_gemma3(px, lay, cfg, img, e)) != CELER_OK) {
            free(px);
            return s;
        }
        *pixel_values = px;
        return CELER_OK;
    }
    const int64_t bh = cfg->size_shortest_edge ? cfg->size_shortest_edge : cfg->size_h;
    const int64_t bw = cfg->size_shortest_edge ? cfg->size_shortest_edge : cfg->size_w;
    const int64_t plane = 3 * lay->out_h * lay->out_w, t = lay->tile;
    float *px = malloc(sizeof *px * (size_t)(lay->n_tiles * plane));
    uint8_t *base = malloc((size_t)(bh * bw * 3));
    uint8_t *resized = malloc((size_t)(lay->resized_h * lay->resized_w * 3));
    uint8_t *padded = calloc((size_t)(lay->best_h * lay->best_w * 3), 1);
    uint8_t *tile = malloc((size_t)(t * t * 3));
    if (!px || !base || !resized || !padded || !tile) {
        s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "preprocess: out of memory for %lld tiles",
                      (long long)lay->n_tiles);
        goto out;
    }
    /* The base image: the whole picture at size. */
    if ((s = vision_resize_u8(base, bw, bh, img->data, img->width, img->height, 3, cfg->resample,
                              e)) != CELER_OK ||
        (s = process_piece(px, cfg, base, bh, bw, e)) != CELER_OK)
        goto out;
    /* The tiles: resize into the pinpoint, pad with zeros, cut row-major. */
    if ((s = vision_resize_u8(resized, lay->resized_w, lay->resized_h, img->data, img->width,
                              img->height, 3, cfg->resample, e)) != CELER_OK)
        goto out;
    for (int64_t y = 0; y < lay->resized_h; y++)
        memcpy(padded + ((y + lay->pad_top) * lay->best_w + lay->pad_left) * 3,
               resized + y * lay->resized_w * 3, (size_t)(lay->resized_w * 3));
    for (int64_t r = 0; r < lay->grid_rows; r++)
        for (int64_t c = 0; c < lay->grid_cols; c++) {
            const int64_t y0 = r * t, x0 = c * t;
            const int64_t th = lay->best_h - y0 < t ? lay->best_h - y0 : t;
            const int64_t tw = lay->best_w - x0 < t ? lay->best_w - x0 : t;
            for (int64_t y = 0; y < th; y++)
                memcpy(tile + y * tw * 3, padded + ((y0 + y) * lay->best_w + x0) * 3,
                       (size_t)(tw * 3));
            float *dst = px + (1 + r * lay->grid_cols + c) * plane;
            if ((s = process_piece(dst, cfg, tile, th, tw, e)) != CELER_OK) goto out;
        }
    *pixel_values = px;
    px = NULL;
out:
    free(px), free(base), free(resized), free(padded), free(tile);
    return s;
}

/* ==== Prompt arithmetic ==== */

/* Python's int(round(x, 7)) for x >= 0: x rounded to 7 decimals, then truncated. */
static int64_t int_round7(double x) {
    const double fl = floor(x);
    return (int64_t)fl + (x - fl >= 1.0 - 0.5e-7 ? 1 : 0);
}

/* Python's v // 2 (floors for negative v too). */
static int64_t floor_half(int64_t v) {
    return v >= 0 ? v / 2 : -((1 - v) / 2);
}

celer_status vision_feature_count(vision_features *f, const vision_config *cfg, int64_t image_h,
                                  int64_t image_w, celer_error *e) {
    memset(f, 0, sizeof *f);
    vision_layout lay;
    celer_status s = vision_layout_compute(&lay, cfg, image_h, image_w, e);
    if (s != CELER_OK) return s;
    if (cfg->patch_size <= 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "processor: patch_size is unknown (expected it in processor_config.json "
                         "or config.json's vision_config)");
    const int64_t height = lay.out_h, width = lay.out_w;
    f->grid_rows = lay.best_h / height;
    f->grid_cols = lay.best_w / width;
    f->patches_h = height / cfg->patch_size;
    f->patches_w = width / cfg->patch_size;
    int64_t cur_h = f->patches_h * f->grid_rows, cur_w = f->patches_w * f->grid_cols;
    if (cur_h <= 0 || cur_w <= 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "processor: a %lldx%lld tile with patch_size %lld leaves no features",
                         (long long)width, (long long)height, (long long)cfg->patch_size);
    const double original_aspect = (double)image_w / (double)image_h;
    const double current_aspect = (double)cur_w / (double)cur_h;
    if (original_aspect > current_aspect) {
        const int64_t new_h = int_round7((double)image_h * ((double)cur_w / (double)image_w));
        cur_h -= floor_half(cur_h - new_h) * 2;
    } else {
        const int64_t new_w = int_round7((double)image_w * ((double)cur_h / (double)image_h));
        cur_w -= floor_half(cur_w - new_w) * 2;
    }
    f->unpadded_h = cur_h;
    f->unpadded_w = cur_w;
    f->n_unpadded = cur_h * cur_w;
    f->n_newline = cur_h;
    f->n_base = f->patches_h * f->patches_w + cfg->num_additional_image_tokens;
    f->n_tokens = f->n_unpadded + f->n_newline + f->n_base -
                  (cfg->strategy == VISION_FEATURES_DEFAULT ? 1 : 0);
    return CELER_OK;
}

/* ==== Config loading ==== */

/* A non-negative integer that fits the side limit, or -1. */
static int64_t json_size(const json_t *j) {
    if (!json_is_integer(j)) return -1;
    json_int_t v = json_integer_value(j);
    return v < 0 || v > VISION_MAX_SIDE ? -1 : (int64_t)v;
}

static celer_status parse_bool(bool *out, const json_t *root, const char *key, const char *label,
                               celer_error *e) {
    const json_t *j = json_object_get(root, key);
    if (!j || json_is_null(j)) return CELER_OK;
    if (!json_is_boolean(j))
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: %s: expected true or false", label, key);
    *out = json_is_true(j);
    return CELER_OK;
}

/* size / crop_size: an integer, or {"shortest_edge": n} or {"height": h, "width": w}. */
static celer_status parse_size(int64_t *se, int64_t *h, int64_t *w, const json_t *root,
                               const char *key, bool allow_shortest, const char *label,
                               celer_error *e) {
    const json_t *j = json_object_get(root, key);
    if (!j || json_is_null(j)) return CELER_OK;
    int64_t vse = 0, vh = 0, vw = 0;
    if (json_is_integer(j)) {
        vse = json_size(j);
        if (vse <= 0) goto bad;
        if (!allow_shortest) vh = vw = vse, vse = 0;
    } else if (json_is_object(j)) {
        const json_t *jse = json_object_get(j, "shortest_edge");
        const json_t *jh = json_object_get(j, "height"), *jw = json_object_get(j, "width");
        if (jh && !json_is_null(jh) && jw && !json_is_null(jw)) {
            vh = json_size(jh), vw = json_size(jw);
            if (vh <= 0 || vw <= 0) goto bad;
        } else if (allow_shortest && jse && !json_is_null(jse)) {
            vse = json_size(jse);
            if (vse <= 0) goto bad;
        } else {
            goto bad;
        }
    } else {
        goto bad;
    }
    if (se) *se = vse;
    *h = vh, *w = vw;
    return CELER_OK;
bad:
    return error_set(e, CELER_STATUS_BAD_CONFIG,
                     "%s: %s: expected %s{\"height\": H, \"width\": W} with sizes in 1..%d", label,
                     key, allow_shortest ? "{\"shortest_edge\": N} or " : "", VISION_MAX_SIDE);
}

/* image_mean / image_std: three numbers, or one for all channels. */
static celer_status parse_triple(double out[3], const json_t *root, const char *key,
                                 const char *label, celer_error *e) {
    const json_t *j = json_object_get(root, key);
    if (!j || json_is_null(j)) return CELER_OK;
    if (json_is_number(j)) {
        out[0] = out[1] = out[2] = json_number_value(j);
        return CELER_OK;
    }
    if (json_is_array(j) && json_array_size(j) == 3) {
        double v[3];
        for (size_t i = 0; i < 3; i++) {
            const json_t *x = json_array_get(j, i);
            if (!json_is_number(x)) goto bad;
            v[i] = json_number_value(x);
        }
        memcpy(out, v, sizeof v);
        return CELER_OK;
    }
bad:
    return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: %s: expected an array of 3 numbers", label,
                     key);
}

/* [[h, w], ...] into pins; n gets the count. */
static celer_status parse_pinpoints(int64_t pins[][2], int *n, const json_t *j, const char *label,
                                    celer_error *e) {
    if (!json_is_array(j) || json_array_size(j) < 1 || json_array_size(j) > VISION_MAX_PINPOINTS)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: image_grid_pinpoints: expected an array of 1..%d [height, width] "
                         "pairs",
                         label, VISION_MAX_PINPOINTS);
    for (size_t i = 0; i < json_array_size(j); i++) {
        const json_t *p = json_array_get(j, i);
        int64_t h = -1, w = -1;
        if (json_is_array(p) && json_array_size(p) == 2)
            h = json_size(json_array_get(p, 0)), w = json_size(json_array_get(p, 1));
        if (h <= 0 || w <= 0)
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "%s: image_grid_pinpoints[%zu]: expected [height, width] with sizes "
                             "in 1..%d",
                             label, i, VISION_MAX_SIDE);
        pins[i][0] = h, pins[i][1] = w;
    }
    *n = (int)json_array_size(j);
    return CELER_OK;
}

static celer_status parse_strategy(vision_feature_strategy *out, const json_t *root,
                                   const char *label, celer_error *e) {
    const json_t *j = json_object_get(root, "vision_feature_select_strategy");
    if (!j || json_is_null(j)) return CELER_OK;
    const char *v = json_string_value(j);
    if (v && !strcmp(v, "default"))
        *out = VISION_FEATURES_DEFAULT;
    else if (v && !strcmp(v, "full"))
        *out = VISION_FEATURES_FULL;
    else
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: vision_feature_select_strategy: expected \"default\" or \"full\", "
                         "found %s",
                         label, v ? v : "a non-string");
    return CELER_OK;
}

/* The image-processor keys of one JSON object, over cfg's values. */
static celer_status parse_processor_object(vision_config *cfg, const json_t *root,
                                           const char *label, celer_error *e) {
    celer_status s;
    if (!json_is_object(root))
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: expected a JSON object", label);
    bool convert_rgb = true;
    if ((s = parse_bool(&cfg->do_resize, root, "do_resize", label, e)) ||
        (s = parse_bool(&cfg->do_center_crop, root, "do_center_crop", label, e)) ||
        (s = parse_bool(&cfg->do_rescale, root, "do_rescale", label, e)) ||
        (s = parse_bool(&cfg->do_normalize, root, "do_normalize", label, e)) ||
        (s = parse_bool(&convert_rgb, root, "do_convert_rgb", label, e)))
        return s;
    if (!convert_rgb)
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: do_convert_rgb: only true is supported (images are decoded to RGB)",
                         label);
    if ((s = parse_size(&cfg->size_shortest_edge, &cfg->size_h, &cfg->size_w, root, "size", true,
                        label, e)) ||
        (s = parse_size(NULL, &cfg->crop_h, &cfg->crop_w, root, "crop_size", false, label, e)) ||
        (s = parse_triple(cfg->image_mean, root, "image_mean", label, e)) ||
        (s = parse_triple(cfg->image_std, root, "image_std", label, e)))
        return s;
    const json_t *j = json_object_get(root, "resample");
    if (j && !json_is_null(j)) {
        json_int_t r = json_is_integer(j) ? json_integer_value(j) : -1;
        if (r != VISION_RESAMPLE_BICUBIC && r != VISION_RESAMPLE_BILINEAR)
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "%s: resample: expected 2 (bilinear) or 3 (bicubic), found %s", label,
                             json_is_integer(j) ? "another mode" : "a non-integer");
        cfg->resample = (vision_resample)r;
    }
    j = json_object_get(root, "rescale_factor");
    if (j && !json_is_null(j)) {
        if (!json_is_number(j) || !(json_number_value(j) > 0))
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "%s: rescale_factor: expected a positive number", label);
        cfg->rescale_factor = json_number_value(j);
    }
    j = json_object_get(root, "image_grid_pinpoints");
    if (j && !json_is_null(j) &&
        (s = parse_pinpoints(cfg->pinpoints, &cfg->n_pinpoints, j, label, e)))
        return s;
    /* Gemma 3's pan and scan (null: the processor's defaults) */
    if ((s = parse_bool(&cfg->do_pan_and_scan, root, "do_pan_and_scan", label, e))) return s;
    const char *const pas[2] = {"pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops"};
    int64_t *const pas_out[2] = {&cfg->pas_min_crop, &cfg->pas_max_crops};
    for (int i = 0; i < 2; i++) {
        j = json_object_get(root, pas[i]);
        if (!j || json_is_null(j)) continue;
        if ((*pas_out[i] = json_size(j)) <= 0)
            return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: %s: expected an integer in 1..%d",
                             label, pas[i], VISION_MAX_SIDE);
    }
    j = json_object_get(root, "pan_and_scan_min_ratio_to_activate");
    if (j && !json_is_null(j)) {
        if (!json_is_number(j) || !(json_number_value(j) > 0))
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "%s: pan_and_scan_min_ratio_to_activate: expected a positive number",
                             label);
        cfg->pas_min_ratio = json_number_value(j);
    }
    return CELER_OK;
}

/* The processor kind a config's image_processor_type names (kind when it names none); another
 * processor's settings are refused. */
static celer_status check_processor_type(const json_t *root, vision_processor kind,
                                         const char *label, celer_error *e) {
    const char *t = json_string_value(json_object_get(root, "image_processor_type"));
    if (!t) return CELER_OK;
    const bool gemma3 = !strncmp(t, "Gemma3ImageProcessor", 20),
               llava = !strncmp(t, "LlavaNextImageProcessor", 23);
    if ((kind == VISION_GEMMA3 && !gemma3) || (kind == VISION_LLAVA_NEXT && gemma3 && !llava))
        return error_set(
            e, CELER_STATUS_BAD_CONFIG, "%s: image_processor_type: expected %s, found %s", label,
            kind == VISION_GEMMA3 ? "Gemma3ImageProcessor" : "LlavaNextImageProcessor", t);
    return CELER_OK;
}

celer_status vision_config_parse(vision_config *cfg, const char *label, const char *json,
                                 celer_error *e) {
    json_error_t jerr;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: line %d column %d: %s", label, jerr.line,
                         jerr.column, jerr.text);
    celer_status s = parse_processor_object(cfg, root, label, e);
    json_decref(root);
    if (s == CELER_OK) s = vision_config_check(cfg, label, e);
    return s;
}

/* dir/name parsed, or NULL: with *s untouched when the file does not exist, else with *s
 * and e saying why. */
static json_t *load_json(const char *dir, const char *name, char *path, size_t cap, celer_status *s,
                         celer_error *e) {
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fclose(f);
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        *s = error_set(e, CELER_STATUS_BAD_CONFIG, "%s: line %d column %d: %s", path, jerr.line,
                       jerr.column, jerr.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        *s = error_set(e, CELER_STATUS_BAD_CONFIG, "%s: expected a JSON object", path);
        return NULL;
    }
    return root;
}

celer_status vision_config_load(vision_config *cfg, const char *dir, vision_processor kind,
                                celer_error *e) {
    celer_status s = CELER_OK;
    json_t *proc = NULL, *pre = NULL, *model = NULL;
    char proc_path[4200], pre_path[4200], model_path[4200];
    if (kind == VISION_GEMMA3)
        vision_config_default_gemma3(cfg);
    else
        vision_config_default(cfg);
    proc = load_json(dir, "processor_config.json", proc_path, sizeof proc_path, &s, e);
    if (s != CELER_OK) goto out;
    pre = load_json(dir, "preprocessor_config.json", pre_path, sizeof pre_path, &s, e);
    if (s != CELER_OK) goto out;
    model = load_json(dir, "config.json", model_path, sizeof model_path, &s, e);
    if (s != CELER_OK) goto out;
    /* transformers prefers a nested "image_processor" in processor_config.json. */
    const json_t *nested = proc ? json_object_get(proc, "image_processor") : NULL;
    const json_t *src = nested ? nested : pre;
    const char *src_path = nested ? proc_path : pre_path;
    if (!src)
        s = error_set(e, CELER_STATUS_IO,
                      "%s: no image processor settings (expected %s or an \"image_processor\" "
                      "entry in %s)",
                      dir, pre_path, proc_path);
    else if ((s = check_processor_type(src, kind, src_path, e)) == CELER_OK)
        s = parse_processor_object(cfg, src, src_path, e);
    if (s != CELER_OK) goto out;
    const bool have_pins = json_object_get(src, "image_grid_pinpoints") != NULL;
    /* The processor's own keys, then config.json for what they lack. */
    const json_t *v;
    bool have_patch = false, have_strategy = false;
    if (proc) {
        if ((v = json_object_get(proc, "patch_size")) && !json_is_null(v)) {
            if ((cfg->patch_size = json_size(v)) <= 0) {
                s = error_set(e, CELER_STATUS_BAD_CONFIG,
                              "%s: patch_size: expected an integer in 1..%d", proc_path,
                              VISION_MAX_SIDE);
                goto out;
            }
            have_patch = true;
        }
        if ((v = json_object_get(proc, "num_additional_image_tokens")) && !json_is_null(v) &&
            (cfg->num_additional_image_tokens = json_size(v)) < 0) {
            s = error_set(e, CELER_STATUS_BAD_CONFIG,
                          "%s: num_additional_image_tokens: expected a non-negative integer",
                          proc_path);
            goto out;
        }
        have_strategy = json_object_get(proc, "vision_feature_select_strategy") != NULL;
        if ((s = parse_strategy(&cfg->strategy, proc, proc_path, e)) != CELER_OK) goto out;
    }
    if (model) {
        const json_t *mp = json_object_get(model, "image_grid_pinpoints");
        if (mp && !json_is_null(mp)) {
            int64_t pins[VISION_MAX_PINPOINTS][2];
            int n = 0;
            if ((s = parse_pinpoints(pins, &n, mp, model_path, e)) != CELER_OK) goto out;
            if (!have_pins) {
                memcpy(cfg->pinpoints, pins, sizeof pins);
                cfg->n_pinpoints = n;
            } else if (n != cfg->n_pinpoints ||
                       memcmp(pins, cfg->pinpoints, sizeof pins[0] * (size_t)n) != 0) {
                s = error_set(e, CELER_STATUS_BAD_CONFIG,
                              "%s: image_grid_pinpoints differ from the image processor's (%d "
                              "vs %d entries)",
                              model_path, n, cfg->n_pinpoints);
                goto out;
            }
        }
        const json_t *vc = json_object_get(model, "vision_config");
        if (!have_patch && json_is_object(vc) && (v = json_object_get(vc, "patch_size")) &&
            (cfg->patch_size = json_size(v)) <= 0) {
            s = error_set(e, CELER_STATUS_BAD_CONFIG,
                          "%s: vision_config.patch_size: expected an integer in 1..%d", model_path,
                          VISION_MAX_SIDE);
            goto out;
        }
        if (!have_strategy &&
            (s = parse_strategy(&cfg->strategy, model, model_path, e)) != CELER_OK)
            goto out;
    }
    s = vision_config_check(cfg, dir, e);
out:
    json_decref(proc);
    json_decref(pre);
    json_decref(model);
    return s;
}
