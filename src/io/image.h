/*
 * image.h - PNG and JPEG decoding from memory into 8-bit RGB (libpng, libjpeg-turbo).
 *
 *     image_rgb img;
 *     celer_error e;
 *     if (image_load(&img, "cat.jpg", &e) != CELER_OK) { puts(e.msg); return; }
 *     ... img.data[(y * img.width + x) * 3 + c] ...
 *     image_free(&img);
 *
 * The conversion to RGB is the one a transformers image processor applies to a PIL image
 * (`PIL.Image.open(f)` handed to the processor; transformers.image_transforms.convert_to_rgb
 * with Pillow's own mode conversions), so that the pixels equal what the reference pipeline
 * sees:
 *   - Alpha (RGBA, gray+alpha, a palette or a colour key in tRNS) is composited onto white,
 *     with Pillow's integer arithmetic. Alpha is not dropped.
 *   - EXIF orientation is NOT applied: neither PIL.Image.open nor the processor rotates.
 *   - 16-bit PNG samples keep their high byte (Pillow's ";16B" raw modes), except 16-bit
 *     grayscale, which Pillow opens as mode "I;16" and converts to 8 bits by clamping at
 *     255 (a value of 1000 becomes 255). 1/2/4-bit gray is scaled to 0..255.
 *   - A tRNS colour key is compared the way Pillow compares it: against the 8-bit sample
 *     for 8-bit images, and, for 2/4/16-bit gray and 16-bit RGB, the raw key against the
 *     converted 8-bit value.
 *   - Palette indices beyond the PLTE entries are black; palette alpha comes from tRNS.
 *   - JPEG: libjpeg's default decoding (islow IDCT, fancy upsampling), as Pillow uses it;
 *     grayscale is replicated; CMYK/YCCK is read as Adobe-inverted CMYK (Pillow's "CMYK;I",
 *     c = 255 - stored sample) and converted with Pillow's integer formula
 *     r = (255 - k) - round(c (255 - k) / 255), likewise g from m and b from y. A truncated JPEG is
 * an error (Pillow: "image file is truncated"). It does not resize or normalize (src/vision does)
 * and does not read other formats.
 *
 * Untrusted input: every failure is a celer_status with one line in e naming the label
 * (file name) and the problem; libpng and libjpeg never print and never exit. Sizes are
 * checked before anything is allocated.
 */
#ifndef CELER_IO_IMAGE_H
#define CELER_IO_IMAGE_H

#include "base/error.h"

#include <stddef.h>
#include <stdint.h>

/* Refused above these: a side longer than IMAGE_MAX_SIDE or more than IMAGE_MAX_PIXELS. */
#define IMAGE_MAX_SIDE   16384
#define IMAGE_MAX_PIXELS ((int64_t)64 * 1024 * 1024)

typedef struct image_rgb {
    int64_t width, height;
    uint8_t *data; /* [height, width, 3] RGB, row-major; malloc'd, freed by image_free */
} image_rgb;

typedef enum image_format {
    IMAGE_FORMAT_UNKNOWN = 0,
    IMAGE_FORMAT_PNG,
    IMAGE_FORMAT_JPEG,
} image_format;

/* The format from the first bytes (PNG signature, JPEG SOI marker). */
image_format image_sniff(const uint8_t *buf, size_t len);

/* Decodes buf[len] (PNG or JPEG) into *img. label names the source in messages. On failure
 * *img is zeroed and e holds the reason: CELER_STATUS_BAD_FILE (empty, not an image,
 * truncated, corrupt, zero or too large dimensions), CELER_STATUS_UNSUPPORTED (a JPEG
 * colour space that has no RGB conversion) or CELER_STATUS_OUT_OF_MEMORY. */
celer_status image_decode(image_rgb *img, const char *label, const uint8_t *buf, size_t len,
                          celer_error *e);

/* image_decode on the bytes of the file at path (CELER_STATUS_IO when it cannot be read). */
celer_status image_load(image_rgb *img, const char *path, celer_error *e);

void image_free(image_rgb *img);

#endif
