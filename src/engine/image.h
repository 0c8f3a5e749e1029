/*
 * image.h - the public celer_image (a decoded, refcounted RGB image) as the engine sees
 * it, and the image side of a vision-language model: how an image becomes tiles and
 * prompt rows (src/vision does the pixels, the model family the features).
 */
#ifndef CELER_ENGINE_IMAGE_H
#define CELER_ENGINE_IMAGE_H

#include "celer.h"
#include "io/image.h"
#include "models/model.h"
#include "vision/vision.h"

#include <stdatomic.h>

struct celer_image {
    image_rgb rgb;
    uint64_t digest;
    atomic_int refs;
};

/* The engine's model: the models layer's, extended with what the engine reads beside the
 * weights (model_open allocates it whole, model_close frees it). A celer_model the public
 * API hands out is always one of these. */
typedef struct engine_model {
    celer_model base;      /* first */
    vision_config *images; /* a vision-language model's image preprocessing, or NULL */
} engine_model;

/* Opens a model for the public API: the weights, then a vision-language model's image
 * preprocessing settings. */
celer_status image_model_open(const char *path, celer_model **out, celer_error *e);
void image_model_close(celer_model *m);

/* The grid of img for m (tiles and the unpadded feature window) and its prompt rows. */
celer_status image_grid(const celer_model *m, const celer_image *img, model_image_grid *g,
                        int64_t *positions, celer_error *e);

/* out[positions, d] = the rows of img, on backend be with scratch (model_vision_sizes
 * for tiles_per_call tiles). */
celer_status image_encode(const celer_model *m, backend *be, int64_t tiles_per_call, float *scratch,
                          const celer_image *img, float *out, celer_error *e);

#endif
