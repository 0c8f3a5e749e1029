/*
 * celer.h - the public API of celer, a native runtime for Llama-family language models.
 *
 * Everything an outside program (the CLI, the server, an embedding application) needs is
 * here: opaque handles for a loaded model and an inference context, a transparent batch
 * struct, and the model contract of docs/architecture.md ("The model contract"). Nothing here
 * exposes tensors, kernels or backends.
 *
 * Usage:
 *
 *     char err[512];
 *     celer_model *model;
 *     if (celer_model_open("path/to/checkpoint", NULL, &model, err, sizeof err) != CELER_OK) {
 *         fprintf(stderr, "%s\n", err);
 *         return 1;
 *     }
 *     celer_context_params cp = celer_context_default_params();
 *     cp.n_ctx = 2048;
 *     celer_context *ctx;
 *     if (celer_context_create(model, &cp, &ctx, err, sizeof err) != CELER_OK) { ... }
 *
 *     int32_t ids[] = {1, 15043, 3186};
 *     float *logits = malloc(sizeof(float) * celer_model_n_vocab(model));
 *     celer_batch b = celer_batch_tokens(ids, 3);
 *     celer_forward_last_logits(ctx, &b, 2, logits);   // logits of the row at index 2 only
 *
 *     celer_context_destroy(ctx);
 *     celer_model_close(model);
 *
 * Threading: a context is used by one thread at a time; it owns a thread pool that runs
 * each operation on n_threads threads. Several contexts may share one model.
 */
#ifndef CELER_H
#define CELER_H

/* The release: `celer --version` prints it. */
#define CELER_VERSION "0.9.0"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum celer_status {
    CELER_OK = 0,
    CELER_STATUS_INVALID_ARGUMENT, /* a caller passed something out of range */
    CELER_STATUS_IO,               /* a file could not be opened, read or mapped */
    CELER_STATUS_BAD_FILE,         /* a file is malformed, truncated or lies about itself */
    CELER_STATUS_BAD_CONFIG,       /* config.json is malformed or disagrees with the weights */
    CELER_STATUS_UNSUPPORTED,      /* well-formed, but an architecture/format celer lacks */
    CELER_STATUS_CONTEXT_FULL,     /* a sequence or the KV cache pool has no room left */
    CELER_STATUS_OUT_OF_MEMORY,
    CELER_STATUS_BUSY,        /* the request queue is full; try again later */
    CELER_STATUS_NOT_FOUND,   /* no request with that id; no model of that name */
    CELER_STATUS_DEVICE,      /* the device failed a step; the context works on (the
                                 next call runs again) */
    CELER_STATUS_DEVICE_LOST, /* the device is unusable: every later call on the
                                 context fails with the same message */
    CELER_STATUS_NETWORK,     /* the Hub could not be reached, refused access, or sent what
                                 it should not */
    CELER_STATUS_COUNT_
} celer_status;

/* A static, human-readable name for a status; never NULL. */
const char *celer_status_str(celer_status s);

/* ==== Model ==== */

typedef struct celer_model celer_model;

typedef struct celer_model_params {
    int reserved; /* no options yet; pass NULL for defaults */
} celer_model_params;

/* Opens a checkpoint directory (config.json + *.safetensors). Weights are mmap'd
 * read-only and stay valid until celer_model_close. On failure *out is NULL and err
 * (if not NULL) holds one line naming the file and the tensor or field at fault. */
celer_status celer_model_open(const char *path, const celer_model_params *params, celer_model **out,
                              char *err, size_t err_size);
void celer_model_close(celer_model *model);

/* ==== Models by name: the Hugging Face cache ==== */

/* name -> the path to give celer_model_open, in path[path_size]. A path that exists on
 * disk is kept as it is (it wins over a name). "ORG/NAME[:QUANT][@REV]" is looked up in the
 * Hugging Face hub cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)
 * at the commit refs/REV names (REV: main when absent; a commit hash works without a ref):
 * a repository with GGUF files gives the file whose quant tag is QUANT (case-insensitive;
 * without one Q4_K_M, else the only GGUF; mmproj files never count), one with config.json
 * gives its snapshot directory. Anything else that is no name is kept as it is, for the open
 * to report. A name not in the cache is CELER_STATUS_NOT_FOUND with one line naming the
 * repository and the cache directory. Reads the cache only; never downloads (that is
 * celer_model_pull). */
celer_status celer_model_resolve(const char *name, char *path, size_t path_size, char *err,
                                 size_t err_size);

/* Progress of celer_model_pull: file (its path in the repository) has done of total bytes;
 * finished is true once per file, when it is in place (or was there already). */
typedef void (*celer_pull_progress)(void *user, const char *file, int64_t done, int64_t total,
                                    bool finished);

/* Downloads the model name ("ORG/NAME[:QUANT][@REV]") from the Hugging Face Hub
 * ($HF_ENDPOINT, default https://huggingface.co; $HF_TOKEN or the token file for gated and
 * private repositories) into the cache celer_model_resolve reads, laid out as huggingface_hub
 * lays it out, then resolves name there into path[path_size]. A GGUF repository gives the
 * files of one quant (every part of a split), a checkpoint its config, weights and tokenizer
 * files. Files already cached are not fetched again; an interrupted file is resumed. With
 * HF_HUB_OFFLINE=1 nothing touches the network: a name not cached is NOT_FOUND, saying so.
 * Errors are one line in err (the token is never in it): NOT_FOUND (no such repository,
 * revision or file), NETWORK (unreachable, stalled, refused access: gated or private),
 * BAD_FILE (a checksum that does not match, an answer that is not what the Hub sends), IO
 * (the disk: full, or not writable), BUSY (another download holds the file's lock).
 * progress may be NULL. */
celer_status celer_model_pull(const char *name, celer_pull_progress progress, void *user,
                              char *path, size_t path_size, char *err, size_t err_size);

/* One model of the Hugging Face cache, as `celer ls` lists it. */
typedef struct celer_cached_model {
    char repo[256];    /* "ORG/NAME" */
    char revision[64]; /* the commit refs/main names ("" when the repo has no snapshot) */
    int64_t bytes;     /* the files of that snapshot, summed */
    char format[1024]; /* "gguf: Q4_K_M (x-Q4_K_M.gguf), ...", "mlx 4-bit",
                          "safetensors bfloat16", or what is missing */
} celer_cached_model;

/* Every model repository of the cache, sorted by name, into *models (malloc'd, the caller
 * frees it with free) and *n. A cache directory that does not exist holds no models (OK, n
 * = 0); one that cannot be read is CELER_STATUS_IO with one line naming it. */
celer_status celer_hf_cache_list(celer_cached_model **models, int64_t *n, char *err,
                                 size_t err_size);

int64_t celer_model_n_vocab(const celer_model *model);
int64_t celer_model_n_embd(const celer_model *model);
int64_t celer_model_n_layer(const celer_model *model);
int64_t celer_model_n_ctx_train(const celer_model *model);
/* Whether token is one of the end-of-sequence ids config.json names. */
bool celer_model_is_eos(const celer_model *model, int32_t token);
/* A one-line description ("llama, 2 layers, d=64, 4-bit g64 ..."); static per model. */
const char *celer_model_desc(const celer_model *model);

typedef struct celer_model_info {
    int64_t n_params;           /* weights, counted as unpacked values */
    int64_t weight_bytes;       /* bytes of the weights as stored (codes, scales, biases) */
    int64_t kv_bytes_per_token; /* KV cache bytes per position of one sequence (fp16) */
    int64_t packed_bytes;       /* weights prepared by backends: repacked for the fast CPU
                                   kernels, copied to a GPU (0 until such a context exists) */
    double pack_ms;             /* time that preparing them took */
} celer_model_info;

celer_model_info celer_model_get_info(const celer_model *model);

/* The mix of weight formats, most common first, into out: a GGUF file's tensor types
 * ("Q5_0 x81, F32 x109, Q4_K x27 (GGUF tensors)"), else the matrices' quantization
 * ("4-bit g64 x112, BF16 x1 (matrices)"). */
void celer_model_formats(const celer_model *model, char *out, size_t size);

/* Writes a model opened from a .gguf file as an MLX-layout checkpoint directory
 * (config.json + model.safetensors) that celer and mlx-lm load; lossless. Block types that
 * MLX's 4- and 8-bit affine layout cannot hold exactly (Q5_0, Q5_1, the K-quants) are
 * refused in one line naming the tensor, before anything is written. */
celer_status celer_model_convert(const celer_model *model, const char *dir, char *err,
                                 size_t err_size);

/* ==== Context: KV cache, activations and thread pool for one or more sequences ==== */

typedef struct celer_context celer_context;

typedef struct celer_context_params {
    int64_t n_ctx;        /* positions per sequence (KV cache capacity) */
    int32_t n_seq;        /* sequences the context can hold at once; ids 0 .. n_seq-1 */
    int64_t kv_positions; /* the KV pool all sequences share, in positions; 0 = n_seq * n_ctx */
    const char *kv_type;  /* cached K/V values: "f16" (NULL: the default) or "f32" */
    int64_t n_batch;      /* rows per internal step; longer inputs run in chunks. 0 = the
                             device's: 512 on the CPU, 2048 on CUDA */
    int32_t n_threads;    /* threads for every op; 0 = number of physical cores */
    /* Kernel set: NULL = the CELER_CPU environment variable if set, else "auto" (the
     * fastest the CPU supports). Names: "auto", "ref" (scalar reference kernels, the
     * correctness oracle), "generic" (the fast path's layout in plain C), "avx2",
     * "avx512" (AVX-512 VNNI), "amx". Asking for one the CPU lacks is an error. */
    const char *kernels;
    /* Where the model runs: "cpu", "cuda" (the first GPU) or "cuda:N"; NULL = the
     * CELER_DEVICE environment variable if set, else "cpu". A device this machine or
     * build lacks is an error. */
    const char *device;
} celer_context_params;

celer_context_params celer_context_default_params(void);

celer_status celer_context_create(celer_model *model, const celer_context_params *params,
                                  celer_context **out, char *err, size_t err_size);
void celer_context_destroy(celer_context *ctx);

/* The kernel set ctx runs ("ref", "avx2", ..., "cuda"); static. */
const char *celer_context_kernels(const celer_context *ctx);
/* The device ctx runs on ("cpu", "cuda:0"); valid until celer_context_destroy. */
const char *celer_context_device(const celer_context *ctx);

/* Bytes a context holds on its device. */
typedef struct celer_context_memory {
    int64_t weights; /* the weights its backend reads, one copy for every context of the
                        model on that device: a GPU's copy of every weight; on the CPU the
                        mapped checkpoint plus the copy the fast kernels repack (an upper
                        bound: the pages of repacked matrices may be dropped) */
    int64_t kv;      /* the KV cache pools */
    int64_t buffers; /* activations, step inputs and logits, and the backends' own work
                        buffers (the vision tower's included) */
} celer_context_memory;

celer_context_memory celer_context_get_memory(const celer_context *ctx);

/* Device i of this machine and build (i = 0, 1, ...): its name for params.device
 * ("cpu", "cuda:0") in name and a description in desc; false past the last. */
bool celer_device_at(int i, char *name, size_t name_size, char *desc, size_t desc_size);
/* Device class i of this build that offers no device here (i = 0, 1, ...): its name
 * ("cuda") in name and the one-line reason in why (its module could not be loaded, no device
 * was found, the build has none); false past the last. Both lists load the CUDA module
 * (celer-cuda.so beside the binary) on first use; nothing else that runs on the CPU does. */
bool celer_device_missing_at(int i, char *name, size_t name_size, char *why, size_t why_size);
/* Threads ctx runs each op on. */
int32_t celer_context_n_threads(const celer_context *ctx);
/* Rows ctx runs in one internal step (params.n_batch, or the device's where that was 0). */
int64_t celer_context_n_batch(const celer_context *ctx);

/* Whether this CPU (and OS) can run the named kernel set; false for unknown names. */
bool celer_kernels_supported(const char *name);
/* Physical cores of this machine (at least 1): the default thread count. */
int32_t celer_physical_cores(void);

/* The detail of the last failed call on ctx (one line), or "" after success. */
const char *celer_context_last_error(const celer_context *ctx);

/* Forgets every position of sequence seq_id and returns its cache blocks to the pool. */
celer_status celer_seq_reset(celer_context *ctx, int32_t seq_id);
/* Positions sequence seq_id holds in the cache. */
int64_t celer_seq_length(const celer_context *ctx, int32_t seq_id);
/* Rolls sequence seq_id back to its first len positions (len <= its length), e.g. to keep
 * the accepted prefix of drafted tokens. *kept (may be NULL) gets the positions it holds
 * after: len, or less when the block holding position len is shared with another sequence
 * (then the sequence ends at that block's start and the caller computes the rest again). */
celer_status celer_seq_truncate(celer_context *ctx, int32_t seq_id, int64_t len, int64_t *kept);

/* ==== Batches and the model contract (docs/architecture.md, "The model contract") ====
 *
 * Every call below that runs the model either succeeds or changes no sequence: a device
 * failure during the call (CELER_STATUS_DEVICE, CELER_STATUS_OUT_OF_MEMORY, or
 * CELER_STATUS_DEVICE_LOST after which every later call fails the same way) commits no
 * position, leaves the outputs unspecified, and celer_context_last_error names the
 * failed device call. */

/* n rows; each row is appended to its sequence at the next position. A row is a token
 * id, or an input embedding: every row when token is NULL, else the rows whose token is
 * negative (a prompt with an image: its feature rows replace the placeholder ids). embd
 * is required exactly when some row is an embedding row. seq_id NULL means every row
 * belongs to sequence 0. */
typedef struct celer_batch {
    int64_t n;
    const int32_t *token; /* [n] token ids, or -1 for an embedding row; or NULL */
    const float
        *embd; /* [n, d] input embeddings (rows of token rows unread), d = celer_model_n_embd */
    const int32_t *seq_id; /* [n] or NULL */
    const int8_t *logits;  /* [n] nonzero where a row wants logits (celer_batch_decode) */
} celer_batch;

static inline celer_batch celer_batch_tokens(const int32_t *token, int64_t n) {
    celer_batch b = {n, token, NULL, NULL, NULL};
    return b;
}

/* The general step: runs every row through the model (appending to the caches) and
 * writes logits[k, vocab] for the k-th row that wants them, in row order. A mix of
 * sequences (prefill chunks beside decode steps) is one call. */
celer_status celer_batch_decode(celer_context *ctx, const celer_batch *batch, float *logits);

/* What a row's batch->logits flag asks of celer_batch_decode_ids (celer_batch_decode
 * gives logits to every nonzero flag). */
enum {
    CELER_ROW_LOGITS = 1, /* its logits and their argmax */
    CELER_ROW_ARGMAX = 2, /* the argmax only (greedy decoding) */
};

/* celer_batch_decode that also writes ids[k]: the id of the largest logit of the k-th row
 * that wants anything (the first of equal ones; NaN never wins), and logits[k, vocab] for
 * rows flagged CELER_ROW_LOGITS; the logits rows of CELER_ROW_ARGMAX rows are left
 * unspecified. The argmax is taken where the logits are made, so on a GPU only an id per
 * such row comes back to the host instead of its vocabulary of logits. */
celer_status celer_batch_decode_ids(celer_context *ctx, const celer_batch *batch, float *logits,
                                    int32_t *ids);

/* hidden[n, d]: the final-normed hidden state of every row (no LM head). */
celer_status celer_hidden_states(celer_context *ctx, const celer_batch *batch, float *hidden);

/* logits[n, vocab] for every row. For tests and perplexity, not for generation. */
celer_status celer_forward(celer_context *ctx, const celer_batch *batch, float *logits);

/* Single-sequence prefill of sequence 0: logits[vocab] of the row at index last_pos of
 * the batch only; the LM head runs on that one row. */
celer_status celer_forward_last_logits(celer_context *ctx, const celer_batch *batch,
                                       int64_t last_pos, float *logits);

/* The same for sequence seq_id of a multi-sequence context (batch->seq_id is ignored). */
celer_status celer_forward_last_logits_with_sequence_id(celer_context *ctx,
                                                        const celer_batch *batch, int32_t seq_id,
                                                        int64_t last_pos, float *logits);

/* The same with caller-provided input embeddings embd[n, d] instead of token ids. */
celer_status celer_forward_last_logits_with_embeddings_and_sequence_id(celer_context *ctx,
                                                                       const float *embd, int64_t n,
                                                                       int32_t seq_id,
                                                                       int64_t last_pos,
                                                                       float *logits);

/* The row pos of hidden[n, d], or NULL when pos is outside [0, n). Model code calls it on
 * the final hidden state before the LM head, so the head sees exactly one row. */
const float *celer_logits_at_position(const float *hidden, int64_t n, int64_t d, int64_t pos);

/* The model's input embeddings of ids: embd[n, d] (dequantized rows of embed_tokens). */
celer_status celer_embed_tokens(celer_context *ctx, const int32_t *ids, int64_t n, float *embd);

/* ==== Images (vision-language models) ====
 *
 * A prompt holds one image token (celer_model_image_token) per image block: one per image
 * (LLaVA-NeXT, Gemma 3), or with Gemma 3's pan and scan one for the whole image and one per
 * crop (celer_model_image_blocks). The image's celer_model_image_positions rows are split
 * evenly over its blocks, in order; celer_image_encode gives those rows (vision tower,
 * projector, LLaVA-NeXT's anyres tile layout with image_newline), to run as embedding rows
 * of a batch (token -1):
 *
 *     celer_image *img;
 *     celer_image_load("cat.jpg", &img, err, sizeof err);
 *     int64_t n;
 *     celer_model_image_positions(model, img, &n, err, sizeof err);
 *     float *rows = malloc(sizeof(float) * n * celer_model_n_embd(model));
 *     celer_image_encode(ctx, img, rows);
 *     celer_image_free(img);
 *
 * Gemma 3 (celer_model_image_blocks_whole): the rows of one block attend to each other
 * during prefill, as transformers' Gemma3 attention mask has it. A block is a run of
 * consecutive embedding rows (token -1) of one sequence in a batch, and must lie whole in
 * one call (a batch of only embedding rows, token NULL, has no blocks: every row is causal,
 * as transformers runs inputs_embeds without token_type_ids). The engine keeps blocks whole.
 * Text for a prompt with images goes through celer_model_image_text before tokenizing, as
 * the model's processor rewrites it (Gemma 3's "<start_of_image>" expanded). */
typedef struct celer_image celer_image;
typedef struct celer_tokenizer celer_tokenizer; /* see "Tokenizer" below */

/* A PNG or JPEG file, decoded to RGB as transformers' image processors see it (alpha
 * composited on white, no EXIF rotation). Bad images (truncated, not an image, zero or
 * huge sizes) are an error naming the file. *out has one reference. */
celer_status celer_image_load(const char *path, celer_image **out, char *err, size_t err_size);
/* The same from bytes in memory; label names them in errors. */
celer_status celer_image_decode(const void *data, size_t len, const char *label, celer_image **out,
                                char *err, size_t err_size);
/* One more reference (celer_image_free drops one; the last frees the image). */
celer_image *celer_image_ref(celer_image *img);
void celer_image_free(celer_image *img);
int64_t celer_image_width(const celer_image *img);
int64_t celer_image_height(const celer_image *img);
/* A 64-bit digest of the size and pixels: the prefix cache keys image rows by it. */
uint64_t celer_image_digest(const celer_image *img);

/* Whether model reads images; its image placeholder id, or -1. */
bool celer_model_has_vision(const celer_model *model);
int32_t celer_model_image_token(const celer_model *model);
/* *n = the prompt rows img takes in model's prompts (its image tokens' expansion). */
celer_status celer_model_image_positions(const celer_model *model, const celer_image *img,
                                         int64_t *n, char *err, size_t err_size);
/* *blocks = the image tokens img takes in model's prompts (1, or Gemma 3's whole image and
 * pan-and-scan crops); each stands for celer_model_image_positions / blocks rows. */
celer_status celer_model_image_blocks(const celer_model *model, const celer_image *img,
                                      int64_t *blocks, char *err, size_t err_size);
/* Whether model's image blocks must run whole in one call (Gemma 3: their rows attend to
 * each other during prefill). */
bool celer_model_image_blocks_whole(const celer_model *model);
/* *out (malloc'd, NUL-terminated, *out_len bytes) = text[len] with its image markers as the
 * model's processor rewrites them before tokenizing: for Gemma 3 each "<start_of_image>" (the
 * i-th for images[i]) becomes "\n\n<start_of_image>" + the image token + "<end_of_image>\n\n"
 * (one image token where Gemma3Processor writes mm_tokens_per_image: the engine expands it),
 * and with pan and scan "Here is the original image " + that + " and here are some crops to
 * help you see better " + that sequence per crop, joined by spaces (Gemma3Processor's
 * words). tok gives the markers' text. Other models, or text without markers: a copy. More
 * markers than images is an error naming the count. */
celer_status celer_model_image_text(const celer_model *model, const celer_tokenizer *tok,
                                    const char *text, size_t len, celer_image *const *images,
                                    int32_t n_images, char **out, size_t *out_len, char *err,
                                    size_t err_size);
/* embd[n, d] = the input rows of img (n = celer_model_image_positions). Runs the vision
 * tower on ctx's threads. */
celer_status celer_image_encode(celer_context *ctx, const celer_image *img, float *embd);

/* Rows the LM head ran on in ctx's last successful call (the contract: 1 for the
 * forward_last_logits entry points, however long the batch). */
int64_t celer_context_head_rows(const celer_context *ctx);

/* ==== Greedy generation from token ids ==== */

typedef struct celer_generate_params {
    int32_t seq_id;
    int64_t n_predict;   /* tokens to generate */
    int32_t stop_at_eos; /* stop after the model's EOS id */
} celer_generate_params;

/* Prefills prompt[n_prompt] into sequence seq_id (which must be empty), then decodes
 * greedily one token per step. Writes the generated ids to out (capacity n_predict) and
 * their count to *n_out. */
celer_status celer_generate_greedy(celer_context *ctx, const int32_t *prompt, int64_t n_prompt,
                                   const celer_generate_params *params, int32_t *out,
                                   int64_t *n_out);

/* ==== Tokenizer ==== */

/* A Hugging Face tokenizer.json (BPE: Llama 2/3, Mistral, Qwen2/3, SmolLM2). Immutable
 * once open: any number of threads may tokenize with one handle.
 *
 *     celer_tokenizer *tok;
 *     if (celer_tokenizer_open("path/to/model", &tok, err, sizeof err) != CELER_OK) { ... }
 *     int32_t *ids; int64_t n;
 *     celer_tokenize(tok, "Hello", 5, true, &ids, &n, err, sizeof err);  // BOS, Hello
 *     free(ids);
 *     celer_tokenizer_close(tok);
 */
typedef struct celer_tokenizer celer_tokenizer;

/* path: a tokenizer.json file or a directory holding one. On failure *out is NULL and
 * err holds one line naming the file and the JSON path at fault. */
celer_status celer_tokenizer_open(const char *path, celer_tokenizer **out, char *err,
                                  size_t err_size);
void celer_tokenizer_close(celer_tokenizer *tok);

/* Ids of the UTF-8 text[len] (invalid UTF-8 is an error), as Hugging Face
 * tokenizer(text)["input_ids"] gives them; add_special adds the template tokens (BOS).
 * *ids is malloc'd (also when *n is 0); the caller frees it with free(). */
celer_status celer_tokenize(const celer_tokenizer *tok, const char *text, size_t len,
                            bool add_special, int32_t **ids, int64_t *n, char *err,
                            size_t err_size);

/* Text of ids[n] (NUL-terminated, *len bytes, len may be NULL); skip_special drops
 * special tokens such as BOS. *text is malloc'd; the caller frees it with free(). */
celer_status celer_detokenize(const celer_tokenizer *tok, const int32_t *ids, int64_t n,
                              bool skip_special, char **text, size_t *len, char *err,
                              size_t err_size);

/* Ids of the vocabulary, added tokens included. */
int64_t celer_tokenizer_n_vocab(const celer_tokenizer *tok);

/* ==== Sampling ==== */

/* The chain (in order): repetition penalty over the last repeat_last_n accepted tokens,
 * temperature (0 = greedy), top-k, top-p, min-p, then a seeded draw. */
typedef struct celer_sampler_params {
    float temp;
    int32_t top_k;        /* 0 = off */
    float top_p;          /* 1 = off */
    float min_p;          /* 0 = off */
    float repeat_penalty; /* 1 = off */
    int32_t repeat_last_n;
    uint64_t seed;
} celer_sampler_params;

typedef struct celer_sampler celer_sampler;

/* temp 0.8, top-k 40, top-p 0.95, min-p 0.05, no repetition penalty, seed 0. */
celer_sampler_params celer_sampler_default_params(void);
/* NULL when out of memory. */
celer_sampler *celer_sampler_create(const celer_sampler_params *params, int64_t n_vocab);
void celer_sampler_destroy(celer_sampler *s);
/* A token from logits[n_vocab]; the logits are not changed. */
int32_t celer_sampler_sample(celer_sampler *s, const float *logits);
/* Records a token for the repetition penalty. */
void celer_sampler_accept(celer_sampler *s, int32_t token);

/* ==== Structured outputs ==== */

/* A JSON Schema (the text of a JSON document) -> a GBNF grammar (llama.cpp's syntax) whose
 * start rule is `root`, for response_format json_schema and tool parameters. Any keyword
 * the compiler does not enforce is refused with one line naming it and its JSON pointer
 * (docs/structured_outputs.md lists what is supported). *gbnf is malloc'd; the caller frees
 * it. On error *gbnf is NULL and err holds the message. */
celer_status celer_json_schema_to_grammar(const char *schema_json, char **gbnf, char *err,
                                          size_t err_size);
/* The same as rules to join into a larger grammar: the schema's start rule is named root and
 * every other rule begins with prefix (say "tool0-args" and "tool0-"). */
celer_status celer_json_schema_to_grammar_rules(const char *schema_json, const char *root,
                                                const char *prefix, char **gbnf, char *err,
                                                size_t err_size);
/* A regex (ECMAScript/PCRE subset) -> a GBNF grammar matching the strings it matches in
 * full; backreferences, lookaround and the like are refused by name. Ownership as above. */
celer_status celer_regex_to_grammar(const char *regex, char **gbnf, char *err, size_t err_size);

/* ==== Streaming detokenization ==== */

/* Text of ids arriving one at a time that never ends inside a UTF-8 sequence. */
typedef struct celer_detok_stream celer_detok_stream;

celer_status celer_detok_stream_create(const celer_tokenizer *tok, bool skip_special,
                                       celer_detok_stream **out, char *err, size_t err_size);
void celer_detok_stream_destroy(celer_detok_stream *s);
/* *text (owned by s, valid until the next call) gets the newly complete text of id. */
celer_status celer_detok_stream_push(celer_detok_stream *s, int32_t id, const char **text,
                                     size_t *len, char *err, size_t err_size);
/* Held-back bytes that never completed, as U+FFFD. */
celer_status celer_detok_stream_flush(celer_detok_stream *s, const char **text, size_t *len,
                                      char *err, size_t err_size);

/* ==== Chat templates ==== */

/* Renders a chat template (Jinja source, as in tokenizer_config.json) over messages_json,
 * an OpenAI-style array of {"role", "content", ...} objects (or an object with a
 * "messages" array), as transformers' apply_chat_template(tokenize=False) does.
 * bos_token / eos_token may be NULL (undefined in the template). *out is malloc'd; the
 * caller frees it with free(). On failure err holds one line, "template line L column C:
 * ..." for a template error or a raise_exception in it.
 *
 *     char *prompt;
 *     celer_chat_template_render(src, "[{\"role\": \"user\", \"content\": \"Hi\"}]", 1,
 *                                "<s>", "</s>", &prompt, err, sizeof err);
 */
celer_status celer_chat_template_render(const char *template_src, const char *messages_json,
                                        int add_generation_prompt, const char *bos_token,
                                        const char *eos_token, char **out, char *err,
                                        size_t err_size);

/* The same with extra template variables: vars_json (NULL for none) is a JSON object whose
 * members the template sees as globals, as apply_chat_template's keyword arguments, e.g.
 * {"enable_thinking": false} (what vLLM and llama-server take as "chat_template_kwargs")
 * or {"tools": [...]}. "messages", "add_generation_prompt", "bos_token" and "eos_token"
 * come from the other arguments and are refused here. */
celer_status celer_chat_template_render_vars(const char *template_src, const char *messages_json,
                                             const char *vars_json, int add_generation_prompt,
                                             const char *bos_token, const char *eos_token,
                                             char **out, char *err, size_t err_size);

/* The chat template of a model: in a checkpoint directory chat_template.jinja, else the
 * chat_template of tokenizer_config.json; in a .gguf file tokenizer.chat_template. Also
 * its bos/eos token texts. Each out string is malloc'd, NULL when
 * absent; the caller frees them with free(). */
celer_status celer_chat_template_load(const char *model_path, char **template_src, char **bos_token,
                                      char **eos_token, char *err, size_t err_size);

/* ==== Engine: requests, continuous batching, paged KV pool with a prefix cache ====
 *
 * An engine owns one context whose KV pool (a number of 16-position blocks) is shared by
 * up to n_seq_max running sequences. Requests (prompt ids, sampler, stop rules, limits)
 * wait in a queue; each celer_engine_step builds one batch from a decode row of every
 * running sequence plus prefill chunks up to batch_tokens, runs it, samples, and reports
 * what each request produced through a callback. Full blocks are keyed by a chained hash
 * of their tokens and shared read-only between sequences; a new request attaches the
 * longest cached prefix and prefills only the rest. When a step does not fit the pool,
 * the youngest running sequence is pre-empted (its blocks freed, recomputed later).
 *
 *     celer_engine *eng;
 *     celer_engine_create(model, tok, NULL, &eng, err, sizeof err);
 *     celer_request_params rp = celer_request_default_params();
 *     rp.prompt = ids, rp.n_prompt = n, rp.max_tokens = 64;
 *     uint64_t id;
 *     celer_engine_submit(eng, &rp, &id, err, sizeof err);
 *     while (celer_engine_pending(eng)) celer_engine_step(eng, on_event, user);
 *
 * Not thread-safe: one thread at a time calls into an engine (a server serializes
 * submissions, cancellations and steps with its own lock). */

typedef struct celer_engine celer_engine;

typedef struct celer_engine_params {
    int32_t n_seq_max;    /* sequences running at once (-np) */
    int64_t n_ctx;        /* positions one sequence may hold: prompt + completion */
    int64_t kv_positions; /* the pool shared by every sequence, in positions (rounded up to
                             whole blocks); 0 = n_seq_max * n_ctx */
    int64_t batch_tokens; /* rows per step: decode rows first, prefill chunks fill the rest */
    int32_t max_queue;    /* requests waiting before submit answers CELER_STATUS_BUSY */
    int32_t n_threads;    /* 0 = physical cores */
    const char *kernels;  /* as celer_context_params.kernels */
    const char *kv_type;  /* as celer_context_params.kv_type */
    const char *device;   /* as celer_context_params.device */
    bool prefix_cache;    /* reuse cached blocks across requests */
} celer_engine_params;

/* 4 sequences, n_ctx 4096, kv_positions 0, batch_tokens 512, max_queue 256, prefix cache
 * on. */
celer_engine_params celer_engine_default_params(void);

/* tok may be NULL: events then carry no text and stop strings are refused. The model and
 * tokenizer must outlive the engine. */
celer_status celer_engine_create(celer_model *model, const celer_tokenizer *tok,
                                 const celer_engine_params *params, celer_engine **out, char *err,
                                 size_t err_size);
void celer_engine_destroy(celer_engine *eng);

#define CELER_MAX_TOP_LOGPROBS 20
#define CELER_MAX_CHOICES      128

typedef struct celer_request_params {
    const int32_t *prompt; /* [n_prompt] ids, copied at submit */
    int64_t n_prompt;
    int64_t max_tokens; /* completion tokens per choice; -1 = until the context is full */
    int32_t n;          /* choices (1 to CELER_MAX_CHOICES and at most max_queue); they
                           share the prompt's cache blocks and run n_seq_max at a time */
    celer_sampler_params sampling; /* choice i draws with seed + i */
    float presence_penalty;        /* OpenAI's: subtracted once from a token already generated */
    float frequency_penalty;       /* subtracted per earlier occurrence in the completion */
    const int32_t *bias_ids;       /* [n_bias] logit bias added before sampling, copied */
    const float *bias;
    int32_t n_bias;
    const int32_t *stop_ids; /* [n_stop_ids] ids that end a choice, besides the model's EOS */
    int32_t n_stop_ids;
    bool ignore_eos;         /* the model's EOS ids do not stop (stop_ids still do) */
    const char *const *stop; /* [n_stop] stop strings: matched across token boundaries,
                                never emitted; text that could still become one is held */
    int32_t n_stop;
    int32_t top_logprobs;       /* -1 = no log-probabilities; else the chosen token's and this
                                   many alternatives (at most CELER_MAX_TOP_LOGPROBS) */
    celer_image *const *images; /* [n_images] for a vision-language model: the prompt holds
                                   one image token per image block (celer_model_image_blocks),
                                   in order; each expands to its block's rows (prompt_tokens
                                   counts them). The engine keeps
                                   a reference to each until the request ends, encodes an
                                   image when its rows are first computed, and keys cached
                                   blocks by the image's digest. */
    int32_t n_images;
    const char *grammar; /* GBNF (llama.cpp's syntax, start rule "root") that each choice's
                            text must follow, or NULL; copied and compiled at submit (an error
                            names its line and column; the engine needs a tokenizer). Only
                            tokens that keep the text a prefix of one of its sentences are
                            sampled, EOS and stop ids only where a sentence may end, and a
                            choice whose sentence nothing can extend ends with
                            CELER_FINISH_STOP. celer_json_schema_to_grammar makes one from a
                            JSON Schema. */
    bool keep_special;   /* special tokens the model writes appear in the text (tool-call
                            markers such as <|python_tag|>); EOS and stop ids never do */
} celer_request_params;

/* n 1, max_tokens 16, default sampler, no stops beyond EOS, no logprobs. */
celer_request_params celer_request_default_params(void);

typedef enum celer_finish_reason {
    CELER_FINISH_NONE = 0,  /* the choice goes on */
    CELER_FINISH_STOP,      /* an EOS/stop id or a stop string */
    CELER_FINISH_LENGTH,    /* max_tokens, or the sequence filled n_ctx */
    CELER_FINISH_CANCELLED, /* celer_engine_cancel */
    CELER_FINISH_ERROR,     /* a model step failed (celer_engine_step returned its status;
                               celer_engine_last_error says why) */
} celer_finish_reason;

/* What one step produced for one choice of one request. Pointers are valid only during
 * the callback. */
typedef struct celer_event {
    uint64_t request;
    int32_t index;    /* the choice */
    int32_t token;    /* the sampled id, or -1 on an event that only ends the choice */
    const char *text; /* text released by this event (may be empty) */
    size_t text_len;
    float logprob; /* log-probability of token under the model (top_logprobs >= 0) */
    int32_t n_top;
    const int32_t *top_ids; /* [n_top], most likely first */
    const float *top_logprobs;
    celer_finish_reason finish;
    /* Set on the event that ends a choice: */
    int64_t prompt_tokens; /* the prompt's length */
    int64_t cached_tokens; /* prompt positions taken from the prefix cache, never computed */
    int64_t completion_tokens;
    const char *error; /* CELER_FINISH_ERROR: why, one line (else NULL) */
} celer_event;

typedef void (*celer_event_fn)(void *user, const celer_event *ev);

/* Queues a request; *id names it in events and celer_engine_cancel. Fails with
 * CELER_STATUS_INVALID_ARGUMENT (bad parameters, a prompt that leaves no room in n_ctx:
 * the message gives both counts) or CELER_STATUS_BUSY (max_queue requests wait). */
celer_status celer_engine_submit(celer_engine *eng, const celer_request_params *params,
                                 uint64_t *id, char *err, size_t err_size);

/* Ends every choice of a request now: its blocks return to the pool and each choice not
 * yet ended gets a CELER_FINISH_CANCELLED event at the next step. */
celer_status celer_engine_cancel(celer_engine *eng, uint64_t id);

/* Runs one scheduler step and calls fn for each event: celer_engine_run, then
 * celer_engine_emit. A failure of the model step ends the affected requests (never the
 * engine): every choice of each request that had rows in the step ends with
 * CELER_FINISH_ERROR, nothing of the step is kept, and the step returns the status with the
 * last error. Other requests go on at the next step (after CELER_STATUS_DEVICE_LOST, they
 * fail there in turn). */
celer_status celer_engine_step(celer_engine *eng, celer_event_fn fn, void *user);

/* The two halves of a step, for an owner that serializes calls with a lock.
 * celer_engine_run plans the batch, runs the model and picks every choice's token (under
 * the lock). celer_engine_emit then detokenizes those tokens, matches stop strings and calls
 * fn for each event; it touches nothing that celer_engine_submit, celer_engine_cancel or
 * celer_engine_get_stats do, so the owner may let go of its lock first, but only the
 * thread that ran the step calls it, once, before the next run. A choice a stop string ends
 * gets its final event from emit and leaves its sequence at the start of the next run. */
celer_status celer_engine_run(celer_engine *eng);
void celer_engine_emit(celer_engine *eng, celer_event_fn fn, void *user);

/* Whether any request is waiting or running. */
bool celer_engine_pending(const celer_engine *eng);

typedef struct celer_engine_stats {
    int32_t running, waiting;
    int64_t kv_blocks_total, kv_blocks_used; /* used: held by a sequence */
    int64_t kv_blocks_cached;                /* unreferenced, kept for the prefix cache */
    int64_t prompt_tokens_total;             /* prompt tokens submitted */
    int64_t generation_tokens_total;
    int64_t prefix_queries_total; /* prompt blocks looked up */
    int64_t prefix_hits_total;    /* of which were found */
    int64_t preemptions_total;
} celer_engine_stats;

celer_engine_stats celer_engine_get_stats(const celer_engine *eng);
const char *celer_engine_last_error(const celer_engine *eng);

#ifdef __cplusplus
}
#endif
#endif /* CELER_H */
