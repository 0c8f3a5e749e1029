/*
 * main.c - the celer command line: dispatches to one file per subcommand.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fputs(
        "usage: celer COMMAND [options]\n"
        "  logits   -m MODEL --ids 1,2,3 [--all] -o FILE.npy   float32 logits\n"
        "  generate -m MODEL (-p TEXT | --ids 1,2,3) [-n N] [--temp T] [--top-k K] [--top-p P] "
        "[--min-p P]\n"
        "           [--repeat-penalty R] [--seed S] [--system TEXT] [--chat-template-kwargs JSON]\n"
        "           [--no-chat-template] [--ignore-eos] [--json-schema FILE|JSON] [--grammar-file "
        "FILE]\n"
        "  run [MODEL] [-p TEXT]                                  chat (REPL), or one answer with "
        "-p\n"
        "  inspect [-m MODEL] [-c CTX]                            architecture, size, memory; "
        "devices\n"
        "  perplexity -m MODEL -f FILE [-c CTX]                   perplexity of a text\n"
        "  convert -m MODEL.gguf -o DIR                           GGUF to an MLX-layout "
        "checkpoint\n"
        "  tokenize -m PATH (--text S | --file F) [--no-add-special] [--json]   ids of a text\n"
        "  detokenize -m PATH --ids 1,2,3 [--skip-special]   text of ids\n"
        "  template -m MODEL --messages FILE.json [--add-generation-prompt] "
        "[--chat-template-kwargs JSON]\n"
        "                                                         prompt from the chat template\n"
        "  bench -m MODEL [-p 512,2048] [-n 128] [-d 0,2048] [-r 5] [-t N] [-c CTX] "
        "[--full-logits] [-o md|json]\n"
        "        [--memory]                                       prefill/decode speed, as "
        "llama-bench\n"
        "  serve [-m MODEL] [--host H] [--port P] [-np N] [-c KV_POSITIONS] [--api-key K] "
        "[--metrics] ...\n"
        "                                                         OpenAI-compatible HTTP server\n"
        "  ls                                                     models in the Hugging Face "
        "cache\n"
        "  pull ORG/NAME[:QUANT][@REV]                            download a model from the "
        "Hugging Face Hub\n"
        "  --version                                              the release\n"
        "common options: -t THREADS, -c CTX, --cache-type f16|f32, --device cpu|cuda[:N] (or "
        "$CELER_DEVICE)\n"
        "MODEL is a checkpoint directory (config.json + *.safetensors), a .gguf file, or a name\n"
        "ORG/NAME[:QUANT][@REV] of the Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub, "
        "~/.cache/huggingface/hub),\n"
        "downloaded from the Hub ($HF_ENDPOINT, $HF_TOKEN) when it is not there, unless "
        "HF_HUB_OFFLINE=1\n",
        f);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("celer %s\n", CELER_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "logits")) return cmd_logits(argc - 2, argv + 2);
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 2, argv + 2);
    if (!strcmp(argv[1], "run")) return cmd_run(argc - 2, argv + 2);
    if (!strcmp(argv[1], "inspect")) return cmd_inspect(argc - 2, argv + 2);
    if (!strcmp(argv[1], "perplexity")) return cmd_perplexity(argc - 2, argv + 2);
    if (!strcmp(argv[1], "convert")) return cmd_convert(argc - 2, argv + 2);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(argv[1], "detokenize")) return cmd_detokenize(argc - 2, argv + 2);
    if (!strcmp(argv[1], "template")) return cmd_template(argc - 2, argv + 2);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 2, argv + 2);
    if (!strcmp(argv[1], "serve")) return cmd_serve(argc - 2, argv + 2);
    if (!strcmp(argv[1], "ls")) return cmd_ls(argc - 2, argv + 2);
    if (!strcmp(argv[1], "pull")) return cmd_pull(argc - 2, argv + 2);
    fprintf(stderr, "celer: unknown command %s\n", argv[1]);
    usage(stderr);
    return 1;
}
