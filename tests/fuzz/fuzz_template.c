/*
 * fuzz_template.c - libFuzzer target for the chat template parser and evaluator.
 *
 * The input is a template. It must either fail to parse with a message, or render over
 * a small fixed conversation (with and without add_generation_prompt) to a string or
 * fail with a message; never crash, leak, or run unbounded.
 */
#include "tokenizer/chat_template.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char conversation[] =
    "[{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\\"there\\\"\\n\\u00e9\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>x</think>Hello\", \"tool_calls\": [{\"function\": {\"name\": \"f\","
    " \"arguments\": {\"a\": [1, 2.5, null, true]}}}]},"
    " {\"role\": \"user\", \"content\": \"\"}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *messages;
    if (!messages) messages = json_loads(conversation, 0, NULL);
    chat_template *t;
    celer_error e;
    if (chat_template_parse((const char *)data, size, &t, &e) != CELER_OK) return 0;
    for (int agp = 0; agp < 2; agp++) {
        chat_template_opts o = {.add_generation_prompt = agp, .bos_token = "<s>", .eos_token = "</s>"};
        char *out = NULL;
        size_t len = 0;
        if (chat_template_render(t, messages, &o, &out, &len, &e) == CELER_OK) {
            volatile char sink = len ? out[len - 1] : 0;
            (void)sink;
            free(out);
        }
    }
    chat_template_free(t);
    return 0;
}
