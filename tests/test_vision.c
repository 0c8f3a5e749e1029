/*
 * test_vision.c - image decoding and LLaVA-NeXT and Gemma 3 preprocessing against transformers.
 *
 * Goldens (tests/fixtures/vision, made by tools/make_vision_goldens.py): the RGB pixels
 * Pillow + transformers' convert_to_rgb give for each test image, the pixel_values of
 * transformers' LlavaNextImageProcessor for each (config, image) case, and the processor's
 * <image> token counts with the model's grid and unpadded sizes. The .xz goldens are
 * decompressed into build/vision. Also: bad images (each one error with one line naming the
 * problem), bad configs, and a negative control (a wrong filter must fail the tolerance).
 */
#define _DEFAULT_SOURCE
#include "harness.h"
#include "io/image.h"
#include "vision/vision.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define GOLDEN_DIR "vision"
#define OUT_DIR    "build/vision"
#define TOL        1e-4

/* ==== Golden container (see write_goldens_xz in the generator) ==== */

typedef struct golden {
    char name[128];
    int dtype; /* 0 uint8, 1 float32 */
    int ndim;
    int64_t dims[8];
    int64_t count;
    const uint8_t *data;
} golden;

typedef struct golden_set {
    uint8_t *buf;
    golden items[128];
    int n;
} golden_set;

/* dst from the .xz src unless dst is at least as new (through a temporary and a rename). */
static bool unxz(const char *src, const char *dst) {
    struct stat s, d;
    if (stat(dst, &d) == 0 && stat(src, &s) == 0 && d.st_mtime >= s.st_mtime) return true;
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && xz -dc '%s' > '%s.%d.tmp' && mv -f '%s.%d.tmp' '%s'",
             OUT_DIR, src, dst, (int)getpid(), dst, (int)getpid(), dst);
    int rc = system(cmd);
    return rc == 0;
}

static uint8_t *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) free(buf), buf = NULL;
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static bool golden_load(golden_set *g, const char *xz_name) {
    char src[4200], dst[512];
    snprintf(src, sizeof src, "%s/%s", fixture_path(GOLDEN_DIR), xz_name);
    snprintf(dst, sizeof dst, "%s/%.*s", OUT_DIR, (int)(strlen(xz_name) - 3), xz_name);
    memset(g, 0, sizeof *g);
    if (!CHECK(unxz(src, dst), "decompress %s into %s (is xz-utils installed?)", src, dst))
        return false;
    size_t len = 0;
    g->buf = read_all(dst, &len);
    if (!CHECK(g->buf && len >= 8 && !memcmp(g->buf, "CLRVIS1\n", 8), "%s: magic", dst))
        return false;
    size_t off = 8;
    while (off < len) {
        golden *it = &g->items[g->n];
        if (!CHECK(g->n < 128 && len - off >= 4, "%s: record %d header", dst, g->n)) return false;
        uint32_t nl = rd32(g->buf + off);
        off += 4;
        if (!CHECK(nl < sizeof it->name && len - off >= nl + 5, "%s: record name", dst))
            return false;
        memcpy(it->name, g->buf + off, nl);
        off += nl;
        it->dtype = g->buf[off];
        it->ndim = (int)rd32(g->buf + off + 1);
        off += 5;
        if (!CHECK(it->ndim <= 8 && len - off >= 4u * (size_t)it->ndim, "%s: dims", dst))
            return false;
        it->count = 1;
        for (int i = 0; i < it->ndim; i++, off += 4) {
            it->dims[i] = rd32(g->buf + off);
            it->count *= it->dims[i];
        }
        size_t bytes = (size_t)it->count * (it->dtype ? 4 : 1);
        if (!CHECK(len - off >= bytes, "%s: %s: data", dst, it->name)) return false;
        it->data = g->buf + off;
        off += bytes;
        g->n++;
    }
    return true;
}

static const golden *golden_find(const golden_set *g, const char *name) {
    for (int i = 0; i < g->n; i++)
        if (!strcmp(g->items[i].name, name)) return &g->items[i];
    return NULL;
}

static const char *image_path(const char *name) {
    static char path[4200];
    snprintf(path, sizeof path, "%s/images/%s", fixture_path(GOLDEN_DIR), name);
    return path;
}

static uint64_t fnv1a64(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* ==== Decoding against Pillow ==== */

static void check_decoded(const golden_set *dec, const json_t *digests) {
    int n_exact = 0;
    for (int i = 0; i < dec->n; i++) {
        const golden *gd = &dec->items[i];
        image_rgb img;
        celer_error e;
        if (!CHECK(image_load(&img, image_path(gd->name), &e) == CELER_OK, "%s: %s", gd->name,
                   e.msg))
            continue;
        if (CHECK(gd->ndim == 3 && img.height == gd->dims[0] && img.width == gd->dims[1],
                  "%s: size %lldx%lld, golden %lldx%lld", gd->name, (long long)img.width,
                  (long long)img.height, (long long)gd->dims[1], (long long)gd->dims[0])) {
            int maxd = 0;
            int64_t n_diff = 0;
            for (int64_t k = 0; k < gd->count; k++) {
                int d = abs((int)img.data[k] - (int)gd->data[k]);
                maxd = d > maxd ? d : maxd;
                n_diff += d != 0;
            }
            printf("  decode %-26s %4lldx%-4lld max |diff| %d (%lld of %lld values differ)\n",
                   gd->name, (long long)img.width, (long long)img.height, maxd, (long long)n_diff,
                   (long long)gd->count);
            n_exact += CHECK(maxd == 0, "%s: decoded pixels differ from Pillow's (max %d)",
                             gd->name, maxd);
        }
        image_free(&img);
    }
    CHECK(n_exact >= 30, "at least 30 images decode exactly as Pillow (%d)", n_exact);
    const char *name;
    const json_t *v;
    int n_digest = 0;
    json_object_foreach((json_t *)digests, name, v) {
        image_rgb img;
        celer_error e;
        if (!CHECK(image_load(&img, image_path(name), &e) == CELER_OK, "%s: %s", name, e.msg))
            continue;
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx",
                 (unsigned long long)fnv1a64(img.data, (size_t)(img.width * img.height * 3)));
        const char *want = json_string_value(json_object_get(v, "fnv1a64"));
        printf("  decode %-26s %4lldx%-4lld digest %s (golden %s)\n", name, (long long)img.width,
               (long long)img.height, hex, want ? want : "?");
        n_digest += CHECK(want && !strcmp(hex, want) &&
                              img.height == json_integer_value(json_object_get(v, "height")) &&
                              img.width == json_integer_value(json_object_get(v, "width")),
                          "%s: decoded bytes differ from Pillow's", name);
        image_free(&img);
    }
    CHECK(n_digest >= 2, "the large images are checked by digest (%d)", n_digest);
}

/* ==== Preprocessing against transformers ==== */

static void check_case(const json_t *c, const golden_set *px) {
    const char *key = json_string_value(json_object_get(c, "key"));
    const char *img_name = json_string_value(json_object_get(c, "image"));
    const char *cfg_name = json_string_value(json_object_get(c, "config"));
    if (!CHECK(key && img_name && cfg_name, "cases.json: a case lacks key/image/config")) return;
    const golden *g = golden_find(px, key);
    if (!CHECK(g && g->dtype == 1 && g->ndim == 4, "%s: pixel golden missing", key)) return;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/configs/%s", fixture_path(GOLDEN_DIR), cfg_name);
    vision_config cfg;
    image_rgb img = {0};
    float *out = NULL, *want = NULL;
    celer_error e;
    if (!CHECK(vision_config_load(&cfg, dir, VISION_LLAVA_NEXT, &e) == CELER_OK, "%s: config: %s",
               key, e.msg) ||
        !CHECK(image_load(&img, image_path(img_name), &e) == CELER_OK, "%s: %s", key, e.msg))
        goto out;
    vision_layout lay;
    if (!CHECK(vision_preprocess(&out, &lay, &cfg, &img, &e) == CELER_OK, "%s: %s", key, e.msg))
        goto out;
    const json_t *sizes = json_object_get(c, "image_sizes");
    CHECK(lay.image_h == json_integer_value(json_array_get(sizes, 0)) &&
              lay.image_w == json_integer_value(json_array_get(sizes, 1)),
          "%s: image_sizes %lldx%lld", key, (long long)lay.image_h, (long long)lay.image_w);
    if (!CHECK(lay.n_tiles == g->dims[0] && g->dims[1] == 3 && lay.out_h == g->dims[2] &&
                   lay.out_w == g->dims[3],
               "%s: pixel_values [%lld, 3, %lld, %lld], golden [%lld, %lld, %lld, %lld]", key,
               (long long)lay.n_tiles, (long long)lay.out_h, (long long)lay.out_w,
               (long long)g->dims[0], (long long)g->dims[1], (long long)g->dims[2],
               (long long)g->dims[3]))
        goto out;
    /* The container does not align its arrays: copy the golden out. */
    if (!CHECK((want = malloc(sizeof *want * (size_t)g->count)) != NULL, "%s: memory", key))
        goto out;
    memcpy(want, g->data, sizeof *want * (size_t)g->count);
    double d = max_abs_diff(out, want, g->count);
    printf("  %-26s [%lld, 3, %lld, %lld] max |diff| %.3g\n", key, (long long)lay.n_tiles,
           (long long)lay.out_h, (long long)lay.out_w, d);
    CHECK(d <= TOL, "%s: pixel_values differ from transformers by %g (tolerance %g)", key, d, TOL);
    vision_features f;
    if (CHECK(vision_feature_count(&f, &cfg, img.height, img.width, &e) == CELER_OK, "%s: %s", key,
              e.msg)) {
        const json_t *grid = json_object_get(c, "grid"), *unp = json_object_get(c, "unpadded");
        CHECK(f.n_tokens == json_integer_value(json_object_get(c, "n_tokens")),
              "%s: %lld image tokens, transformers %lld", key, (long long)f.n_tokens,
              (long long)json_integer_value(json_object_get(c, "n_tokens")));
        CHECK(f.grid_rows == json_integer_value(json_array_get(grid, 0)) &&
                  f.grid_cols == json_integer_value(json_array_get(grid, 1)),
              "%s: grid %lldx%lld", key, (long long)f.grid_rows, (long long)f.grid_cols);
        CHECK(f.unpadded_h == json_integer_value(json_array_get(unp, 0)) &&
                  f.unpadded_w == json_integer_value(json_array_get(unp, 1)),
              "%s: unpadded %lldx%lld", key, (long long)f.unpadded_h, (long long)f.unpadded_w);
    }
    /* Negative control on the first tile-bearing case of each config: the other filter must
     * be far outside the tolerance. */
    if (!strcmp(img_name, "wide.png") || !strcmp(img_name, "llava.jpg")) {
        vision_config wrong = cfg;
        wrong.resample = cfg.resample == VISION_RESAMPLE_BICUBIC ? VISION_RESAMPLE_BILINEAR
                                                                 : VISION_RESAMPLE_BICUBIC;
        float *w = NULL;
        if (CHECK(vision_preprocess(&w, &lay, &wrong, &img, &e) == CELER_OK, "%s: %s", key,
                  e.msg)) {
            double dw = max_abs_diff(w, want, g->count);
            printf("  %-26s with the other filter: max |diff| %.3g (must fail)\n", key, dw);
            CHECK(dw > 100 * TOL, "%s: the wrong filter passes (%g)", key, dw);
        }
        free(w);
    }
out:
    free(out), free(want);
    image_free(&img);
}

/* ==== Bad images ==== */

static uint32_t crc32_png(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    }
    return ~c;
}

static void put32be(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8),
    p[3] = (uint8_t)v;
}

/* A PNG's IHDR width and height replaced (the CRC fixed up); buf is a whole PNG file. */
static void png_set_size(uint8_t *buf, uint32_t w, uint32_t h) {
    put32be(buf + 16, w);
    put32be(buf + 20, h);
    put32be(buf + 29, crc32_png(buf + 12, 17));
}

/* A JPEG's first SOFn height and width replaced. */
static bool jpeg_set_size(uint8_t *buf, size_t len, uint16_t w, uint16_t h) {
    for (size_t i = 2; i + 9 < len;) {
        if (buf[i] != 0xff) return false;
        uint8_t m = buf[i + 1];
        size_t seg = (size_t)buf[i + 2] << 8 | buf[i + 3];
        if (m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc) {
            buf[i + 5] = (uint8_t)(h >> 8), buf[i + 6] = (uint8_t)h;
            buf[i + 7] = (uint8_t)(w >> 8), buf[i + 8] = (uint8_t)w;
            return true;
        }
        i += 2 + seg;
    }
    return false;
}

static void expect_bad(const char *what, const uint8_t *buf, size_t len, celer_status want,
                       const char *needle) {
    image_rgb img;
    celer_error e = {{0}};
    celer_status s = image_decode(&img, what, buf, len, &e);
    printf("  bad image %-22s -> %s\n", what, e.msg);
    CHECK(s == want, "%s: status %s, expected %s", what, celer_status_str(s),
          celer_status_str(want));
    CHECK(img.data == NULL && img.width == 0 && img.height == 0, "%s: image left set", what);
    CHECK(strstr(e.msg, what) && strstr(e.msg, needle) && !strchr(e.msg, '\n'),
          "%s: message should name it and say \"%s\" on one line: %s", what, needle, e.msg);
    if (s == CELER_OK) image_free(&img);
}

static void check_bad_images(void) {
    size_t png_len = 0, jpg_len = 0, prog_len = 0;
    uint8_t *png = read_all(image_path("wide.png"), &png_len);
    uint8_t *jpg = read_all(image_path("wide.jpg"), &jpg_len);
    uint8_t *prog = read_all(image_path("progressive.jpg"), &prog_len);
    if (!CHECK(png && jpg && prog, "test images readable")) goto out;
    expect_bad("empty", png, 0, CELER_STATUS_BAD_FILE, "empty");
    const char *text = "GIF89a is not supported and this is text anyway";
    expect_bad("not-an-image", (const uint8_t *)text, strlen(text), CELER_STATUS_BAD_FILE,
               "not an image");
    expect_bad("png-signature-only", png, 8, CELER_STATUS_BAD_FILE, "truncated");
    expect_bad("png-truncated", png, png_len / 2, CELER_STATUS_BAD_FILE, "truncated");
    expect_bad("jpeg-truncated", jpg, jpg_len / 2, CELER_STATUS_BAD_FILE, "truncated");
    expect_bad("jpeg-progressive-cut", prog, prog_len * 2 / 3, CELER_STATUS_BAD_FILE, "truncated");
    expect_bad("jpeg-soi-only", jpg, 3, CELER_STATUS_BAD_FILE, "JPEG: truncated");
    uint8_t *m = malloc(png_len > jpg_len ? png_len : jpg_len);
    memcpy(m, png, png_len);
    png_set_size(m, 0, 40);
    expect_bad("png-w0", m, png_len, CELER_STATUS_BAD_FILE, "zero image size 0x40");
    png_set_size(m, 20000, 10);
    expect_bad("png-20000x10", m, png_len, CELER_STATUS_BAD_FILE, "20000x10 exceeds the limit");
    png_set_size(m, 10000, 10000);
    expect_bad("png-100mpx", m, png_len, CELER_STATUS_BAD_FILE, "10000x10000 exceeds the limit");
    png_set_size(m, 4000, 4000);
    expect_bad("png-lies-about-size", m, png_len, CELER_STATUS_BAD_FILE, "cannot hold a 4000x4000");
    memcpy(m, png, png_len);
    m[png_len / 2] ^= 0x55; /* inside IDAT: the chunk CRC no longer matches */
    expect_bad("png-corrupt", m, png_len, CELER_STATUS_BAD_FILE, "PNG: IDAT");
    memcpy(m, jpg, jpg_len);
    CHECK(jpeg_set_size(m, jpg_len, 20000, 40), "SOF found");
    expect_bad("jpeg-20000x40", m, jpg_len, CELER_STATUS_BAD_FILE, "20000x40 exceeds the limit");
    jpeg_set_size(m, jpg_len, 90, 0);
    expect_bad("jpeg-h0", m, jpg_len, CELER_STATUS_BAD_FILE, "Empty JPEG image");
    memcpy(m, jpg, jpg_len);
    memset(m + 20, 0xff, 40); /* a header full of fill bytes */
    expect_bad("jpeg-garbage-header", m, jpg_len, CELER_STATUS_BAD_FILE, "JPEG: ");
    free(m);
    image_rgb img;
    celer_error e;
    CHECK(image_load(&img, "build/vision/no-such-file.png", &e) == CELER_STATUS_IO &&
              strstr(e.msg, "no-such-file.png"),
          "missing file: %s", e.msg);
out:
    free(png), free(jpg), free(prog);
}

/* ==== Bad configs and the arithmetic ==== */

static void expect_bad_config(const char *json, const char *needle) {
    vision_config cfg;
    celer_error e = {{0}};
    vision_config_default(&cfg);
    celer_status s = vision_config_parse(&cfg, "preprocessor_config.json", json, &e);
    printf("  bad config -> %s\n", e.msg);
    CHECK(s == CELER_STATUS_BAD_CONFIG && strstr(e.msg, needle) && !strchr(e.msg, '\n'),
          "config %s: expected BAD_CONFIG naming %s, got %s: %s", json, needle, celer_status_str(s),
          e.msg);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

static void check_configs(void) {
    expect_bad_config("{\"image_std\": [0, 1, 1]}", "preprocessor_config.json: image_std[0] = 0");
    expect_bad_config("{\"image_mean\": [0.5, 0.5]}", "image_mean");
    expect_bad_config("{\"crop_size\": {\"height\": -3, \"width\": 4}}", "crop_size");
    expect_bad_config("{\"size\": {\"longest\": 3}}", "size");
    expect_bad_config("{\"resample\": 1}", "resample");
    expect_bad_config("{\"rescale_factor\": 0}", "rescale_factor");
    expect_bad_config("{\"image_grid_pinpoints\": [[336, 672], [672]]}", "image_grid_pinpoints");
    expect_bad_config("{\"image_grid_pinpoints\": []}", "image_grid_pinpoints");
    expect_bad_config("{\"do_resize\": \"yes\"}", "do_resize");
    expect_bad_config("{\"crop_size\": 8000, \"image_grid_pinpoints\": [[8000, 8000]]}",
                      "more than");
    expect_bad_config("{\"crop_size\": 336,", "line 1");
    vision_config cfg;
    celer_error e;
    vision_config_default(&cfg);
    CHECK(vision_config_parse(&cfg, "p", "{\"do_convert_rgb\": false}", &e) ==
                  CELER_STATUS_UNSUPPORTED &&
              strstr(e.msg, "do_convert_rgb"),
          "do_convert_rgb false: %s", e.msg);
    /* Pinpoints in both files must agree; a directory without processor files is an IO
     * error. */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/cfg-disagree %s/cfg-none", OUT_DIR, OUT_DIR);
    CHECK(system(cmd) == 0, "mkdir");
    write_file(OUT_DIR "/cfg-disagree/preprocessor_config.json",
               "{\"image_grid_pinpoints\": [[56, 112]], \"crop_size\": 56}");
    write_file(OUT_DIR "/cfg-disagree/config.json", "{\"image_grid_pinpoints\": [[112, 56]]}");
    CHECK(vision_config_load(&cfg, OUT_DIR "/cfg-disagree", VISION_LLAVA_NEXT, &e) ==
                  CELER_STATUS_BAD_CONFIG &&
              strstr(e.msg, "image_grid_pinpoints differ"),
          "disagreeing pinpoints: %s", e.msg);
    CHECK(vision_config_load(&cfg, OUT_DIR "/cfg-none", VISION_LLAVA_NEXT, &e) == CELER_STATUS_IO &&
              strstr(e.msg, "preprocessor_config.json"),
          "no processor files: %s", e.msg);
    /* transformers 5 nests the image processor in processor_config.json; it wins over
     * preprocessor_config.json, and the processor's own keys sit beside it. */
    snprintf(cmd, sizeof cmd, "mkdir -p %s/cfg-nested", OUT_DIR);
    CHECK(system(cmd) == 0, "mkdir");
    write_file(OUT_DIR "/cfg-nested/processor_config.json",
               "{\"image_processor\": {\"crop_size\": {\"height\": 42, \"width\": 40}, "
               "\"size\": {\"height\": 44, \"width\": 46}, \"resample\": 2, "
               "\"image_grid_pinpoints\": [[84, 42]]}, \"patch_size\": 7, "
               "\"num_additional_image_tokens\": 1, \"vision_feature_select_strategy\": \"full\"}");
    write_file(OUT_DIR "/cfg-nested/preprocessor_config.json", "{\"crop_size\": 99}");
    write_file(OUT_DIR "/cfg-nested/config.json",
               "{\"vision_config\": {\"patch_size\": 3}, "
               "\"vision_feature_select_strategy\": \"default\"}");
    CHECK(vision_config_load(&cfg, OUT_DIR "/cfg-nested", VISION_LLAVA_NEXT, &e) == CELER_OK &&
              cfg.crop_h == 42 && cfg.crop_w == 40 && cfg.size_shortest_edge == 0 &&
              cfg.size_h == 44 && cfg.size_w == 46 && cfg.resample == VISION_RESAMPLE_BILINEAR &&
              cfg.n_pinpoints == 1 && cfg.pinpoints[0][0] == 84 && cfg.patch_size == 7 &&
              cfg.num_additional_image_tokens == 1 && cfg.strategy == VISION_FEATURES_FULL,
          "nested processor config: %s", e.msg);
    /* The llava-v1.6 defaults: best resolution and token counts by hand. A 336x672 pinpoint
     * for a 2:1 picture; 24x24 patches per tile, 1x2 tiles, no padding rows to cut. */
    vision_config_default(&cfg);
    cfg.size_shortest_edge = cfg.crop_h = cfg.crop_w = 336;
    cfg.patch_size = 14;
    cfg.num_additional_image_tokens = 1;
    int64_t bh = 0, bw = 0;
    CHECK(vision_best_resolution(&bh, &bw, &cfg, 300, 600, &e) == CELER_OK && bh == 336 &&
              bw == 672,
          "best resolution of 600x300: %lldx%lld", (long long)bw, (long long)bh);
    vision_features f;
    CHECK(vision_feature_count(&f, &cfg, 336, 672, &e) == CELER_OK && f.grid_rows == 1 &&
              f.grid_cols == 2 && f.unpadded_h == 24 && f.unpadded_w == 48 &&
              f.n_tokens == 576 + 24 * 48 + 24,
          "672x336 image: %lld tokens, grid %lldx%lld, unpadded %lldx%lld", (long long)f.n_tokens,
          (long long)f.grid_rows, (long long)f.grid_cols, (long long)f.unpadded_h,
          (long long)f.unpadded_w);
    cfg.strategy = VISION_FEATURES_FULL;
    CHECK(vision_feature_count(&f, &cfg, 336, 672, &e) == CELER_OK &&
              f.n_tokens == 577 + 24 * 48 + 24,
          "full: %lld", (long long)f.n_tokens);
    vision_layout lay;
    vision_config big = cfg;
    big.size_shortest_edge = 4000;
    big.crop_h = big.crop_w = 4000;
    big.pinpoints[0][0] = big.pinpoints[0][1] = 4000;
    big.n_pinpoints = 1;
    CHECK(vision_layout_compute(&lay, &big, 100, 100, &e) == CELER_STATUS_BAD_CONFIG &&
              strstr(e.msg, "exceed"),
          "a layout above the pixel limit: %s", e.msg);
    cfg.patch_size = 0;
    CHECK(vision_feature_count(&f, &cfg, 336, 672, &e) == CELER_STATUS_BAD_CONFIG &&
              strstr(e.msg, "patch_size"),
          "no patch size: %s", e.msg);
}

/* ==== Gemma 3 ==== */

/* Gemma3ImageProcessor on the Gemma 3 fixtures' images (tools/make_gemma3_fixtures.py):
 * every case's pixel values (each image's whole picture, then its pan-and-scan crops, in
 * prompt order) equal transformers' exactly; the crops of a rejected filter do not. */
static void check_gemma3_pixels(const char *name) {
    char path[4400];
    const char *dir = fixture_path(name);
    snprintf(path, sizeof path, "%s/golden.json", dir);
    json_t *g = json_load_file(path, 0, NULL);
    vision_config cfg;
    celer_error e = {{0}};
    if (!CHECK(g != NULL, "%s: golden.json", name) ||
        !CHECK(vision_config_load(&cfg, dir, VISION_GEMMA3, &e) == CELER_OK, "%s: %s", name, e.msg))
        goto out;
    CHECK(cfg.kind == VISION_GEMMA3 &&
              cfg.do_pan_and_scan == json_is_true(json_object_get(g, "pan_and_scan")),
          "%s: Gemma 3 processor, pan and scan as the fixture has it", name);
    const json_t *cases = json_object_get(g, "cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i), *files = json_object_get(c, "images");
        const char *cname = json_string_value(json_object_get(c, "name"));
        int64_t gr, gc;
        snprintf(path, sizeof path, "%s/golden_pixels_%s.npy", dir, cname);
        float *gold = npy_read_f32(path, &gr, &gc);
        if (!CHECK(gold != NULL, "%s", path)) continue;
        int64_t at = 0, tiles = 0;
        double diff = 0, wrong = 0;
        for (size_t k = 0; k < json_array_size(files); k++) {
            image_rgb img;
            float *px = NULL;
            vision_layout lay;
            snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_array_get(files, k)));
            if (!CHECK(image_load(&img, path, &e) == CELER_OK, "%s", e.msg)) continue;
            if (CHECK(vision_preprocess(&px, &lay, &cfg, &img, &e) == CELER_OK, "%s: %s", path,
                      e.msg)) {
                const int64_t want_blocks =
                    json_integer_value(json_array_get(json_object_get(c, "blocks"), k));
                const int64_t m = lay.n_tiles * 3 * lay.out_h * lay.out_w;
                CHECK(lay.n_tiles == want_blocks && at + m <= gr * gc,
                      "%s/%s: %lld tiles, golden %lld", name, cname, (long long)lay.n_tiles,
                      (long long)want_blocks);
                if (at + m <= gr * gc) diff = fmax(diff, max_abs_diff(px, gold + at, m));
                /* bicubic instead of bilinear must be seen */
                vision_config bad = cfg;
                bad.resample = VISION_RESAMPLE_BICUBIC;
                float *w = NULL;
                vision_layout wl;
                if (vision_preprocess(&w, &wl, &bad, &img, &e) == CELER_OK && at + m <= gr * gc)
                    wrong = fmax(wrong, max_abs_diff(w, gold + at, m));
                free(w);
                at += m, tiles += lay.n_tiles;
            }
            free(px);
            image_free(&img);
        }
        CHECK(at == gr * gc, "%s/%s: %lld pixel values, golden %lld", name, cname, (long long)at,
              (long long)(gr * gc));
        CHECK(diff == 0, "%s/%s: pixel values differ from Gemma3ImageProcessor by %g", name, cname,
              diff);
        CHECK(wrong > 1e-2,
              "%s/%s: bicubic resampling gives the same pixels (%g): the check cannot fail", name,
              cname, wrong);
        printf("  %s/%s: %lld tiles, pixel values max diff %g (bicubic instead: %.3g)\n", name,
               cname, (long long)tiles, diff, wrong);
        free(gold);
    }
out:
    json_decref(g);
}

/* Gemma3ImageProcessor.pan_and_scan_batched's arithmetic by hand, and its settings. */
static void check_gemma3_layout(void) {
    vision_config cfg;
    vision_config_default_gemma3(&cfg);
    cfg.size_h = cfg.size_w = 896;
    cfg.do_pan_and_scan = true; /* min crop 256, at most 4 crops, ratio 1.2 */
    const struct {
        int64_t w, h, rows, cols, crop_w, crop_h;
    } cases[] = {
        {1000, 400, 1, 3, 334, 400},   /* ratio 2.5: 3 crops */
        {600, 400, 1, 2, 300, 400},    /* 1.5: 2 */
        {500, 480, 0, 0, 0, 0},        /* under 1.2: none */
        {300, 100, 0, 0, 0, 0},        /* 2 crops of 150 < 256: none */
        {400, 1000, 3, 1, 400, 334},   /* portrait */
        {2000, 300, 1, 4, 500, 300},   /* 6.7, by size 7: at most 4 */
        {1001, 1000, 0, 0, 0, 0},      /* square enough */
        {1201, 1000, 1, 2, 601, 1000}, /* 1.201 activates; round(1.7) = 2 */
    };
    celer_error e;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        vision_layout lay;
        const bool ok = vision_layout_compute(&lay, &cfg, cases[i].h, cases[i].w, &e) == CELER_OK;
        CHECK(ok && lay.grid_rows == cases[i].rows && lay.grid_cols == cases[i].cols &&
                  lay.crop_w == cases[i].crop_w && lay.crop_h == cases[i].crop_h &&
                  lay.n_tiles == 1 + cases[i].rows * cases[i].cols && lay.out_h == 896 &&
                  lay.out_w == 896,
              "pan and scan of %lldx%lld: %lldx%lld crops of %lldx%lld, expected %lldx%lld of "
              "%lldx%lld",
              (long long)cases[i].w, (long long)cases[i].h, (long long)lay.grid_rows,
              (long long)lay.grid_cols, (long long)lay.crop_w, (long long)lay.crop_h,
              (long long)cases[i].rows, (long long)cases[i].cols, (long long)cases[i].crop_w,
              (long long)cases[i].crop_h);
    }
    cfg.do_pan_and_scan = false;
    vision_layout lay;
    CHECK(vision_layout_compute(&lay, &cfg, 400, 1000, &e) == CELER_OK && lay.n_tiles == 1,
          "no pan and scan: 1 tile");
    /* settings: null keeps the processor's defaults; bad values and another processor are refused
     */
    vision_config_default_gemma3(&cfg);
    CHECK(vision_config_parse(&cfg, "p",
                              "{\"do_pan_and_scan\": null, \"pan_and_scan_min_crop_size\": null, "
                              "\"size\": {\"height\": 896, \"width\": 896}}",
                              &e) == CELER_OK &&
              !cfg.do_pan_and_scan && cfg.pas_min_crop == 256 && cfg.pas_max_crops == 4 &&
              cfg.pas_min_ratio == 1.2,
          "null pan-and-scan settings keep Gemma3Processor's defaults: %s", e.msg);
    const char *bad[][2] = {
        {"{\"do_pan_and_scan\": 1}", "do_pan_and_scan"},
        {"{\"pan_and_scan_min_crop_size\": 0}", "pan_and_scan_min_crop_size"},
        {"{\"pan_and_scan_min_ratio_to_activate\": -1}", "pan_and_scan_min_ratio_to_activate"},
        {"{\"size\": {\"shortest_edge\": 896}}", "Gemma3ImageProcessor"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        vision_config_default_gemma3(&cfg);
        const celer_status st =
            vision_config_parse(&cfg, "preprocessor_config.json", bad[i][0], &e);
        CHECK(st != CELER_OK && strstr(e.msg, bad[i][1]) && !strchr(e.msg, '\n'), "config %s: %s",
              bad[i][0], e.msg);
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/cfg-llava", OUT_DIR);
    CHECK(system(cmd) == 0, "mkdir");
    write_file(OUT_DIR "/cfg-llava/preprocessor_config.json",
               "{\"image_processor_type\": \"LlavaNextImageProcessor\"}");
    CHECK(vision_config_load(&cfg, OUT_DIR "/cfg-llava", VISION_GEMMA3, &e) ==
                  CELER_STATUS_BAD_CONFIG &&
              strstr(e.msg, "image_processor_type"),
          "another processor's settings for Gemma 3: %s", e.msg);
}

int main(void) {
    char path[4200];
    snprintf(path, sizeof path, "%s/cases.json", fixture_path(GOLDEN_DIR));
    json_error_t jerr;
    json_t *meta = json_load_file(path, 0, &jerr);
    golden_set dec = {0}, px = {0};
    if (CHECK(meta != NULL, "%s: %s (make the goldens with tools/make_vision_goldens.py)", path,
              jerr.text) &&
        golden_load(&dec, "decoded.bin.xz") && golden_load(&px, "pixels.bin.xz")) {
        check_decoded(&dec, json_object_get(meta, "decoded_digests"));
        const json_t *cases = json_object_get(meta, "cases");
        CHECK(json_array_size(cases) >= 30, "at least 30 preprocessing cases (%zu)",
              json_array_size(cases));
        for (size_t i = 0; i < json_array_size(cases); i++)
            check_case(json_array_get(cases, i), &px);
    }
    json_decref(meta);
    free(dec.buf), free(px.buf);
    check_bad_images();
    check_configs();
    check_gemma3_pixels("gemma3-vision-hf-bf16");
    check_gemma3_pixels("gemma3-vision-mlx-bf16");
    check_gemma3_layout();
    return harness_done("test_vision");
}
