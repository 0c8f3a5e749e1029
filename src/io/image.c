/*
 * image.c - PNG (libpng) and JPEG (libjpeg-turbo) decoding into 8-bit RGB, converted the way
 * Pillow + transformers' convert_to_rgb convert (see image.h for each rule).
 *
 * Both libraries report errors by longjmp. Each decoder therefore runs in two functions: an
 * outer one that owns every resource in a context struct and frees it at one cleanup label,
 * and an inner one that calls setjmp and holds nothing of its own, so no local variable is
 * live across a longjmp. Error and warning handlers write into the context and never print.
 */
#include "io/image.h"

#include "base/mapped_file.h"

#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

/* deflate cannot compress better than about 1032:1; a PNG whose raw rows need more bytes
 * than that from its whole file is truncated, and is refused before the row buffer exists. */
#define PNG_MAX_DEFLATE_RATIO 1032
/* libjpeg's working memory (progressive JPEGs keep every coefficient) is capped here. */
#define JPEG_MAX_MEMORY ((long)1 << 30)

image_format image_sniff(const uint8_t *buf, size_t len) {
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (len >= 8 && memcmp(buf, png_sig, 8) == 0) return IMAGE_FORMAT_PNG;
    if (len >= 3 && buf[0] == 0xff && buf[1] == 0xd8 && buf[2] == 0xff) return IMAGE_FORMAT_JPEG;
    return IMAGE_FORMAT_UNKNOWN;
}

/* Checks width x height against the limits before anything of that size is allocated. */
static celer_status check_dims(const char *label, const char *kind, uint64_t w, uint64_t h,
                               celer_error *e) {
    if (w == 0 || h == 0)
        return error_set(e, CELER_STATUS_BAD_FILE, "%s: %s: zero image size %llux%llu", label, kind,
                         (unsigned long long)w, (unsigned long long)h);
    if (w > IMAGE_MAX_SIDE || h > IMAGE_MAX_SIDE || w * h > (uint64_t)IMAGE_MAX_PIXELS)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: %s: image size %llux%llu exceeds the limit (%d per side, %lld "
                         "pixels)",
                         label, kind, (unsigned long long)w, (unsigned long long)h, IMAGE_MAX_SIDE,
                         (long long)IMAGE_MAX_PIXELS);
    return CELER_OK;
}

static celer_status alloc_rgb(image_rgb *img, const char *label, uint64_t w, uint64_t h,
                              celer_error *e) {
    img->data = malloc((size_t)(w * h * 3));
    if (!img->data)
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory for a %llux%llu image",
                         label, (unsigned long long)w, (unsigned long long)h);
    img->width = (int64_t)w;
    img->height = (int64_t)h;
    return CELER_OK;
}

/* Pillow's alpha_composite of (c, a) over opaque white, one channel (exact for all inputs). */
static inline uint8_t over_white(unsigned c, unsigned a) {
    if (a == 0) return 255;
    unsigned y = c * a + 255 * (255 - a) + 128;
    return (uint8_t)((y + (y >> 8)) >> 8);
}

/* ==== PNG ==== */

typedef struct png_ctx {
    const char *label;
    const uint8_t *buf;
    size_t len, pos;
    char msg[256];
    png_structp png;
    png_infop info;
    uint8_t *raw;    /* rows after libpng's unpacking, height * rowbytes */
    png_bytep *rows; /* pointers into raw */
    celer_error *e;
    celer_status status; /* set by the inner function on a non-libpng failure */
} png_ctx;

static void png_on_error(png_structp png, png_const_charp msg) {
    png_ctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
    (void)png, (void)msg; /* benign; Pillow ignores the same conditions */
}

static void png_read_mem(png_structp png, png_bytep out, size_t n) {
    png_ctx *c = png_get_io_ptr(png);
    if (n > c->len - c->pos) png_error(png, "truncated: the data ends inside a chunk");
    memcpy(out, c->buf + c->pos, n);
    c->pos += n;
}

/* Sample i of a row of 8-bit (bytes) or 16-bit (big-endian) samples. */
static inline unsigned png_sample(const uint8_t *row, int64_t i, int depth16) {
    return depth16 ? ((unsigned)row[2 * i] << 8) | row[2 * i + 1] : row[i];
}

/* Gray sample -> Pillow's 8-bit value: "1" 0/255, L;2 x85, L;4 x17, L, I;16 clamped. */
static inline unsigned gray_to_8(unsigned v, int bit_depth) {
    switch (bit_depth) {
    case 1:
        return v ? 255 : 0;
    case 2:
        return v * 85;
    case 4:
        return v * 17;
    case 16:
        return v > 255 ? 255 : v;
    default:
        return v;
    }
}

/* Rows of raw samples -> RGB, per image.h. */
static void png_convert(png_ctx *c, image_rgb *img, int color_type, int bit_depth) {
    png_structp png = c->png;
    png_infop info = c->info;
    const int d16 = bit_depth == 16;
    png_bytep trans_alpha = NULL;
    int num_trans = 0;
    png_color_16p key = NULL;
    int has_trns = png_get_valid(png, info, PNG_INFO_tRNS) &&
                   png_get_tRNS(png, info, &trans_alpha, &num_trans, &key);
    png_colorp plte = NULL;
    int num_plte = 0;
    if (color_type == PNG_COLOR_TYPE_PALETTE) png_get_PLTE(png, info, &plte, &num_plte);
    /* Pillow's transparent gray value: mode "1" holds 0/255, the others the raw key. */
    unsigned gray_key = has_trns && key ? key->gray : 0;
    if (has_trns && key && bit_depth == 1) gray_key = gray_key ? 255 : 0;

    for (int64_t y = 0; y < img->height; y++) {
        const uint8_t *row = c->rows[y];
        uint8_t *o = img->data + (size_t)y * (size_t)img->width * 3;
        for (int64_t x = 0; x < img->width; x++, o += 3) {
            unsigned r, g, b, a = 255;
            switch (color_type) {
            case PNG_COLOR_TYPE_GRAY:
                r = g = b = gray_to_8(png_sample(row, x, d16), bit_depth);
                if (has_trns && key && r == gray_key) a = 0;
                break;
            case PNG_COLOR_TYPE_GRAY_ALPHA:
                r = g = b = png_sample(row, 2 * x, d16) >> (d16 ? 8 : 0);
                a = png_sample(row, 2 * x + 1, d16) >> (d16 ? 8 : 0);
                break;
            case PNG_COLOR_TYPE_RGB:
                r = png_sample(row, 3 * x, d16) >> (d16 ? 8 : 0);
                g = png_sample(row, 3 * x + 1, d16) >> (d16 ? 8 : 0);
                b = png_sample(row, 3 * x + 2, d16) >> (d16 ? 8 : 0);
                if (has_trns && key && r == key->red && g == key->green && b == key->blue) a = 0;
                break;
            case PNG_COLOR_TYPE_RGB_ALPHA:
                r = png_sample(row, 4 * x, d16) >> (d16 ? 8 : 0);
                g = png_sample(row, 4 * x + 1, d16) >> (d16 ? 8 : 0);
                b = png_sample(row, 4 * x + 2, d16) >> (d16 ? 8 : 0);
                a = png_sample(row, 4 * x + 3, d16) >> (d16 ? 8 : 0);
                break;
            default: { /* palette */
                unsigned i = row[x];
                r = g = b = 0;
                if ((int)i < num_plte) r = plte[i].red, g = plte[i].green, b = plte[i].blue;
                if (has_trns && trans_alpha && (int)i < num_trans) a = trans_alpha[i];
                break;
            }
            }
            if (a == 255) {
                o[0] = (uint8_t)r, o[1] = (uint8_t)g, o[2] = (uint8_t)b;
            } else {
                o[0] = over_white(r, a), o[1] = over_white(g, a), o[2] = over_white(b, a);
            }
        }
    }
}

/* Everything that may longjmp. Returns 0, or -1 after a libpng error (message in c->msg),
 * or 1 with c->status set. Holds no resources of its own. */
static int png_decode_inner(png_ctx *c, image_rgb *img) {
    if (setjmp(png_jmpbuf(c->png))) return -1;
    png_set_read_fn(c->png, c, png_read_mem);
    /* Our own limits are checked below with a clearer message than libpng's. */
    png_set_user_limits(c->png, 0x7fffffff, 0x7fffffff);
    png_set_chunk_malloc_max(c->png, 8u << 20);
    png_set_benign_errors(c->png, 1);
    png_read_info(c->png, c->info);
    png_uint_32 w, h;
    int bit_depth, color_type, interlace;
    png_get_IHDR(c->png, c->info, &w, &h, &bit_depth, &color_type, &interlace, NULL, NULL);
    if ((c->status = check_dims(c->label, "PNG", w, h, c->e)) != CELER_OK) return 1;
    /* Raw bytes the IDAT stream must inflate to (1 filter byte per row; Adam7 adds at
     * most 7 rows' worth, which the slack covers). */
    uint64_t bits_per_px = (uint64_t)png_get_channels(c->png, c->info) * (uint64_t)bit_depth;
    uint64_t raw_bytes = (uint64_t)h * (1 + ((uint64_t)w * bits_per_px + 7) / 8);
    if (raw_bytes / PNG_MAX_DEFLATE_RATIO > c->len) {
        c->status = error_set(c->e, CELER_STATUS_BAD_FILE,
                              "%s: PNG: truncated: %zu bytes cannot hold a %ux%u image", c->label,
                              c->len, (unsigned)w, (unsigned)h);
        return 1;
    }
    if (bit_depth < 8) png_set_packing(c->png);
    png_set_interlace_handling(c->png);
    png_read_update_info(c->png, c->info);
    /* What png_convert reads per row: one byte per sample after unpacking, two at 16 bits. */
    size_t rowbytes = png_get_rowbytes(c->png, c->info);
    size_t need = (size_t)w * png_get_channels(c->png, c->info) * (bit_depth == 16 ? 2 : 1);
    if (rowbytes < need) {
        c->status = error_set(c->e, CELER_STATUS_BAD_FILE,
                              "%s: PNG: rows of %zu bytes, expected at least %zu", c->label,
                              rowbytes, need);
        return 1;
    }
    c->raw = malloc(rowbytes * h);
    c->rows = malloc(sizeof *c->rows * h);
    if (!c->raw || !c->rows || (c->status = alloc_rgb(img, c->label, w, h, c->e)) != CELER_OK) {
        if (c->status == CELER_OK)
            c->status = error_set(c->e, CELER_STATUS_OUT_OF_MEMORY,
                                  "%s: PNG: out of memory for a %ux%u image", c->label, (unsigned)w,
                                  (unsigned)h);
        return 1;
    }
    for (png_uint_32 y = 0; y < h; y++) c->rows[y] = c->raw + (size_t)y * rowbytes;
    png_read_image(c->png, c->rows);
    png_convert(c, img, color_type, bit_depth);
    return 0;
}

static celer_status png_decode(image_rgb *img, const char *label, const uint8_t *buf, size_t len,
                               celer_error *e) {
    png_ctx c = {.label = label, .buf = buf, .len = len, .e = e, .status = CELER_OK};
    celer_status s = CELER_OK;
    /* The size first, from IHDR (which must follow the signature), for a clearer message
     * than libpng's "Invalid IHDR data". */
    if (len >= 24 && !memcmp(buf + 12, "IHDR", 4)) {
        const uint8_t *p = buf + 16;
        uint64_t w = (uint64_t)p[0] << 24 | (uint64_t)p[1] << 16 | (uint64_t)p[2] << 8 | p[3];
        uint64_t h = (uint64_t)p[4] << 24 | (uint64_t)p[5] << 16 | (uint64_t)p[6] << 8 | p[7];
        if ((s = check_dims(label, "PNG", w, h, e)) != CELER_OK) return s;
    }
    c.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &c, png_on_error, png_on_warning);
    if (c.png) c.info = png_create_info_struct(c.png);
    if (!c.png || !c.info) {
        s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: PNG: out of memory", label);
        goto out;
    }
    int r = png_decode_inner(&c, img);
    if (r < 0)
        s = error_set(e, CELER_STATUS_BAD_FILE, "%s: PNG: %s", label, c.msg);
    else if (r > 0)
        s = c.status;
out:
    if (c.png) png_destroy_read_struct(&c.png, c.info ? &c.info : NULL, NULL);
    free(c.rows);
    free(c.raw);
    if (s != CELER_OK) image_free(img);
    return s;
}

/* ==== JPEG ==== */

typedef struct jpeg_ctx {
    struct jpeg_error_mgr pub; /* first: libjpeg hands back this pointer */
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    struct jpeg_decompress_struct cinfo;
    int created;
    uint8_t *line; /* one decoded scanline for gray and CMYK output */
    const char *label;
    celer_error *e;
    celer_status status;
} jpeg_ctx;

static void jpeg_on_error(j_common_ptr cinfo) {
    jpeg_ctx *c = (jpeg_ctx *)cinfo->err;
    cinfo->err->format_message(cinfo, c->msg);
    longjmp(c->jb, 1);
}

/* Warnings are ignored (as Pillow does), except running out of data: Pillow refuses a
 * truncated JPEG rather than filling the rest with gray. */
static void jpeg_on_message(j_common_ptr cinfo, int level) {
    jpeg_ctx *c = (jpeg_ctx *)cinfo->err;
    if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
        snprintf(c->msg, sizeof c->msg, "truncated: the data ends before the image does");
        longjmp(c->jb, 1);
    }
}

static void jpeg_on_output(j_common_ptr cinfo) {
    (void)cinfo;
}

/* Pillow's CMYK -> RGB on its (inverted) CMYK values, one channel. */
static inline uint8_t cmyk_channel(unsigned stored_c, unsigned stored_k) {
    unsigned c = 255 - stored_c, nk = stored_k; /* nk = 255 - (255 - stored_k) */
    unsigned t = c * nk + 128;
    return (uint8_t)(nk - (((t >> 8) + t) >> 8));
}

static int jpeg_decode_inner(jpeg_ctx *c, image_rgb *img, const uint8_t *buf, size_t len) {
    struct jpeg_decompress_struct *ci = &c->cinfo;
    if (setjmp(c->jb)) return -1;
    jpeg_create_decompress(ci);
    c->created = 1;
    ci->mem->max_memory_to_use = JPEG_MAX_MEMORY;
    jpeg_mem_src(ci, buf, (unsigned long)len);
    if (jpeg_read_header(ci, TRUE) != JPEG_HEADER_OK) {
        c->status =
            error_set(c->e, CELER_STATUS_BAD_FILE, "%s: JPEG: no image (tables only)", c->label);
        return 1;
    }
    if ((c->status = check_dims(c->label, "JPEG", ci->image_width, ci->image_height, c->e)) !=
        CELER_OK)
        return 1;
    int cmyk = 0;
    switch (ci->jpeg_color_space) {
    case JCS_GRAYSCALE:
        ci->out_color_space = JCS_GRAYSCALE;
        break;
    case JCS_CMYK:
    case JCS_YCCK:
        ci->out_color_space = JCS_CMYK;
        cmyk = 1;
        break;
    case JCS_YCbCr:
    case JCS_RGB:
        ci->out_color_space = JCS_RGB;
        break;
    default:
        c->status = error_set(c->e, CELER_STATUS_UNSUPPORTED,
                              "%s: JPEG: %d components in an unknown colour space, expected "
                              "gray, YCbCr, RGB or CMYK",
                              c->label, ci->num_components);
        return 1;
    }
    jpeg_start_decompress(ci);
    if ((c->status = alloc_rgb(img, c->label, ci->output_width, ci->output_height, c->e)) !=
        CELER_OK)
        return 1;
    const int nc = ci->output_components;
    if (nc != 3 && !(c->line = malloc((size_t)ci->output_width * (size_t)nc))) {
        c->status =
            error_set(c->e, CELER_STATUS_OUT_OF_MEMORY, "%s: JPEG: out of memory", c->label);
        return 1;
    }
    while (ci->output_scanline < ci->output_height) {
        uint8_t *o = img->data + (size_t)ci->output_scanline * ci->output_width * 3;
        JSAMPROW row = nc == 3 ? o : c->line;
        if (jpeg_read_scanlines(ci, &row, 1) != 1) {
            snprintf(c->msg, sizeof c->msg, "truncated: no data for row %u", ci->output_scanline);
            return -1;
        }
        if (nc == 3) continue;
        for (JDIMENSION x = 0; x < ci->output_width; x++, o += 3) {
            if (cmyk) {
                const uint8_t *p = c->line + 4 * x;
                o[0] = cmyk_channel(p[0], p[3]);
                o[1] = cmyk_channel(p[1], p[3]);
                o[2] = cmyk_channel(p[2], p[3]);
            } else {
                o[0] = o[1] = o[2] = c->line[x];
            }
        }
    }
    return 0;
}

static celer_status jpeg_decode(image_rgb *img, const char *label, const uint8_t *buf, size_t len,
                                celer_error *e) {
    jpeg_ctx *c = calloc(1, sizeof *c);
    celer_status s = CELER_OK;
    if (!c) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: JPEG: out of memory", label);
    c->label = label;
    c->e = e;
    c->cinfo.err = jpeg_std_error(&c->pub);
    c->pub.error_exit = jpeg_on_error;
    c->pub.emit_message = jpeg_on_message;
    c->pub.output_message = jpeg_on_output;
    int r = jpeg_decode_inner(c, img, buf, len);
    if (r < 0)
        s = error_set(e, CELER_STATUS_BAD_FILE, "%s: JPEG: %s", label, c->msg);
    else if (r > 0)
        s = c->status;
    if (c->created) jpeg_destroy_decompress(&c->cinfo);
    free(c->line);
    free(c);
    if (s != CELER_OK) image_free(img);
    return s;
}

/* ==== Entry points ==== */

celer_status image_decode(image_rgb *img, const char *label, const uint8_t *buf, size_t len,
                          celer_error *e) {
    memset(img, 0, sizeof *img);
    if (!buf || len == 0)
        return error_set(e, CELER_STATUS_BAD_FILE, "%s: empty image data (0 bytes)", label);
    switch (image_sniff(buf, len)) {
    case IMAGE_FORMAT_PNG:
        return png_decode(img, label, buf, len, e);
    case IMAGE_FORMAT_JPEG:
        return jpeg_decode(img, label, buf, len, e);
    default:
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: not an image: expected a PNG or JPEG signature, found bytes "
                         "%02x %02x %02x %02x",
                         label, buf[0], len > 1 ? buf[1] : 0, len > 2 ? buf[2] : 0,
                         len > 3 ? buf[3] : 0);
    }
}

celer_status image_load(image_rgb *img, const char *path, celer_error *e) {
    mapped_file f;
    memset(img, 0, sizeof *img);
    celer_status s = mapped_file_open(path, &f, e);
    if (s != CELER_OK) return s;
    s = image_decode(img, path, f.data, f.size, e);
    mapped_file_close(&f);
    return s;
}

void image_free(image_rgb *img) {
    free(img->data);
    memset(img, 0, sizeof *img);
}
