/*
 * image.c - celer_image (decode, reference counting, digest) and the glue between image
 * preprocessing (src/vision) and a model's image encoder (src/models): the layout
 * vision_feature_count describes becomes the model's tile grid (LLaVA-NeXT), or the
 * pan-and-scan crops its blocks (Gemma 3); the model counts the prompt rows. Also the text
 * a processor writes for images before tokenizing (Gemma3Processor's expansion).
 */
#define _GNU_SOURCE /* memmem */
#include "engine/image.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== celer_image ==== */

/* FNV-1a over the size and the pixels, then a splitmix64 finish. */
static uint64_t pixels_digest(const image_rgb *img) {
    uint64_t h = 0xcbf29ce484222325ull;
    const int64_t dims[2] = {img->width, img->height};
    const uint8_t *p = (const uint8_t *)dims;
    for (size_t i = 0; i < sizeof dims; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    const size_t n = (size_t)(img->width * img->height * 3);
    for (size_t i = 0; i < n; i++) h = (h ^ img->data[i]) * 0x100000001b3ull;
    h ^= h >> 30, h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27, h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

static celer_status image_wrap(image_rgb *rgb, celer_image **out, celer_error *e) {
    celer_image *img = malloc(sizeof *img);
    if (!img) {
        image_free(rgb);
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    img->rgb = *rgb;
    img->digest = pixels_digest(rgb);
    atomic_init(&img->refs, 1);
    *out = img;
    return CELER_OK;
}

celer_status celer_image_load(const char *path, celer_image **out, char *err, size_t err_size) {
    celer_error e = {{0}};
    image_rgb rgb;
    *out = NULL;
    celer_status s = image_load(&rgb, path, &e);
    if (s == CELER_OK) s = image_wrap(&rgb, out, &e);
    error_copy(&e, err, err_size);
    return s;
}

celer_status celer_image_decode(const void *data, size_t len, const char *label, celer_image **out,
                                char *err, size_t err_size) {
    celer_error e = {{0}};
    image_rgb rgb;
    *out = NULL;
    celer_status s = image_decode(&rgb, label ? label : "image", data, len, &e);
    if (s == CELER_OK) s = image_wrap(&rgb, out, &e);
    error_copy(&e, err, err_size);
    return s;
}

celer_image *celer_image_ref(celer_image *img) {
    atomic_fetch_add(&img->refs, 1);
    return img;
}

void celer_image_free(celer_image *img) {
    if (!img || atomic_fetch_sub(&img->refs, 1) != 1) return;
    image_free(&img->rgb);
    free(img);
}

int64_t celer_image_width(const celer_image *img) {
    return img->rgb.width;
}
int64_t celer_image_height(const celer_image *img) {
    return img->rgb.height;
}
uint64_t celer_image_digest(const celer_image *img) {
    return img->digest;
}

/* ==== Images through a model ==== */

bool celer_model_has_vision(const celer_model *m) {
    return m->family->encode_image != NULL;
}

int32_t celer_model_image_token(const celer_model *m) {
    return m->family->image_token ? m->family->image_token(m) : -1;
}

bool celer_model_image_blocks_whole(const celer_model *m) {
    return m->image_blocks;
}

static vision_processor processor_of(const celer_model *m) {
    return m->family->processor && !strcmp(m->family->processor, "gemma3") ? VISION_GEMMA3
                                                                           : VISION_LLAVA_NEXT;
}

/* The image settings of m (NULL: none), read at open. */
static const vision_config *settings_of(const celer_model *m) {
    return ((const engine_model *)m)->images;
}

celer_status image_model_open(const char *path, celer_model **out, celer_error *e) {
    celer_status s = model_open(path, sizeof(engine_model), out, e);
    if (s != CELER_OK || !(*out)->family->encode_image) return s;
    engine_model *em = (engine_model *)*out;
    vision_config *cfg = malloc(sizeof *cfg);
    if (!cfg) {
        s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    } else {
        const vision_processor kind = processor_of(*out);
        s = vision_config_load(cfg, (*out)->ck.dir, kind, e);
        if (s == CELER_OK) s = vision_config_check(cfg, (*out)->ck.dir, e);
        if (s == CELER_OK) {
            em->images = cfg;
            return CELER_OK;
        }
        free(cfg);
        /* a Gemma 3 checkpoint without processor files still runs its text: its images are
         * refused when they come (image_grid) */
        if (s == CELER_STATUS_IO && kind == VISION_GEMMA3) return CELER_OK;
    }
    model_close(*out);
    *out = NULL;
    return s;
}

void image_model_close(celer_model *m) {
    if (!m) return;
    free(((engine_model *)m)->images);
    model_close(m);
}

celer_status image_grid(const celer_model *m, const celer_image *img, model_image_grid *g,
                        int64_t *positions, celer_error *e) {
    if (!m->family->encode_image)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "%s reads no images", m->desc);
    const vision_config *cfg = settings_of(m);
    if (!cfg)
        return error_set(
            e, CELER_STATUS_INVALID_ARGUMENT,
            "%s: no preprocessor_config.json or processor_config.json: the model reads no images",
            m->ck.dir);
    vision_layout lay;
    vision_features f;
    celer_status s = vision_layout_compute(&lay, cfg, img->rgb.height, img->rgb.width, e);
    if (s == CELER_OK && cfg->kind == VISION_GEMMA3) {
        *g = (model_image_grid){
            .n_tiles = lay.n_tiles, .grid_rows = lay.grid_rows, .grid_cols = lay.grid_cols};
        *positions = m->family->image_positions(m, g);
        return CELER_OK;
    }
    if (s == CELER_OK) s = vision_feature_count(&f, cfg, img->rgb.height, img->rgb.width, e);
    if (s != CELER_OK) return s;
    *g = (model_image_grid){.n_tiles = lay.n_tiles,
                            .grid_rows = f.grid_rows,
                            .grid_cols = f.grid_cols,
                            .unpadded_h = f.unpadded_h,
                            .unpadded_w = f.unpadded_w};
    /* The model counts the rows: a processor_config.json without
     * num_additional_image_tokens would count CLIP's class token out, where the tower
     * still produces it. */
    *positions = m->family->image_positions(m, g);
    if (lay.n_tiles != 1 + f.grid_rows * f.grid_cols)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: the image processor makes %lld tiles for a %lldx%lld grid: "
                         "preprocessor_config.json "
                         "and config.json disagree",
                         m->ck.dir, (long long)lay.n_tiles, (long long)f.grid_rows,
                         (long long)f.grid_cols);
    return CELER_OK;
}

celer_status celer_model_image_positions(const celer_model *m, const celer_image *img, int64_t *n,
                                         char *err, size_t err_size) {
    celer_error e = {{0}};
    model_image_grid g;
    celer_status s = image_grid(m, img, &g, n, &e);
    error_copy(&e, err, err_size);
    return s;
}

celer_status celer_model_image_blocks(const celer_model *m, const celer_image *img, int64_t *blocks,
                                      char *err, size_t err_size) {
    celer_error e = {{0}};
    model_image_grid g;
    int64_t n;
    celer_status s = image_grid(m, img, &g, &n, &e);
    if (s == CELER_OK) *blocks = m->family->image_blocks ? m->family->image_blocks(m, &g) : 1;
    error_copy(&e, err, err_size);
    return s;
}

/* ==== Prompt text (Gemma3Processor's expansion) ==== */

/* The text of special token id (malloc'd), or NULL. */
static char *token_text(const celer_tokenizer *tok, int32_t id) {
    char *t = NULL;
    size_t n;
    if (celer_detokenize(tok, &id, 1, false, &t, &n, NULL, 0) != CELER_OK || !t || !n) {
        free(t);
        return NULL;
    }
    return t;
}

/* Appends n bytes of s at dst + *at (dst NULL: only counts). */
static void put(char *dst, size_t *at, const char *s, size_t n) {
    if (dst) memcpy(dst + *at, s, n);
    *at += n;
}

/* The expanded text into dst (NULL: its length only) with blocks[k] blocks for marker k;
 * returns its length. */
static size_t expand_text(char *dst, const char *text, size_t len, const char *boi, const char *img,
                          const char *eoi, const int64_t *blocks) {
    static const char nl[] = "\n\n", first[] = "Here is the original image ",
                      crops[] = " and here are some crops to help you see better ";
    const size_t nb = strlen(boi);
    size_t at = 0;
    int32_t k = 0;
    for (size_t i = 0; i < len;) {
        if (len - i < nb || memcmp(text + i, boi, nb) != 0) {
            put(dst, &at, text + i++, 1);
            continue;
        }
        i += nb;
        /* Gemma3Processor's full_image_sequence, with one image token, per block */
        for (int64_t j = 0; j < blocks[k]; j++) {
            if (blocks[k] > 1) {
                if (j == 0)
                    put(dst, &at, first, sizeof first - 1);
                else if (j == 1)
                    put(dst, &at, crops, sizeof crops - 1);
                else
                    put(dst, &at, " ", 1);
            }
            put(dst, &at, nl, 2), put(dst, &at, boi, nb), put(dst, &at, img, strlen(img));
            put(dst, &at, eoi, strlen(eoi)), put(dst, &at, nl, 2);
        }
        k++;
    }
    return at;
}

celer_status celer_model_image_text(const celer_model *m, const celer_tokenizer *tok,
                                    const char *text, size_t len, celer_image *const *images,
                                    int32_t n_images, char **out, size_t *out_len, char *err,
                                    size_t err_size) {
    celer_error e = {{0}};
    celer_status s = CELER_OK;
    char *boi = NULL, *eoi = NULL, *img = NULL;
    int64_t *blocks = NULL;
    *out = NULL;
    if (!m->family->image_wrap) {
        if (!(*out = malloc(len + 1))) goto oom;
        memcpy(*out, text, len);
        (*out)[len] = '\0', *out_len = len;
        return CELER_OK;
    }
    int32_t boi_id, eoi_id;
    m->family->image_wrap(m, &boi_id, &eoi_id);
    boi = token_text(tok, boi_id), eoi = token_text(tok, eoi_id),
    img = token_text(tok, celer_model_image_token(m));
    if (!boi || !eoi || !img) {
        s = error_set(&e, CELER_STATUS_BAD_CONFIG,
                      "%s: the tokenizer has no text for the image tokens %d, %d and %d "
                      "(config.json boi_token_index, "
                      "image_token_index, eoi_token_index)",
                      m->ck.dir, boi_id, celer_model_image_token(m), eoi_id);
        goto done;
    }
    /* the markers, each image's blocks */
    int32_t markers = 0;
    for (const char *p = text; (p = memmem(p, len - (size_t)(p - text), boi, strlen(boi)));
         p += strlen(boi))
        markers++;
    if (markers > n_images) {
        s = error_set(&e, CELER_STATUS_INVALID_ARGUMENT, "prompt: %d %s markers for %d images",
                      markers, boi, n_images);
        goto done;
    }
    if (!(blocks = calloc((size_t)markers + 1, sizeof *blocks))) goto oom;
    for (int32_t k = 0; k < markers; k++) {
        char why[CELER_ERROR_LEN];
        if ((s = celer_model_image_blocks(m, images[k], &blocks[k], why, sizeof why)) != CELER_OK) {
            error_set(&e, s, "images[%d]: %s", k, why);
            goto done;
        }
    }
    const size_t n = expand_text(NULL, text, len, boi, img, eoi, blocks);
    if (!(*out = malloc(n + 1))) goto oom;
    expand_text(*out, text, len, boi, img, eoi, blocks);
    (*out)[n] = '\0', *out_len = n;
    goto done;
oom:
    s = error_set(&e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
done:
    free(boi), free(eoi), free(img), free(blocks);
    error_copy(&e, err, err_size);
    return s;
}

celer_status image_encode(const celer_model *m, backend *be, int64_t tiles_per_call, float *scratch,
                          const celer_image *img, float *out, celer_error *e) {
    model_image_grid g;
    int64_t positions;
    celer_status s = backend_status(be, e); /* a lost device fails at once */
    if (s == CELER_OK) s = image_grid(m, img, &g, &positions, e);
    if (s != CELER_OK) return s;
    model_vision_sizes vs;
    m->family->vision_sizes(m, tiles_per_call, &vs);
    vision_layout lay;
    float *pixels = NULL, *pixels_be = NULL, *tiles = NULL, *out_be = NULL;
    int32_t *layout = NULL, *layout_be = NULL;
    if ((s = vision_preprocess(&pixels, &lay, settings_of(m), &img->rgb, e)) != CELER_OK) goto out;
    if (lay.out_h != vs.image_size || lay.out_w != vs.image_size) {
        s = error_set(
            e, CELER_STATUS_BAD_CONFIG,
            "%s: the image processor makes %lldx%lld tiles, the vision tower reads %lldx%lld: "
            "preprocessor_config.json %s and config.json vision_config.image_size disagree",
            m->ck.dir, (long long)lay.out_w, (long long)lay.out_h, (long long)vs.image_size,
            (long long)vs.image_size, settings_of(m)->kind == VISION_GEMMA3 ? "size" : "crop_size");
        goto out;
    }
    /* the tiles' features, the layout and (a backend with memory of its own) the pixels
     * and the rows made, in backend memory for this image */
    const size_t d = (size_t)m->dims.d,
                 pixel_bytes =
                     sizeof(float) * (size_t)(g.n_tiles * 3 * vs.image_size * vs.image_size);
    layout = malloc(sizeof(int32_t) * (size_t)positions);
    tiles =
        be->ops->alloc(be, sizeof(float) * (size_t)(g.n_tiles * m->family->tile_positions(m)) * d);
    layout_be = be->host ? layout : be->ops->alloc(be, sizeof(int32_t) * (size_t)positions);
    pixels_be = be->host ? pixels : be->ops->alloc(be, pixel_bytes);
    out_be = be->host ? out : be->ops->alloc(be, sizeof(float) * (size_t)positions * d);
    if (!layout || !tiles || !layout_be || !pixels_be || !out_be) {
        s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory (image tiles)");
        goto out;
    }
    m->family->image_layout(m, &g, layout);
    if (!be->host) {
        be->ops->upload(be, layout_be, layout, sizeof(int32_t) * (size_t)positions);
        be->ops->upload(be, pixels_be, pixels, pixel_bytes);
    }
    do {
        backend_begin(be, g.n_tiles * vs.tile_rows);
        m->family->encode_image(m, be, pixels_be, &g, tiles_per_call, scratch, tiles, layout_be,
                                out_be);
    } while (!backend_end(be));
    if (!be->host) be->ops->download(be, out, out_be, sizeof(float) * (size_t)positions * d);
    s = backend_status(be, e);
out:
    if (tiles) be->ops->release(be, tiles);
    if (!be->host) {
        if (layout_be) be->ops->release(be, layout_be);
        if (pixels_be) be->ops->release(be, pixels_be);
        if (out_be) be->ops->release(be, out_be);
    }
    free(layout);
    free(pixels);
    return s;
}
