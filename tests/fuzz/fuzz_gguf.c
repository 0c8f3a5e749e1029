/*
 * fuzz_gguf.c - libFuzzer target for the GGUF parser.
 *
 * Any input must either parse into metadata and tensors that lie inside the input (read
 * here, so ASan sees any overrun) or fail with a message; never crash or leak.
 */
#include "io/gguf.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file g;
    celer_error e;
    if (gguf_parse(&g, "fuzz", data, size, &e) == CELER_OK) {
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < g.n_tensors; i++)
            if (g.tensors[i].nbytes) sink ^= g.tensors[i].data[0] ^ g.tensors[i].data[g.tensors[i].nbytes - 1];
        for (size_t i = 0; i < g.n_kv; i++) {
            const gguf_value *v = &g.kv[i].val;
            if (v->type == GGUF_TYPE_STRING && v->str_len) sink ^= (uint8_t)v->str[v->str_len - 1];
        }
        (void)sink;
    }
    gguf_free(&g);
    return 0;
}
