/*
 * fuzz_image.c - libFuzzer target for the PNG/JPEG decoder and, on success, LLaVA-NeXT
 * preprocessing with a small config.
 *
 * Any input must either decode into width x height x 3 bytes (all read here, so ASan sees an
 * overrun) within the size limits, or fail with a one-line message; never crash, leak or
 * print. Preprocessing likewise gives finite values or refuses the image in one line. Decoded images are cropped to at most 64x64 before preprocessing to keep each run
 * fast; the preprocessed values must be finite.
 */
#include "io/image.h"
#include "vision/vision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    image_rgb img;
    celer_error e;
    if (image_decode(&img, "fuzz", data, size, &e) != CELER_OK) {
        if (img.data || !e.msg[0] || strchr(e.msg, '\n')) __builtin_trap();
        return 0;
    }
    if (img.width < 1 || img.height < 1 || img.width > IMAGE_MAX_SIDE ||
        img.height > IMAGE_MAX_SIDE || img.width * img.height > IMAGE_MAX_PIXELS)
        __builtin_trap();
    volatile uint8_t sink = 0;
    const size_t n = (size_t)(img.width * img.height * 3);
    for (size_t i = 0; i < n; i += 61) sink ^= img.data[i];
    sink ^= img.data[n - 1];
    (void)sink;

    /* A top-left crop of at most 64x64, then crop 14 tiles of a 1x2 / 2x1 / 2x2 grid. */
    image_rgb small = {.width = img.width < 64 ? img.width : 64,
                       .height = img.height < 64 ? img.height : 64};
    small.data = malloc((size_t)(small.width * small.height * 3));
    if (small.data) {
        for (int64_t y = 0; y < small.height; y++)
            memcpy(small.data + y * small.width * 3, img.data + y * img.width * 3,
                   (size_t)(small.width * 3));
        vision_config cfg;
        vision_config_default(&cfg);
        cfg.size_shortest_edge = cfg.crop_h = cfg.crop_w = 14;
        cfg.patch_size = 7;
        const int64_t pins[3][2] = {{14, 28}, {28, 14}, {28, 28}};
        memcpy(cfg.pinpoints, pins, sizeof pins);
        cfg.n_pinpoints = 3;
        cfg.resample = (data[size - 1] & 1) ? VISION_RESAMPLE_BICUBIC : VISION_RESAMPLE_BILINEAR;
        float *px = NULL;
        vision_layout lay;
        if (vision_preprocess(&px, &lay, &cfg, &small, &e) != CELER_OK) {
            /* a shape that every pinpoint scales to nothing (a 64x1 strip) is refused in one
             * line */
            if (px || !e.msg[0] || strchr(e.msg, '\n')) __builtin_trap();
            free(small.data);
            image_free(&img);
            return 0;
        }
        for (int64_t i = 0; i < lay.n_tiles * 3 * lay.out_h * lay.out_w; i++)
            if (!isfinite(px[i])) __builtin_trap();
        vision_features f;
        if (vision_feature_count(&f, &cfg, small.height, small.width, &e) != CELER_OK ||
            f.n_tokens < 1)
            __builtin_trap();
        free(px);
        free(small.data);
    }
    image_free(&img);
    return 0;
}
