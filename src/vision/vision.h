/*
 * vision.h - image preprocessing: decoded RGB -> pixel tensor, equal to what transformers
 * 5.23.0's image processors (torchvision backend, the default of AutoImageProcessor) produce
 * for the two kinds celer runs: LlavaNextImageProcessor ("anyres" tiles, plus the prompt
 * arithmetic of LlavaNextProcessor) and Gemma3ImageProcessor (the whole image, and with pan
 * and scan its crops, each resized to size).
 *
 *     vision_config cfg;
 *     if (vision_config_load(&cfg, "llava-v1.6-mistral-7b-hf", &e) != CELER_OK) ...
 *     vision_layout lay;
 *     float *px;  // [lay.n_tiles, 3, lay.out_h, lay.out_w]: base image, then tiles row-major
 *     if (vision_preprocess(&px, &lay, &cfg, &img, &e) != CELER_OK) ...
 *     vision_features f;
 *     vision_feature_count(&f, &cfg, img.height, img.width, &e);  // f.n_tokens <image> slots
 *     free(px);
 *
 * The steps, each as transformers runs it, on uint8 until the last one:
 *   1. best resolution among image_grid_pinpoints (select_best_resolution);
 *   2. aspect-preserving resize to fit it (get_patch_output_size), bicubic with antialias;
 *   3. zero (black) padding around it, centred, the odd pixel right/bottom;
 *   4. tiles of crop_size.height, row-major; the whole image resized to size first;
 *   5. per tile: resize (size), center crop (crop_size), then float32 rescale + normalize,
 *      fused as transformers fuses them: (x - mean/rf) / (std/rf) in float32.
 * Resampling replicates torch's uint8 antialiased kernel (the one torchvision calls for uint8
 * images on CPU): PIL-style support and centering, double weights normalized per output
 * sample, rescaled to int16 with a precision chosen from the largest weight, integer dot
 * products rounded and clamped to 0..255, a horizontal pass then a vertical pass through a
 * uint8 intermediate, each pass skipped when its size does not change.
 *
 * Gemma3ImageProcessor: the whole image resized to size (bilinear, the same uint8 kernel),
 * then, with do_pan_and_scan, its crops (Gemma3ImageProcessor.pan_and_scan_batched: a row or
 * a column of ceil(side / n) pixel crops, the last cut by the image's edge, when the aspect
 * ratio reaches pan_and_scan_min_ratio_to_activate), each resized to size; then rescale and
 * normalize as above. Pan and scan reads its four settings from the file (null keeps
 * Gemma3Processor's defaults: off, 256, 4, 1.2); transformers' Gemma3Processor itself applies
 * its own defaults over the file unless its caller passes them.
 *
 * It knows no model weights and no tensors beyond the float buffer it returns.
 */
#ifndef CELER_VISION_VISION_H
#define CELER_VISION_VISION_H

#include "base/error.h"
#include "io/image.h"

#include <stdbool.h>
#include <stdint.h>

#define VISION_MAX_PINPOINTS 64

typedef enum vision_resample {
    VISION_RESAMPLE_BILINEAR = 2, /* PIL's enum values, as preprocessor_config.json stores them */
    VISION_RESAMPLE_BICUBIC = 3,
} vision_resample;

typedef enum vision_feature_strategy {
    VISION_FEATURES_DEFAULT, /* "default": the vision tower's CLS position is dropped */
    VISION_FEATURES_FULL,    /* "full": every position kept */
} vision_feature_strategy;

typedef enum vision_processor {
    VISION_LLAVA_NEXT, /* LlavaNextImageProcessor */
    VISION_GEMMA3,     /* Gemma3ImageProcessor */
} vision_processor;

/* The image processor's settings (preprocessor_config.json, or processor_config.json's
 * "image_processor") and the processor's (processor_config.json / config.json). */
typedef struct vision_config {
    vision_processor kind;
    bool do_resize, do_center_crop, do_rescale, do_normalize;
    int64_t size_shortest_edge; /* size.shortest_edge, 0 when size gives height and width */
    int64_t size_h, size_w;     /* size.height/width, 0 when size gives shortest_edge */
    int64_t crop_h, crop_w;     /* crop_size; crop_h is also the tile side */
    vision_resample resample;
    double rescale_factor;
    double image_mean[3], image_std[3];
    int n_pinpoints;
    int64_t pinpoints[VISION_MAX_PINPOINTS][2]; /* image_grid_pinpoints, (height, width) */
    /* Prompt arithmetic (LlavaNextProcessor). */
    int64_t patch_size;                  /* vision tower patch side, 0 when unknown */
    int64_t num_additional_image_tokens; /* e.g. 1 for CLIP's CLS */
    vision_feature_strategy strategy;
    /* Gemma 3's pan and scan */
    bool do_pan_and_scan;
    int64_t pas_min_crop;  /* pan_and_scan_min_crop_size */
    int64_t pas_max_crops; /* pan_and_scan_max_num_crops */
    double pas_min_ratio;  /* pan_and_scan_min_ratio_to_activate */
} vision_config;

/* Where each piece of the image goes; all sizes in pixels. */
typedef struct vision_layout {
    int64_t image_h, image_w;     /* the input (transformers' image_sizes entry) */
    int64_t best_h, best_w;       /* the chosen pinpoint */
    int64_t resized_h, resized_w; /* the image resized into it, aspect kept */
    int64_t pad_top, pad_left;    /* its offset inside best_h x best_w; zeros around */
    int64_t tile;                 /* tile side before the per-tile resize/crop (crop_h) */
    int64_t grid_rows, grid_cols; /* tiles per column and per row: ceil(best / tile) */
    int64_t n_tiles;              /* 1 + grid_rows * grid_cols, the base image first */
    int64_t out_h, out_w;         /* every tile's final size */
    int64_t crop_h, crop_w;       /* Gemma 3: each pan-and-scan crop's size before the resize
                                     (grid_rows x grid_cols of them; 0 x 0: none), the last
                                     row and column cut by the image's edge */
} vision_layout;

/* Feature positions of one image in the language model's input (LlavaNextProcessor's
 * _get_number_of_features and the model's unpad_image / get_anyres_image_grid_shape). */
typedef struct vision_features {
    int64_t grid_rows, grid_cols;   /* best_h / out_h, best_w / out_w (tiles down, across) */
    int64_t patches_h, patches_w;   /* feature rows and columns per tile: out / patch_size */
    int64_t unpadded_h, unpadded_w; /* feature rows and columns of the tiled grid once the
                                       rows/columns that only saw padding are cut */
    int64_t n_base;                 /* patches_h * patches_w + num_additional_image_tokens */
    int64_t n_unpadded;             /* unpadded_h * unpadded_w */
    int64_t n_newline;              /* one image_newline per unpadded row: unpadded_h */
    int64_t n_tokens;               /* n_base + n_unpadded + n_newline, minus 1 for "default" */
} vision_features;

/* LlavaNextImageProcessor's class defaults (shortest_edge 224, crop 224, CLIP mean/std,
 * bicubic, 1/255, every do_* on, the llava-v1.6 pinpoints), patch 0, no extra tokens,
 * strategy "default". */
void vision_config_default(vision_config *cfg);
/* Gemma3ImageProcessor's class defaults (224 x 224, bilinear, mean and std 0.5, 1/255, no
 * center crop) and Gemma3Processor's for pan and scan (off, 256, 4, 1.2). */
void vision_config_default_gemma3(vision_config *cfg);

/* Reads dir/processor_config.json ("image_processor" when present, plus patch_size,
 * num_additional_image_tokens, vision_feature_select_strategy), else
 * dir/preprocessor_config.json, then dir/config.json for what those lack
 * (image_grid_pinpoints, vision_config.patch_size, vision_feature_select_strategy). Missing
 * keys keep the defaults (those of kind's processor); a value of the wrong type or range is
 * CELER_STATUS_BAD_CONFIG naming the file and key; pinpoints given in both files must agree;
 * an image_processor_type of another kind is refused. At least one of the two processor files
 * must exist (CELER_STATUS_IO otherwise). */
celer_status vision_config_load(vision_config *cfg, const char *dir, vision_processor kind,
                                celer_error *e);

/* Parses one image-processor JSON object (the text of preprocessor_config.json) over cfg's
 * current values; label names it in messages. */
celer_status vision_config_parse(vision_config *cfg, const char *label, const char *json,
                                 celer_error *e);

/* Checks cfg's values (positive sizes, nonzero std, pinpoints present and in range for
 * LLaVA-NeXT, pan-and-scan settings in range for Gemma 3, a supported resample);
 * CELER_STATUS_BAD_CONFIG naming label and the field otherwise. */
celer_status vision_config_check(const vision_config *cfg, const char *label, celer_error *e);

/* select_best_resolution: the pinpoint (height, width) that keeps the most of an
 * image_h x image_w image and wastes the least; CELER_STATUS_INVALID_ARGUMENT when every
 * pinpoint would scale the image to nothing. */
celer_status vision_best_resolution(int64_t *best_h, int64_t *best_w, const vision_config *cfg,
                                    int64_t image_h, int64_t image_w, celer_error *e);

/* The layout for an image_h x image_w image (no pixels touched). */
celer_status vision_layout_compute(vision_layout *lay, const vision_config *cfg, int64_t image_h,
                                   int64_t image_w, celer_error *e);

/* Preprocesses img: *pixel_values (malloc'd, the caller frees) gets
 * [lay->n_tiles, 3, lay->out_h, lay->out_w] float32, the base image then the tiles row-major;
 * *lay describes it. On failure *pixel_values is NULL. */
celer_status vision_preprocess(float **pixel_values, vision_layout *lay, const vision_config *cfg,
                               const image_rgb *img, celer_error *e);

/* The number of <image> positions for an image_h x image_w image, with the grid and the
 * unpadded feature size the model needs; needs cfg->patch_size. */
celer_status vision_feature_count(vision_features *f, const vision_config *cfg, int64_t image_h,
                                  int64_t image_w, celer_error *e);

/* One resampling pass pair on interleaved 8-bit pixels (c channels): dst[dh, dw, c] from
 * src[sh, sw, c], with torch's antialiased uint8 kernel. dst must not overlap src. Exposed
 * for tests; CELER_STATUS_OUT_OF_MEMORY is its only failure. */
celer_status vision_resize_u8(uint8_t *dst, int64_t dw, int64_t dh, const uint8_t *src, int64_t sw,
                              int64_t sh, int c, vision_resample filter, celer_error *e);

#endif
