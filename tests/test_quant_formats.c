/*
 * test_quant_formats.c - GGUF block formats read exactly as gguf-py reads them, MLX's
 * affine codes of every width exactly as mlx reads them.
 *
 * tests/quants/<type>.gguf holds random blocks of one ggml type in every matrix of a small
 * llama-arch model, and <type>.json what gguf-py's dequantize() returns for each matrix
 * (tools/make_quant_fixtures.py): the FNV-1a hash of all its float32 bytes and the bits of
 * its first row. Each matrix is bound as the models bind it, every row dequantized
 * (matview_row), and the two compared bit for bit. The matrix also keeps the file's bytes
 * within 5% (nothing widened to floats), and so does the CPU backend's packed layout of it
 * (the ratio printed per fixture); `celer convert` refuses the file in one line, and the
 * model's logits on the reference kernels and on the fast ones the CPU picks (packed
 * products) agree, and so do the device's (CELER_TEST_DEVICE, make test-cuda) at a decode's
 * few rows and a prefill's many. Once the fast kernels hold their packed copy, a GGUF file's
 * converted matrices leave memory, and come back bit for bit for a reference context.
 */
#define _DEFAULT_SOURCE /* mincore */
#include "harness.h"

#include "backend/cpu/pack.h"
#include "models/model.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uint64_t fnv1a64(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int64_t packed_total, file_total; /* over one fixture's matrices */

/* Bytes per 256 elements of a block type, as the file stores them. */
static int64_t file_bytes_256(const char *type) {
    return !strcmp(type, "q5_0")     ? 8 * 22
           : !strcmp(type, "q5_1")   ? 8 * 24
           : !strcmp(type, "q4_k")   ? 144
           : !strcmp(type, "q5_k")   ? 176
           : !strcmp(type, "q6_k")   ? 210
           : !strcmp(type, "q3_k")   ? 110
           : !strcmp(type, "q2_k")   ? 84
           : !strcmp(type, "iq4_nl") ? 8 * 18
           : !strcmp(type, "iq4_xs") ? 136
                                     : 0;
}

static void check_matrix(const celer_model *m, const char *type, const char *name, json_t *want) {
    char module[256];
    snprintf(module, sizeof module, "%.*s", (int)(strlen(name) - strlen(".weight")), name);
    const int64_t rows = json_integer_value(json_object_get(want, "rows")),
                  cols = json_integer_value(json_object_get(want, "cols"));
    matview w;
    celer_error e = {{0}};
    if (!CHECK(bind_matrix(m, module, rows, cols, &w, &e) == CELER_OK, "%s %s: %s", type, name,
               e.msg))
        return;
    float *row = malloc(sizeof(float) * (size_t)cols);
    uint64_t h = 0xcbf29ce484222325ull;
    int64_t first_bad = -1;
    json_t *row0 = json_object_get(want, "row0_bits");
    for (int64_t r = 0; r < rows; r++) {
        matview_row(row, &w, r);
        h = fnv1a64(h, row, sizeof(float) * (size_t)cols);
        for (int64_t c = 0; r == 0 && c < cols && first_bad < 0; c++) {
            uint32_t bits;
            memcpy(&bits, &row[c], 4);
            if (bits != (uint32_t)json_integer_value(json_array_get(row0, (size_t)c)))
                first_bad = c;
        }
    }
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    CHECK(first_bad < 0, "%s %s: row 0 column %lld differs from gguf-py's", type, name,
          (long long)first_bad);
    CHECK(!strcmp(hex, json_string_value(json_object_get(want, "fnv1a64"))),
          "%s %s: the dequantized values differ from gguf-py's (hash %s, want %s)", type, name, hex,
          json_string_value(json_object_get(want, "fnv1a64")));
    /* a GGUF matrix keeps the file's bytes, within 5% (two-level scales as bytes); an MLX
     * one is bound in place */
    const int64_t file_bytes = rows * cols / 256 * file_bytes_256(type);
    CHECK(!file_bytes ||
              (matview_bytes(&w) >= file_bytes && matview_bytes(&w) <= file_bytes * 105 / 100),
          "%s %s: %lld bytes bound for %lld in the file", type, name, (long long)matview_bytes(&w),
          (long long)file_bytes);
    /* the CPU's packed layout holds them within 5% of the file's bytes too (an MLX matrix's
     * are the ones bound) */
    arena mem = {0};
    const packed_mat *p = pack_matrix(&w, &mem);
    const int64_t src = file_bytes ? file_bytes : matview_bytes(&w);
    if (CHECK(p != NULL, "%s %s: the CPU backend does not pack it", type, name)) {
        CHECK(packed_bytes(p) <= src * 105 / 100,
              "%s %s: packed in %lld bytes for %lld in the file", type, name,
              (long long)packed_bytes(p), (long long)src);
        packed_total += packed_bytes(p), file_total += src;
        /* packed on three threads, tile by tile: the same bytes */
        threadpool *pool = threadpool_create(3);
        arena mem3 = {0};
        const packed_mat *p3 = pool ? pack_matrix_on(&w, &mem3, pool) : NULL;
        CHECK(p3 && !memcmp(p3->codes, p->codes, (size_t)(p->tiles * packed_tile_bytes(p))) &&
                  !memcmp(p3->sb, p->sb, sizeof(uint16_t) * (size_t)(p->tiles * packed_tile_sb(p))),
              "%s %s: packed on three threads, the bytes differ", type, name);
        arena_free(&mem3);
        threadpool_destroy(pool);
    }
    arena_free(&mem);
    free(row);
}

/* Logits of n ids of model on the given kernels of the device (NULL: the CPU). */
static float *model_logits(celer_model *model, const char *device, const char *kernels, int64_t n,
                           int64_t *v) {
    char err[512];
    celer_context_params p = harness_context_params(n > 64 ? 256 : 64, 1, device);
    p.kernels = kernels;
    celer_context *ctx = NULL;
    float *out = NULL;
    if (CHECK(celer_context_create(model, &p, &ctx, err, sizeof err) == CELER_OK, "%s", err)) {
        *v = celer_model_n_vocab(model);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
        for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(3 + 29 * i) % (int32_t)*v;
        out = malloc(sizeof(float) * (size_t)(n * *v));
        celer_batch b = celer_batch_tokens(ids, n);
        if (!CHECK(celer_forward(ctx, &b, out) == CELER_OK, "%s forward: %s", kernels,
                   celer_context_last_error(ctx)))
            free(out), out = NULL;
        free(ids);
        celer_context_destroy(ctx);
    }
    return out;
}

/* The same, of the model at path. */
static float *logits(const char *path, const char *device, const char *kernels, int64_t n,
                     int64_t *v) {
    celer_model *model = NULL;
    char err[512];
    if (!CHECK(celer_model_open(path, NULL, &model, err, sizeof err) == CELER_OK, "%s", err))
        return NULL;
    float *out = model_logits(model, device, kernels, n, v);
    celer_model_close(model);
    return out;
}

/* The hash of every tensor of m's checkpoint, and how many of the whole pages inside its
 * U32 code tensors are resident (of *pages). */
static uint64_t sources_state(const celer_model *m, int64_t *resident, int64_t *pages) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uint64_t h = 0xcbf29ce484222325ull;
    *resident = *pages = 0;
    for (size_t i = 0; i < m->ck.n_shards; i++)
        for (size_t k = 0; k < m->ck.shards[i].n_tensors; k++) {
            const st_tensor *t = &m->ck.shards[i].tensors[k];
            if (t->type != DTYPE_U32) continue;
            const uintptr_t a = ((uintptr_t)t->data + page - 1) / page * page,
                            b = ((uintptr_t)t->data + t->nbytes) / page * page;
            unsigned char in[256];
            for (uintptr_t at = a; at < b; at += page, ++*pages)
                if (mincore((void *)at, page, in) == 0 && (in[0] & 1)) ++*resident;
        }
    /* hashing reads the pages, so it comes after they were counted */
    for (size_t i = 0; i < m->ck.n_shards; i++)
        for (size_t k = 0; k < m->ck.shards[i].n_tensors; k++)
            h = fnv1a64(h, m->ck.shards[i].tensors[k].data, m->ck.shards[i].tensors[k].nbytes);
    return h;
}

/* One model, three contexts in turn: the fast kernels pack the matrices and the converted
 * copies' pages go; a reference context reads them in place, converted again bit for bit;
 * a second fast context keeps them (a context reads them in place) and computes what the
 * first did. */
static void check_sources(const char *type, const char *path) {
    celer_model *model = NULL;
    char err[512];
    if (!CHECK(celer_model_open(path, NULL, &model, err, sizeof err) == CELER_OK, "%s", err))
        return;
    int64_t v = 0, resident, pages;
    const uint64_t h0 = sources_state(model, &resident, &pages);
    CHECK(pages > 0 && resident == pages, "%s: %lld of %lld code pages resident at open", type,
          (long long)resident, (long long)pages);
    float *fast = model_logits(model, NULL, "auto", 6, &v);
    sources_state(model, &resident, &pages);
    CHECK(resident == 0, "%s: %lld of %lld code pages resident after packing", type,
          (long long)resident, (long long)pages);
    float *ref = model_logits(model, NULL, "ref", 6, &v);
    CHECK(sources_state(model, &resident, &pages) == h0 && resident == pages,
          "%s: the converted matrices came back other than they were (%lld of %lld pages)", type,
          (long long)resident, (long long)pages);
    float *again = model_logits(model, NULL, "auto", 6, &v);
    CHECK(sources_state(model, &resident, &pages) == h0 && resident == pages,
          "%s: a fast context after a reference one let the sources go", type);
    if (fast && ref && again) {
        const double d = max_abs_diff(ref, fast, 6 * v), mx = max_abs(ref, 6 * v);
        CHECK(d <= 2e-3 * mx, "%s: after restoring, the reference differs by %g", type, d);
        CHECK(!memcmp(fast, again, sizeof(float) * (size_t)(6 * v)),
              "%s: the second fast context's logits differ from the first's", type);
    }
    printf("  %s: %lld code pages let go after packing, converted again for a reference context\n",
           type, (long long)pages);
    free(fast), free(ref), free(again);
    celer_model_close(model);
}

/* Every matrix of the model at path against want (the expectations of one fixture). */
static void check_matrices(const char *type, const char *path, const char *jpath) {
    json_error_t je;
    json_t *want = json_load_file(jpath, 0, &je);
    if (!CHECK(want != NULL, "%s: %s", jpath, je.text)) return;
    celer_model *m = NULL;
    celer_error e = {{0}};
    if (CHECK(model_open(path, sizeof *m, &m, &e) == CELER_OK, "%s: %s", path, e.msg)) {
        const char *name;
        json_t *v;
        int n = 0;
        packed_total = file_total = 0;
        json_object_foreach(want, name, v) check_matrix(m, type, name, v), n++;
        printf("  %s: %d matrices equal to %s's bit for bit; CPU packed bytes / file bytes %.4f\n",
               type, n, strncmp(type, "mlx", 3) ? "gguf-py" : "mlx",
               file_total ? (double)packed_total / (double)file_total : 0.0);
        model_close(m);
    }
    json_decref(want);
}

/* The logits of n ids on the device (NULL: the fast kernels the CPU picks) against the
 * reference kernels', within tol of the largest. */
static void check_logits_on(const char *type, const char *path, const char *device, int64_t n,
                            double tol) {
    int64_t v = 0;
    float *ref = logits(path, NULL, "ref", n, &v), *fast = logits(path, device, "auto", n, &v);
    if (ref && fast) {
        const double d = max_abs_diff(ref, fast, n * v), mx = max_abs(ref, n * v);
        printf("  %s: logits of %lld rows, %s against the reference: %.3g (max |logit| %.3g)\n",
               type, (long long)n, device ? device : "fast kernels", d, mx);
        CHECK(d <= tol * mx, "%s: %s logits differ from the reference by %g", type,
              device ? device : "fast", d);
    }
    free(ref), free(fast);
}

/* The CPU's fast kernels; then the device under test (CELER_TEST_DEVICE), at a decode
 * product's few rows (fp32 throughout) and at a prefill's many, whose dense product takes
 * fp16 operands. The GGUF fixtures' random blocks draw every factor from the format's whole
 * range: weights reach +-6 on a common offset of several units (Q4_K's dmin * m, Q6_K's
 * -32 * d * sc), so a dot product cancels terms hundreds of times its size and fp16's
 * rounding of each weight (5e-4 of it) shows in the logits at the percent level; the same
 * dequantization at fp32 (the decode rows) agrees within 2e-3. A trained model's scales
 * keep the prefill within the usual bound (tests/run_cuda.sh checks a K-quant mix of
 * realistic scales). */
static void check_logits(const char *type, const char *path, bool gguf) {
    check_logits_on(type, path, NULL, 6, 2e-3);
    if (harness_device()) {
        check_logits_on(type, path, harness_device(), 6, 2e-3);
        check_logits_on(type, path, harness_device(), 150, gguf ? 0.1 : 2e-3);
    }
}

static void check_gguf(const char *type) {
    char path[4096], jpath[4096];
    snprintf(path, sizeof path, "%s/../quants/%s.gguf", fixture_root(), type);
    snprintf(jpath, sizeof jpath, "%s/../quants/%s.json", fixture_root(), type);
    check_matrices(type, path, jpath);
    /* the format mix; and MLX's layout holds none of these as they are kept but Q5_1 (its
     * 5-bit affine, group 32): convert says so in one line, writing nothing, or writes a
     * directory whose matrices are the file's, bit for bit */
    celer_model *model = NULL;
    char err[512], dir[64];
    snprintf(dir, sizeof dir, "/tmp/celer-convert-%s-%d", type, (int)getpid());
    if (CHECK(celer_model_open(path, NULL, &model, err, sizeof err) == CELER_OK, "%s", err)) {
        char formats[256], want_formats[64], upper[16];
        for (size_t i = 0; i <= strlen(type); i++)
            upper[i] = (char)(type[i] >= 'a' && type[i] <= 'z' ? type[i] - 32 : type[i]);
        snprintf(want_formats, sizeof want_formats, "%s x8, F32 x3 (GGUF tensors)", upper);
        celer_model_formats(model, formats, sizeof formats);
        CHECK(!strcmp(formats, want_formats), "%s: formats '%s', expected '%s'", type, formats,
              want_formats);
        const celer_status cs = celer_model_convert(model, dir, err, sizeof err);
        if (!strcmp(type, "q5_1")) {
            if (CHECK(cs == CELER_OK, "%s: convert: %s", type, err)) {
                char name[80];
                snprintf(name, sizeof name, "%s converted", type);
                check_matrices(name, dir, jpath);
            }
        } else {
            CHECK(cs == CELER_STATUS_UNSUPPORTED &&
                      strstr(err, "celer convert writes MLX's affine layout (2, 3, 4, 5, 6 or 8 "
                                  "bits, one level of scales and biases) only") &&
                      access(dir, F_OK) != 0,
                  "%s: convert: expected a refusal naming the tensor, found '%s'", type, err);
        }
        celer_model_close(model);
        char rm[128];
        snprintf(rm, sizeof rm, "rm -rf %s", dir);
        CHECK(system(rm) == 0, "%s", rm);
    }
    check_logits(type, path, true);
    check_sources(type, path);
}

/* tests/quants/<name>/, an mlx-lm checkpoint: its matrices, its format mix (want), its logits. */
static void check_mlx_dir(const char *name, const char *want) {
    char path[4096], jpath[4200];
    snprintf(path, sizeof path, "%s/../quants/%s", fixture_root(), name);
    snprintf(jpath, sizeof jpath, "%s/expect.json", path);
    check_matrices(name, path, jpath);
    celer_model *model = NULL;
    char err[512], formats[256];
    if (CHECK(celer_model_open(path, NULL, &model, err, sizeof err) == CELER_OK, "%s", err)) {
        celer_model_formats(model, formats, sizeof formats);
        CHECK(!strcmp(formats, want), "%s: formats '%s', expected '%s'", name, formats, want);
        celer_model_close(model);
    }
    check_logits(name, path, false);
}

int main(void) {
    const char *types[] = {"q5_0", "q5_1", "q4_k",   "q5_k",  "q6_k",
                           "q3_k", "q2_k", "iq4_nl", "iq4_xs"};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) check_gguf(types[i]);
    /* codes that cross 32-bit words, one module at 8 bits g64; then the fp4 modes (e2m1 codes
     * under e8m0 or e4m3 scales) */
    check_mlx_dir("mlx-2bit", "2-bit g32 x7, 8-bit g64 x1 (matrices)");
    check_mlx_dir("mlx-3bit", "3-bit g64 x7, 8-bit g64 x1 (matrices)");
    check_mlx_dir("mlx-5bit", "5-bit g128 x7, 8-bit g64 x1 (matrices)");
    check_mlx_dir("mlx-6bit", "6-bit g32 x7, 8-bit g64 x1 (matrices)");
    check_mlx_dir("mlx-mxfp4", "4-bit g32 z0 x8 (matrices)");
    check_mlx_dir("mlx-nvfp4", "4-bit g16 z0 x8 (matrices)");
    return harness_done("test_quant_formats");
}
