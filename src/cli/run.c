/*
 * run.c - `celer run [MODEL] [-p TEXT]`: chat with a model.
 *
 * With -p it answers once. Otherwise it reads user turns line by line from stdin (a
 * REPL with a prompt when stdin is a terminal; /reset forgets the conversation, /exit
 * or end of input leaves), keeps the history, renders it with the model's chat template
 * each turn and feeds only what the KV cache does not already hold. Without MODEL it
 * uses the default model that tools/fetch_model.sh puts in the cache.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli/session.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage_text[] =
    "usage: celer run [MODEL] [-p TEXT] [--system TEXT] [-n N] [--temp T] [--top-k K] [--top-p P]\n"
    "       [--min-p P] [--repeat-penalty R] [--seed S] [--chat-template-kwargs JSON] [-t THREADS] "
    "[-c CTX]";

/* One assistant turn over the history; appends the reply to it. */
static void turn(cli_session *s, const cli_prompt_opts *po, const char *model_path, json_t *history,
                 int64_t n_predict, int32_t *out, double t_load) {
    char *text = json_dumps(history, 0), err[512];
    if (!text) cli_die("the message is not valid UTF-8");
    int64_t n;
    int32_t *ids = cli_chat_ids(s->m, model_path, s->tok, NULL, text, po->template_kwargs, &n);
    free(text);
    cli_stats st;
    const int64_t got = cli_session_reply(s, ids, n, n_predict, false, false, out, &st);
    printf("\n");
    cli_stats_print(&st, t_load);
    char *reply;
    if (celer_detokenize(s->tok, out, got, true, &reply, NULL, err, sizeof err) != CELER_OK)
        cli_die("%s", err);
    json_array_append_new(history, json_pack("{s:s, s:s}", "role", "assistant", "content", reply));
    free(reply);
    free(ids);
}

int cmd_run(int argc, char **argv) {
    if (cli_help(argc, argv, usage_text)) return 0;
    cli_model_opts o = {0};
    cli_prompt_opts po = {0};
    int64_t n_predict = -1;
    celer_sampler_params sp = celer_sampler_default_params();
    sp.seed = (uint64_t)time(NULL);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (cli_model_flag(&o, argc, argv, &i) || cli_prompt_flag(&po, argc, argv, &i) ||
            cli_sampler_flag(&sp, argc, argv, &i))
            continue;
        if (!strcmp(a, "-n") && i + 1 < argc)
            n_predict = cli_parse_int("-n", argv[++i]);
        else if (a[0] != '-' && !o.model)
            o.model = cli_model_path(a);
        else
            cli_die("run: unknown or incomplete option %s\n%s", a, usage_text);
    }
    if (po.no_template)
        cli_die("run: a chat needs the chat template (use `celer generate --no-chat-template`)");
    if (n_predict < -1 || n_predict == 0) cli_die("-n: expected a positive count or -1");
    if (!o.model) o.model = cli_default_model();
    const double t0 = cli_now();
    celer_model *m = cli_open_model(&o);
    celer_tokenizer *tok = cli_open_tokenizer(o.model);
    const int64_t n_ctx = cli_context_size(&o, m, 1, -1);
    cli_session s;
    cli_session_open(&s, &o, m, tok, &sp, n_ctx);
    const double t_load = cli_now() - t0;
    int32_t *out = malloc(sizeof *out * (size_t)n_ctx);
    json_t *history = json_array();
    if (!out || !history) cli_die("out of memory");
    json_t *sys =
        po.system ? json_pack("{s:s, s:s}", "role", "system", "content", po.system) : NULL;
    if (po.system && !sys) cli_die("--system: the text is not valid UTF-8");
    if (sys) json_array_append(history, sys);
    if (po.prompt) {
        json_t *user = json_pack("{s:s, s:s}", "role", "user", "content", po.prompt);
        if (!user) cli_die("-p: the prompt is not valid UTF-8");
        json_array_append_new(history, user);
        turn(&s, &po, o.model, history, n_predict, out, t_load);
    } else {
        const bool tty = isatty(STDIN_FILENO);
        char *line = NULL;
        size_t cap = 0;
        if (tty)
            fprintf(stderr, "%s\n/reset forgets the conversation, /exit leaves\n",
                    celer_model_desc(m));
        for (;;) {
            if (tty) fputs("> ", stdout), fflush(stdout);
            ssize_t len = getline(&line, &cap, stdin);
            if (len < 0) break;
            while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
            if (len == 0) continue;
            if (!strcmp(line, "/exit")) break;
            if (!strcmp(line, "/reset")) {
                json_array_clear(history);
                if (sys) json_array_append(history, sys);
                continue;
            }
            json_t *msg = json_pack("{s:s, s:s}", "role", "user", "content", line);
            if (!msg) {
                fprintf(stderr, "celer: the line is not valid UTF-8; ignored\n");
                continue;
            }
            json_array_append_new(history, msg);
            turn(&s, &po, o.model, history, n_predict, out, -1);
        }
        free(line);
    }
    json_decref(history);
    json_decref(sys);
    free(out);
    cli_session_close(&s);
    celer_tokenizer_close(tok);
    celer_model_close(m);
    return 0;
}
