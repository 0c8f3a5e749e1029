/*
 * bench_affine.cu - decode products on Llama-3.1-8B shapes: one "token" is every matrix of
 * the model once (32 layers of q, k, v, o, gate, up, down, then the LM head), on distinct
 * random weights, so the L2 never holds them.
 *
 * Reports, for 4-bit group 32/64/128 and 8-bit group 64, at n = 1, 2, 4, 8: the time of a
 * token launched kernel by kernel and as one CUDA graph, each with and without
 * programmatic dependent launch; the weight bytes read over that time, against the device-to-device
 * copy bandwidth measured in the same run (bytes read + written); and the tok/s ceiling
 * that implies. For 4-bit group 64, each plan (column tiles per block) per matrix shape,
 * and the token with each shape's fastest plan.
 * Medians of 25 repetitions (10 with --quick), CUDA events.
 *
 *     bench_affine            all of the above
 *     bench_affine --quick    4-bit g64 at n = 1, 8 and 16: launches and graph + PDL, the plans
 *     bench_affine --profile [sN|rN|pN]  4-bit g64, two tokens at n = 1, kernel by kernel
 *                             (for ncu), with the default plans or every product on one
 *                             plan (s: staged, r: streamed, p: streamed with the L2
 *                             prefetch; N column tiles)
 *     bench_affine --gemm     prefill products (cuda_affine_gemm) on one
 *                             layer's shapes at n = 512 and 2048, beside cuBLAS on dense
 *                             fp16 weights of the same shapes: ms, TFLOPS, and the layer's
 *                             products as a prefill tok/s ceiling for 32 layers
 */
#include "backend/cuda/affine.h"
#include "check.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REPS 25
#define LAYERS 32

static int reps = MAX_REPS;

typedef struct shape {
    const char *name;
    int64_t rows, cols;
} shape;

/* One layer's matrices, in forward order, then the head. */
static const shape layer_shapes[] = {
    {"q", 4096, 4096},      {"k", 1024, 4096},    {"v", 1024, 4096},     {"o", 4096, 4096},
    {"gate", 14336, 4096},  {"up", 14336, 4096},  {"down", 4096, 14336},
};
#define PER_LAYER 7
static const shape head_shape = {"head", 128256, 4096};
#define N_MATS (LAYERS * PER_LAYER + 1)

typedef struct model {
    cuda_affine m[N_MATS];
    const shape *sh[N_MATS];
    size_t bytes;
} model;

/* ==== Random weights on the device ==== */

__device__ static uint32_t hash32(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
}

__global__ static void k_fill_codes(uint32_t *p, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = hash32(seed * 0x9e3779b97f4a7c15ull + i);
}

/* scales ~ U(0.005, 0.02) in fp16, biases = -8 * scale */
__global__ static void k_fill_sb(__half *s, __half *b, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float sc = 0.005f + 0.015f * (float)(hash32(seed * 0x2545f4914f6cdd1dull + i) >> 8) / 16777216.0f;
        s[i] = __float2half_rn(sc);
        b[i] = __float2half_rn(-8.0f * sc);
    }
}

__global__ static void k_fill_x(float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = (float)(hash32(i + 12345) >> 8) / 8388608.0f - 1.0f;
}

/* y = x rounded to fp16: the activations of the dense product. */
__global__ static void k_x_half(__half *y, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2half_rn(x[i]);
}

static void build_model(model *md, int bits, int64_t group, cudaStream_t s) {
    const size_t max_words = (size_t)head_shape.rows * head_shape.cols * bits / 32;
    const size_t max_groups = (size_t)head_shape.rows * head_shape.cols / group;
    uint32_t *codes;
    __half *sc, *bi;
    CHECK(cudaMalloc((void **)&codes, max_words * 4));
    CHECK(cudaMalloc((void **)&sc, max_groups * 2));
    CHECK(cudaMalloc((void **)&bi, max_groups * 2));
    md->bytes = 0;
    for (int i = 0; i < N_MATS; i++) {
        const shape *sh = i < LAYERS * PER_LAYER ? &layer_shapes[i % PER_LAYER] : &head_shape;
        const size_t words = (size_t)sh->rows * sh->cols * bits / 32, groups = (size_t)sh->rows * sh->cols / group;
        k_fill_codes<<<1024, 256, 0, s>>>(codes, words, (uint64_t)i + 1);
        k_fill_sb<<<1024, 256, 0, s>>>(sc, bi, groups, (uint64_t)i + 7);
        CHECK(cudaGetLastError());
        const matview w = affine_view(codes, sc, bi, sh->rows, sh->cols, bits, group, DTYPE_F16);
        char err[256];
        if (cuda_affine_upload_device(&md->m[i], &w, s, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            exit(2);
        }
        md->sh[i] = sh;
        md->bytes += md->m[i].bytes;
    }
    CHECK(cudaStreamSynchronize(s));
    cudaFree(codes);
    cudaFree(sc);
    cudaFree(bi);
}

static void free_model(model *md) {
    for (int i = 0; i < N_MATS; i++) cuda_affine_free(&md->m[i]);
}

/* ==== Timing ==== */

typedef struct bench {
    cudaStream_t s;
    float *x, *y;
    void *work;
    size_t work_size;
    cudaEvent_t e0, e1;
} bench;

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A plan's kernel as one letter (cuda_affine_plan.stream): staged, streamed, streamed
 * with the L2 prefetch. */
static const char plan_kinds[] = "srp";

/* The shape sets a plan is tuned for: q and o, k and v, gate and up, down, head. */
#define N_SETS 5
static int shape_set(int i) {
    static const int of_layer[PER_LAYER] = {0, 1, 1, 0, 2, 2, 3};
    return i >= LAYERS * PER_LAYER ? 4 : of_layer[i % PER_LAYER];
}

/* Plans per shape set (slice 0: the default plan), or NULL: the default everywhere. */
static const cuda_affine_plan *tuned;

/* Matrices [first, first + count) stepping by `step`, at n rows, with plan p (slice 0: the
 * tuned or default plan). Returns the first launch error (inside a capture, errors are the
 * caller's to report). */
static cudaError_t enqueue(bench *b, const model *md, int first, int count, int step, int64_t n,
                           unsigned flags, cuda_affine_plan p) {
    for (int j = 0; j < count; j++) {
        const int i = first + j * step;
        const cuda_affine *w = &md->m[i];
        cuda_affine_plan q = p;
        if (!q.slice && tuned) q = tuned[shape_set(i)];
        if (cuda_affine_plan_work_size(w, n, q.slice ? q : cuda_affine_plan_for(w, n)) > b->work_size)
            return cudaErrorInvalidValue;
        const cudaError_t e = q.slice ? cuda_affine_gemv_plan(b->y, b->x, n, w, b->work, b->s, flags, q)
                                   : cuda_affine_gemv(b->y, b->x, n, w, b->work, b->s, flags);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

/* Median ms of the enqueued sequence; mode 0: launched kernel by kernel, 1: the same with
 * programmatic dependent launch, 2: one CUDA graph, 3: a graph with programmatic
 * dependent launch. -1 if the graph could not be made. */
static double time_seq(bench *b, const model *md, int first, int count, int step, int64_t n,
                       int mode, cuda_affine_plan p) {
    const unsigned flags = mode % 2 ? CUDA_AFFINE_PDL : 0;
    const int graph = mode >= 2;
    cudaGraphExec_t exec = NULL;
    if (graph) {
        cudaGraph_t g = NULL;
        CHECK(cudaStreamBeginCapture(b->s, cudaStreamCaptureModeThreadLocal));
        const cudaError_t el = enqueue(b, md, first, count, step, n, flags, p);
        cudaError_t e = cudaStreamEndCapture(b->s, &g);
        if (el != cudaSuccess) e = el;
        if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, g, 0);
        if (g) cudaGraphDestroy(g);
        if (e != cudaSuccess) {
            printf("(graph mode %d: %s)\n", mode, cudaGetErrorString(e));
            cudaGetLastError();
            return -1;
        }
    }
    double t[MAX_REPS];
    for (int r = -3; r < reps; r++) {
        CHECK(cudaEventRecord(b->e0, b->s));
        if (graph) CHECK(cudaGraphLaunch(exec, b->s));
        else CHECK(enqueue(b, md, first, count, step, n, flags, p));
        CHECK(cudaEventRecord(b->e1, b->s));
        CHECK(cudaEventSynchronize(b->e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, b->e0, b->e1));
        if (r >= 0) t[r] = ms;
    }
    if (exec) CHECK(cudaGraphExecDestroy(exec));
    return median(t, reps);
}

/* Device-to-device copy bandwidth, bytes read + written, GB/s. */
static double copy_bandwidth(bench *b) {
    const size_t bytes = (size_t)2 << 30;
    void *src, *dst;
    CHECK(cudaMalloc(&src, bytes));
    CHECK(cudaMalloc(&dst, bytes));
    CHECK(cudaMemset(src, 1, bytes));
    double t[MAX_REPS];
    for (int r = -3; r < reps; r++) {
        CHECK(cudaEventRecord(b->e0, b->s));
        CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, b->s));
        CHECK(cudaEventRecord(b->e1, b->s));
        CHECK(cudaEventSynchronize(b->e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, b->e0, b->e1));
        if (r >= 0) t[r] = ms;
    }
    cudaFree(src);
    cudaFree(dst);
    return 2.0 * (double)bytes / (median(t, reps) * 1e-3) / 1e9;
}

static void setup(bench *b) {
    memset(b, 0, sizeof *b);
    CHECK(cudaStreamCreateWithFlags(&b->s, cudaStreamNonBlocking));
    CHECK(cudaMalloc((void **)&b->x, (size_t)CUDA_AFFINE_MAX_N * 14336 * 4));
    CHECK(cudaMalloc((void **)&b->y, (size_t)CUDA_AFFINE_MAX_N * 128256 * 4));
    k_fill_x<<<256, 256, 0, b->s>>>(b->x, (size_t)CUDA_AFFINE_MAX_N * 14336);
    CHECK(cudaGetLastError());
    b->work_size = (size_t)128 << 20;
    CHECK(cudaMalloc(&b->work, b->work_size));
    CHECK(cudaMemset(b->work, 0, b->work_size));
    CHECK(cudaEventCreate(&b->e0));
    CHECK(cudaEventCreate(&b->e1));
}

/* Per shape set: every plan at n rows, as a PDL graph over all matrices of the set; the
 * fastest goes to best[set]. */
static void sweep_plans(bench *b, const model *md, double copy_gbs, int64_t n, cuda_affine_plan best[N_SETS]) {
    static const struct { int first, count, step; const char *name; } sets[N_SETS] = {
        {0, LAYERS, PER_LAYER, "q 4096x4096"},     {1, LAYERS, PER_LAYER, "k 1024x4096"},
        {4, LAYERS, PER_LAYER, "gate 14336x4096"}, {6, LAYERS, PER_LAYER, "down 4096x14336"},
        {LAYERS * PER_LAYER, 1, 1, "head 128256x4096"},
    };
    /* staged slices, then streamed ones, then streamed with the L2 prefetch */
    static const cuda_affine_plan plans[] = {{4, 0},  {8, 0},  {12, 0}, {16, 0}, {8, 1},  {12, 1}, {16, 1},
                                             {24, 1}, {32, 1}, {64, 1}, {8, 2},  {16, 2}, {32, 2}};
    const int np = (int)(sizeof plans / sizeof plans[0]);
    if (n == 1) {
        printf("\nplans per shape (graph + PDL over all matrices of the shape; GB/s, %% of copy;"
               " s: staged codes, r: codes through registers, p: r with the L2 prefetch)\n");
        printf("%-18s %-3s", "shape", "n");
        for (int p = 0; p < np; p++) printf("   slice %c%-2d  ", plan_kinds[plans[p].stream], plans[p].slice);
        printf("  default\n");
    }
    for (int si = 0; si < N_SETS; si++) {
        size_t bytes = 0;
        for (int j = 0; j < sets[si].count; j++) bytes += md->m[sets[si].first + j * sets[si].step].bytes;
        printf("%-18s %-3lld", sets[si].name, (long long)n);
        double best_ms = 1e30;
        for (int p = 0; p <= np; p++) {
            const cuda_affine_plan pl = p < np ? plans[p] : (cuda_affine_plan){0, 0};
            if (p < np && !cuda_affine_plan_fits(&md->m[sets[si].first], n, pl)) {
                printf("     -        ");
                continue;
            }
            const double ms = time_seq(b, md, sets[si].first, sets[si].count, sets[si].step, n, 3, pl);
            const double gbs = (double)bytes / (ms * 1e-3) / 1e9;
            printf(" %5.0f %3.0f%%  ", gbs, 100.0 * gbs / copy_gbs);
            if (p < np && ms > 0 && ms < best_ms) {
                best_ms = ms;
                best[si] = pl;
            }
        }
        const cuda_affine_plan d = cuda_affine_plan_for(&md->m[sets[si].first], n);
        printf(" (%c%d) best %c%d\n", plan_kinds[d.stream], d.slice, plan_kinds[best[si].stream], best[si].slice);
    }
}

/* ==== Prefill products ==== */

/* mode 0: cuda_affine_gemm; 1: cuBLAS fp16 on a dense copy of the shape; 2: the decode
 * product, CUDA_AFFINE_MAX_N rows at a time (gwork: its own zero-filled work); 3: cuda_affine_gemm with
 * work for the staged x only (K never split); 4: the mma.sync product; 5: the warpgroup product;
 * 6: the dense fp16 product (x and W rounded to fp16, W whole into wd, then cuBLAS) */
static double time_gemm(bench *b, float *y, const float *x, const cuda_affine *w, int64_t n, int mode,
                        cublasHandle_t blas, const __half *wd, const __half *xd, void *gwork) {
    double t[MAX_REPS];
    for (int r = -2; r < reps; r++) {
        CHECK(cudaEventRecord(b->e0, b->s));
        if (mode == 0 || mode == 3) {
            const size_t ws = mode == 0 ? b->work_size : cuda_affine_gemm_work_size(w, n);
            CHECK(cuda_affine_gemm(y, x, n, w, b->work, ws, b->s));
        } else if (mode == 4 || mode == 5) {
            const cuda_affine *wp = w;
            CHECK(cuda_affine_gemm_set_path(&y, &wp, 1, x, n, b->work, b->work_size, b->s,
                                            mode == 4 ? CUDA_GEMM_MMA : CUDA_GEMM_WGMMA));
        } else if (mode == 2) {
            for (int64_t c = 0; c < n; c += CUDA_AFFINE_MAX_N)
                CHECK(cuda_affine_gemv(y + c * w->rows, x + c * w->cols, n - c < CUDA_AFFINE_MAX_N ? n - c : CUDA_AFFINE_MAX_N,
                                       w, gwork, b->s, 0));
        } else {
            if (mode == 6) {
                k_x_half<<<1024, 256, 0, b->s>>>((__half *)xd, x, (size_t)(n * w->cols));
                CHECK(cuda_affine_dequant((__half *)wd, w, 0, w->rows, b->s));
            }
            const float one = 1.0f, zero = 0.0f;
            if (cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)n, (int)w->cols, &one, wd, CUDA_R_16F,
                             (int)w->cols, xd, CUDA_R_16F, (int)w->cols, &zero, y, CUDA_R_32F, (int)w->rows,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
                fprintf(stderr, "cublasGemmEx failed\n");
                exit(2);
            }
        }
        CHECK(cudaEventRecord(b->e1, b->s));
        CHECK(cudaEventSynchronize(b->e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, b->e0, b->e1));
        if (r >= 0) t[r] = ms;
    }
    return median(t, reps);
}

static void bench_gemm(bench *b) {
    static const char *modes[] = {"celer",       "cuBLAS fp16", "decode product", "celer 1 split",
                                  "celer mma",   "celer wgmma", "dense fp16"};
    enum { MODES = sizeof modes / sizeof modes[0] };
    const int64_t max_n = 2048;
    model *md = (model *)calloc(1, sizeof *md);
    build_model(md, 4, 64, b->s);
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) exit(2);
    cublasSetStream(blas, b->s);
    __half *wd, *xd;
    float *x, *y;
    CHECK(cudaMalloc((void **)&x, (size_t)max_n * 14336 * 4));
    CHECK(cudaMalloc((void **)&y, (size_t)max_n * 14336 * 4));
    k_fill_x<<<1024, 256, 0, b->s>>>(x, (size_t)max_n * 14336);
    CHECK(cudaGetLastError());
    CHECK(cudaMalloc((void **)&wd, (size_t)14336 * 4096 * 2));
    CHECK(cudaMalloc((void **)&xd, (size_t)max_n * 14336 * 2));
    CHECK(cudaMemset(wd, 0, (size_t)14336 * 4096 * 2));
    CHECK(cudaMemset(xd, 0, (size_t)max_n * 14336 * 2));
    void *gwork;
    CHECK(cudaMalloc(&gwork, (size_t)16 << 20));
    CHECK(cudaMemset(gwork, 0, (size_t)16 << 20));
    printf("\nproducts of n rows, 4-bit g64 (ms, TFLOPS, GB/s of weights):\n%-6s %-5s %-14s %9s %8s %8s\n", "shape", "n",
           "kernel", "ms", "TFLOPS", "GB/s");
    static const int64_t ns[] = {16, 32, 64, 128, 256, 512, 2048};
    for (int ni = 0; ni < (int)(sizeof ns / sizeof ns[0]); ni++) {
        const int64_t n = ns[ni];
        double layer[MODES] = {0};
        for (int si = 0; si < PER_LAYER; si++) {
            const cuda_affine *w = &md->m[si];
            const double flops = 2.0 * (double)w->rows * (double)w->cols * (double)n;
            for (int mode = 0; mode < MODES; mode++) {
                if (mode == 2 && n > 64) continue;
                if (mode == 5 && !cuda_affine_gemm_has_wgmma()) continue;
                const double ms = time_gemm(b, y, x, w, n, mode, blas, wd, xd, gwork);
                layer[mode] += ms;
                printf("%-6s %-5lld %-14s %9.3f %8.1f %8.0f\n", layer_shapes[si].name, (long long)n, modes[mode], ms,
                       flops / (ms * 1e-3) / 1e12, (double)w->bytes / (ms * 1e-3) / 1e9);
            }
        }
        for (int mode = 0; mode < MODES; mode++)
            if (layer[mode] > 0)
                printf("layer n=%lld %-14s %8.3f ms: products alone allow %.0f tok/s over 32 layers\n", (long long)n,
                       modes[mode], layer[mode], (double)n / (32.0 * layer[mode] * 1e-3));
    }
    cudaFree(gwork);
    cublasDestroy(blas);
    cudaFree(wd);
    cudaFree(xd);
    cudaFree(x);
    cudaFree(y);
    free_model(md);
    free(md);
}

int main(int argc, char **argv) {
    const int profile = argc > 1 && strcmp(argv[1], "--profile") == 0;
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    const int gemm = argc > 1 && strcmp(argv[1], "--gemm") == 0;
    if (quick || gemm) reps = 10;
    bench b;
    setup(&b);
    if (gemm) {
        bench_gemm(&b);
        return 0;
    }
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    model *md = (model *)calloc(1, sizeof *md);
    if (profile) {
        build_model(md, 4, 64, b.s);
        cuda_affine_plan p = {0, 0};
        const char *k = argc > 2 && argv[2][0] ? strchr(plan_kinds, argv[2][0]) : NULL;
        if (k) p = (cuda_affine_plan){atoi(argv[2] + 1), (int)(k - plan_kinds)};
        for (int i = 0; i < 2; i++) CHECK(enqueue(&b, md, 0, N_MATS, 1, 1, 0, p));
        CHECK(cudaStreamSynchronize(b.s));
        free_model(md);
        printf("profile run done\n");
        return 0;
    }
    const double copy_gbs = copy_bandwidth(&b);
    printf("device-to-device copy: %.0f GB/s (read + write)\n", copy_gbs);

    static const struct { int bits; int64_t group; } configs[] = {{4, 64}, {4, 32}, {4, 128}, {8, 64}};
    const size_t n_configs = quick ? 1 : sizeof configs / sizeof configs[0];
    static const char *modes[] = {"launches", "launch+PDL", "graph", "graph+PDL"};
    char summary[64][160];
    int ns = 0;
    for (size_t ci = 0; ci < n_configs; ci++) {
        build_model(md, configs[ci].bits, configs[ci].group, b.s);
        printf("\n%d-bit group %lld: %.3f GB of weights in %d matrices\n", configs[ci].bits,
               (long long)configs[ci].group, (double)md->bytes / 1e9, N_MATS);
        printf("%-3s %-10s %9s %8s %7s %9s\n", "n", "mode", "ms/token", "GB/s", "% copy", "tok/s");
        static const int64_t ns_all[] = {1, 2, 4, 8, 16}, ns_quick[] = {1, 8, 16};
        for (int ni = 0; ni < (quick ? 3 : 5); ni++) {
            const int64_t n = quick ? ns_quick[ni] : ns_all[ni];
            for (int mode = 0; mode < 4; mode++) {
                if (quick && (mode == 1 || mode == 2)) continue;
                const double ms = time_seq(&b, md, 0, N_MATS, 1, n, mode, (cuda_affine_plan){0, 0});
                const double gbs = (double)md->bytes / (ms * 1e-3) / 1e9;
                printf("%-3lld %-10s %9.3f %8.0f %6.1f%% %9.0f\n", (long long)n, modes[mode], ms, gbs,
                       100.0 * gbs / copy_gbs, 1e3 / ms);
                if (mode == 3)
                    snprintf(summary[ns++], sizeof summary[0], "%d-bit g%-4lld n=%lld  %7.3f ms  %5.0f GB/s  %5.1f%%  %6.0f tok/s",
                             configs[ci].bits, (long long)configs[ci].group, (long long)n, ms, gbs,
                             100.0 * gbs / copy_gbs, 1e3 / ms);
            }
        }
        if (ci == 0) { /* each shape's best plan, then the token with those plans */
            cuda_affine_plan best[4][N_SETS] = {};
            const int ni_step = quick ? 3 : 1;
            for (int ni = 0; ni < 4; ni += ni_step) sweep_plans(&b, md, copy_gbs, (int64_t)1 << ni, best[ni]);
            for (int ni = 0; ni < 4; ni += ni_step) {
                tuned = best[ni];
                const double ms = time_seq(&b, md, 0, N_MATS, 1, (int64_t)1 << ni, 3, (cuda_affine_plan){0, 0});
                tuned = NULL;
                const double gbs = (double)md->bytes / (ms * 1e-3) / 1e9;
                snprintf(summary[ns++], sizeof summary[0], "%d-bit g%-4lld n=%d  %7.3f ms  %5.0f GB/s  %5.1f%%  %6.0f tok/s  (best plan per shape)",
                         configs[ci].bits, (long long)configs[ci].group, 1 << ni, ms, gbs,
                         100.0 * gbs / copy_gbs, 1e3 / ms);
            }
        }
        free_model(md);
    }
    printf("\nsummary (graph + PDL; copy %.0f GB/s)\n", copy_gbs);
    for (int i = 0; i < ns; i++) printf("%s\n", summary[i]);
    return 0;
}
