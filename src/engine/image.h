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

/* Reads the image preprocessing settings of a vision-language model into m->vision_pre
 * (a no-op for other models). */
celer_status image_model_init(celer_model *m, celer_error *e);

/* The grid of img for m (tiles and the unpadded feature window) and its prompt rows. */
celer_status image_grid(const celer_model *m, const celer_image *img, model_image_grid *g, int64_t *positions,
                        celer_error *e);

/* out[positions, d] = the rows of img, on backend be with scratch (model_vision_sizes
 * for tiles_per_call tiles). */
celer_status image_encode(const celer_model *m, backend *be, int64_t tiles_per_call, float *scratch,
                          const celer_image *img, float *out, celer_error *e);

#endif
