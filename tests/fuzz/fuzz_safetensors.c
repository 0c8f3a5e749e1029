/*
 * fuzz_safetensors.c - libFuzzer target for the safetensors header parser.
 *
 * Any input must either parse into tensors whose bytes all lie inside the input (read
 * here, so ASan sees any overrun) or fail with a message; never crash or leak.
 */
#include "io/safetensors.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    safetensors st;
    celer_error e;
    memset(&st, 0, sizeof st);
    if (safetensors_parse(&st, "fuzz", data, size, &e) == CELER_OK) {
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < st.n_tensors; i++) {
            const st_tensor *t = &st.tensors[i];
            if (t->nbytes) sink ^= t->data[0] ^ t->data[t->nbytes - 1];
            if (safetensors_find(&st, t->name) != t) __builtin_trap();
        }
        (void)sink;
    }
    safetensors_close(&st);
    return 0;
}
