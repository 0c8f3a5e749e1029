/*
 * test_cli.c - the command line as scripts use it: `celer logits` writes .npy files
 * that match the goldens ([n, vocab] with --all, [1, vocab] of the last row without),
 * `celer generate --print-ids` prints the golden greedy continuation, and bad flags fail
 * with one line; --version and every command's --help; generate held to a JSON Schema or a
 * GBNF grammar on the real model.
 */
#define _DEFAULT_SOURCE
#include "harness.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *bin(void) {
    return getenv("CELER_BIN") ? getenv("CELER_BIN") : "build/celer";
}

static char *ids_str(const int32_t *ids, int64_t n) {
    char *s = malloc((size_t)n * 12 + 1);
    size_t k = 0;
    for (int64_t i = 0; i < n; i++) k += (size_t)sprintf(s + k, i ? ",%d" : "%d", ids[i]);
    s[k] = 0;
    return s;
}

static void check_fixture(const char *name) {
    const char *dir = fixture_path(name);
    char d[4096], cmd[8192], out[4096], npy[128], path[4200];
    snprintf(d, sizeof d, "%s", dir);
    int32_t *ids, *greedy;
    int64_t n, ng, rows, cols, r2, c2;
    if (!CHECK(golden_read(d, &ids, &n, &greedy, &ng) == 0, "%s golden", name)) return;
    snprintf(path, sizeof path, "%s/golden_logits.npy", d);
    float *golden = npy_read_f32(path, &rows, &cols);
    char *ids_s = ids_str(ids, n);
    snprintf(npy, sizeof npy, "/tmp/celer-cli-%d.npy", (int)getpid());

    snprintf(cmd, sizeof cmd, "'%s' logits -m '%s' --ids %s --all -o %s -t 2", bin(), d, ids_s,
             npy);
    CHECK(run_capture(cmd, out, sizeof out) == 0, "%s: logits --all exits 0", name);
    float *all = npy_read_f32(npy, &r2, &c2);
    CHECK(all && r2 == n && c2 == cols, "%s: --all writes [%lld, %lld]", name, (long long)n,
          (long long)cols);
    if (all && golden && r2 == rows && c2 == cols) {
        double diff = max_abs_diff(all, golden, n * cols);
        /* the default (fast) kernels: the tolerance test_parity states for them */
        CHECK(diff <= 2e-3 * max_abs(golden, n * cols), "%s: --all logits differ by %g", name,
              diff);
    }
    snprintf(cmd, sizeof cmd, "'%s' logits -m '%s' --ids %s -o %s", bin(), d, ids_s, npy);
    CHECK(run_capture(cmd, out, sizeof out) == 0, "%s: logits exits 0", name);
    float *last = npy_read_f32(npy, &r2, &c2);
    CHECK(last && r2 == 1 && c2 == cols, "%s: last-row logits are [1, vocab]", name);
    if (last && all) {
        double diff = max_abs_diff(last, all + (n - 1) * cols, cols);
        CHECK(diff <= 1e-6 * max_abs(last, cols), "%s: last row equals --all row n-1 (%g)", name,
              diff);
    }
    unlink(npy);

    snprintf(cmd, sizeof cmd,
             "'%s' generate -m '%s' --ids %s -n %lld --temp 0 --print-ids --ignore-eos", bin(), d,
             ids_s, (long long)ng);
    CHECK(run_capture(cmd, out, sizeof out) == 0, "%s: generate exits 0", name);
    char want[2048];
    size_t k = 0;
    for (int64_t i = 0; i < ng; i++)
        k += (size_t)snprintf(want + k, sizeof want - k, i ? " %d" : "%d", greedy[i]);
    snprintf(want + k, sizeof want - k, "\n");
    CHECK(strcmp(out, want) == 0, "%s: generate printed \"%s\", golden \"%s\"", name, out, want);
    free(all), free(last), free(golden), free(ids_s), free(ids), free(greedy);
}

static void check_fails(const char *what, const char *args, const char *needle) {
    char cmd[4096], out[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1 >/dev/null", bin(), args);
    int rc = run_capture(cmd, out, sizeof out);
    int lines = 0;
    for (char *p = out; *p; p++) lines += *p == '\n';
    CHECK(rc == 1 && strstr(out, needle) && lines >= 1, "%s: exit %d, output: %s", what, rc, out);
}

/* A copy of fixture name in /tmp whose config.json edit() rewrites. */
static const char *variant(const char *name, void (*edit)(json_t *)) {
    static char dir[256];
    char cmd[4600], path[300];
    snprintf(dir, sizeof dir, "/tmp/celer-variant-%d", (int)getpid());
    /* -L: a fixture tree of symlinks must not let the edit reach the original */
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -rL '%s' '%s'", dir, fixture_path(name), dir);
    if (system(cmd) != 0) CHECK(false, "copy %s", name);
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *c = json_load_file(path, 0, NULL);
    edit(c);
    json_dump_file(c, path, JSON_INDENT(2));
    json_decref(c);
    return dir;
}

static int32_t eos_stop;

/* eos_token_id as a list, as Llama 3 configs have it. */
static void eos_list(json_t *c) {
    json_object_set_new(c, "eos_token_id", json_pack("[i,i]", 999 % 512, eos_stop));
}

/* transformers 5 style: rope_theta and the scaling inside rope_parameters. */
static void rope_parameters(json_t *c) {
    json_t *rp = json_deep_copy(json_object_get(c, "rope_scaling"));
    json_object_set(rp, "rope_theta", json_object_get(c, "rope_theta"));
    json_object_set_new(c, "rope_parameters", rp);
    json_object_del(c, "rope_scaling");
    json_object_del(c, "rope_theta");
}

static void check_config_variants(void) {
    char d[4096], cmd[8192], out[4096], npy[128], path[4200];
    snprintf(d, sizeof d, "%s", fixture_path("llama3-bf16"));
    int32_t *ids, *greedy;
    int64_t n, ng, rows, cols;
    if (golden_read(d, &ids, &n, &greedy, &ng) != 0) return;
    char *ids_s = ids_str(ids, n);

    eos_stop = greedy[3];
    const char *dir = variant("llama3-bf16", eos_list);
    snprintf(cmd, sizeof cmd, "'%s' generate -m '%s' --ids %s -n 16 --temp 0", bin(), dir, ids_s);
    CHECK(run_capture(cmd, out, sizeof out) == 0, "generate with an eos list exits 0");
    int words = 1;
    for (char *p = out; *p; p++) words += *p == ' ';
    bool first_is_eos = false;
    for (int i = 0; i < 3; i++) first_is_eos |= greedy[i] == eos_stop;
    CHECK(first_is_eos || words == 3,
          "generation stops before the second listed eos id, after 3 tokens: %s", out);

    /* Stop ids from generation_config.json count too. */
    dir = variant("llama3-bf16", rope_parameters);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    json_t *gc = json_pack("{s:[i, i]}", "eos_token_id", 999 % 512, eos_stop);
    json_dump_file(gc, path, 0);
    json_decref(gc);
    snprintf(cmd, sizeof cmd, "'%s' generate -m '%s' --ids %s -n 16 --temp 0", bin(), dir, ids_s);
    CHECK(run_capture(cmd, out, sizeof out) == 0, "generate with generation_config.json exits 0");
    words = 1;
    for (char *p = out; *p; p++) words += *p == ' ';
    CHECK(first_is_eos || words == 3, "generation_config.json's eos ids stop generation: %s", out);

    snprintf(npy, sizeof npy, "/tmp/celer-cli-rp-%d.npy", (int)getpid());
    /* the reference bound needs transformers' fp32 cache */
    snprintf(cmd, sizeof cmd, "'%s' logits -m '%s' --ids %s --all --cache-type f32 -o %s", bin(),
             dir, ids_s, npy);
    CHECK(run_capture(cmd, out, sizeof out) == 0, "rope_parameters config loads");
    snprintf(path, sizeof path, "%s/golden_logits.npy", d);
    float *golden = npy_read_f32(path, &rows, &cols), *got = npy_read_f32(npy, &rows, &cols);
    CHECK(golden && got &&
              max_abs_diff(golden, got, rows * cols) <= 1e-4 * max_abs(golden, rows * cols),
          "rope_parameters gives the golden logits");
    unlink(npy);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) CHECK(false, "cleanup");
    free(golden), free(got), free(ids), free(greedy), free(ids_s);
}

/* celer convert: the MLX-layout directory gives the GGUF's logits bit for bit. */
static void check_convert(const char *fixture) {
    char gguf[4200], dir[128], cmd[8192], out[4096], a[160], b[160];
    snprintf(gguf, sizeof gguf, "%s/model.gguf", fixture_path(fixture));
    snprintf(dir, sizeof dir, "/tmp/celer-convert-%d", (int)getpid());
    snprintf(a, sizeof a, "%s.a.npy", dir);
    snprintf(b, sizeof b, "%s.b.npy", dir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && '%s' convert -m '%s' -o '%s'", dir, bin(), gguf, dir);
    CHECK(run_capture(cmd, out, sizeof out) == 0, "%s: convert exits 0", fixture);
    snprintf(cmd, sizeof cmd,
             "'%s' logits -m '%s' --ids 5,9,200,7,3 --all -o '%s' && '%s' logits -m '%s' --ids "
             "5,9,200,7,3 --all -o '%s'",
             bin(), gguf, a, bin(), dir, b);
    CHECK(run_capture(cmd, out, sizeof out) == 0, "%s: logits of both exit 0", fixture);
    int64_t r1, c1, r2, c2;
    float *x = npy_read_f32(a, &r1, &c1), *y = npy_read_f32(b, &r2, &c2);
    CHECK(x && y && r1 == r2 && c1 == c2 && max_abs_diff(x, y, r1 * c1) == 0,
          "%s: converted directory gives identical logits", fixture);
    free(x), free(y);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s'", dir, a, b);
    if (system(cmd) != 0) CHECK(false, "cleanup");
}

/* `celer generate --image --ids` prints the golden greedy ids of a vision-language
 * fixture's case, and `celer logits --image` writes its golden last row. */
static void check_image(const char *name) {
    char path[4400], cmd[8192], out[4096];
    const char *d = fixture_path(name);
    snprintf(path, sizeof path, "%s/golden.json", d);
    json_t *g = json_load_file(path, 0, NULL);
    const json_t *c = json_array_get(json_object_get(g, "cases"), 0);
    if (!CHECK(c != NULL, "%s: golden case", name)) return;
    char ids[2048] = "", want[2048] = "";
    size_t k = 0, w = 0;
    const json_t *t = json_object_get(c, "text_ids"), *gr = json_object_get(c, "greedy");
    for (size_t i = 0; i < json_array_size(t); i++)
        k += (size_t)snprintf(ids + k, sizeof ids - k, i ? ",%lld" : "%lld",
                              (long long)json_integer_value(json_array_get(t, i)));
    for (size_t i = 0; i < json_array_size(gr); i++)
        w += (size_t)snprintf(want + w, sizeof want - w, i ? " %lld" : "%lld",
                              (long long)json_integer_value(json_array_get(gr, i)));
    snprintf(want + w, sizeof want - w, "\n");
    const char *image = json_string_value(json_object_get(c, "image"));
    snprintf(
        cmd, sizeof cmd,
        "'%s' generate -m '%s' --image '%s/%s' --ids %s -n %zu --temp 0 --output-ids --ignore-eos",
        bin(), d, d, image, ids, json_array_size(gr));
    CHECK(run_capture(cmd, out, sizeof out) == 0, "%s: generate --image exits 0", name);
    CHECK(strcmp(out, want) == 0, "%s: generate --image printed \"%s\", golden \"%s\"", name, out,
          want);
    snprintf(
        cmd, sizeof cmd,
        "'%s' logits -m '%s' --image '%s/%s' --ids %s --cache-type f32 -o /tmp/celer-img-%d.npy",
        bin(), d, d, image, ids, (int)getpid());
    CHECK(run_capture(cmd, out, sizeof out) == 0, "%s: logits --image exits 0", name);
    int64_t r, cols, gr_rows, gcols;
    snprintf(path, sizeof path, "/tmp/celer-img-%d.npy", (int)getpid());
    float *got = npy_read_f32(path, &r, &cols);
    remove(path);
    snprintf(path, sizeof path, "%s/golden_logits_%s.npy", d,
             json_string_value(json_object_get(c, "name")));
    float *gold = npy_read_f32(path, &gr_rows, &gcols);
    if (CHECK(got && gold && r == 1 && cols == gcols, "%s: logits --image shape", name)) {
        const float *last = gold + (gr_rows - 1) * gcols;
        const double dd = max_abs_diff(got, last, cols) / max_abs(last, cols);
        CHECK(dd <= 2e-3, "%s: logits --image last row differs by %g", name, dd);
        printf("  %s: generate --image == golden greedy; logits --image last row rel %.2e\n", name,
               dd);
    }
    free(got), free(gold);
    /* bad images and prompts: one clear line each */
    char args[8192];
    snprintf(args, sizeof args, "logits -m '%s' --image '%s/config.json' --ids %s -o /tmp/x.npy", d,
             d, ids);
    check_fails("not an image", args, "not an image");
    snprintf(args, sizeof args, "logits -m '%s' --image /nonexistent.png --ids %s -o /tmp/x.npy", d,
             ids);
    check_fails("missing image file", args, "/nonexistent.png");
    snprintf(args, sizeof args,
             "logits -m '%s' --ids %s -o /tmp/x.npy --image '%s/%s' --image '%s/%s'", d, ids, d,
             image, d, image);
    check_fails("two images, one image token", args, "2 --image files but 1 image tokens");
    snprintf(args, sizeof args, "generate -m '%s' --ids 1,2,3 --image '%s/%s'",
             fixture_path("llama3-bf16"), d, image);
    check_fails("image for a text model", args, "reads no images");
    json_decref(g);
}

/* `celer generate --image -p` (the chat template's image part) and `--text` with <image>
 * answer as transformers does on the chat fixture (tests/server/fixtures/llava-chat). */
static void check_image_chat(void) {
    const char *d = "tests/server/fixtures/llava-chat";
    char path[512], cmd[4096], out[4096];
    snprintf(path, sizeof path, "%s/golden.json", d);
    json_t *g = json_load_file(path, 0, NULL);
    const json_t *c = json_object_get(json_object_get(g, "cases"), "a");
    if (!CHECK(c != NULL, "chat fixture golden")) return;
    const char *prompt = json_string_value(json_object_get(g, "prompt"));
    const char *want = json_string_value(json_object_get(c, "completion_text"));
    snprintf(
        cmd, sizeof cmd,
        "'%s' generate -m %s --image %s/image_a.png -p '%s' -n 8 --temp 0 --ignore-eos 2>/dev/null",
        bin(), d, d, prompt);
    CHECK(run_capture(cmd, out, sizeof out) == 0, "generate --image -p exits 0");
    CHECK(!strncmp(out, want, strlen(want)),
          "generate --image -p answered \"%s\", transformers \"%s\"", out, want);
    snprintf(cmd, sizeof cmd,
             "'%s' generate -m %s --image %s/image_a.png --text \"$(printf 'USER: "
             "<image>\\n%s\\nASSISTANT:')\" -n 8 "
             "--temp 0 --ignore-eos 2>/dev/null",
             bin(), d, d, prompt);
    CHECK(run_capture(cmd, out, sizeof out) == 0, "generate --image --text exits 0");
    CHECK(!strncmp(out, want, strlen(want)),
          "generate --image --text answered \"%s\", transformers \"%s\"", out, want);
    printf("  llava-chat: generate --image with -p and with --text answers \"%s\" as transformers "
           "does\n",
           want);
    json_decref(g);
}

/* The ids of json array a as "1,2,3" (sep ",") or "1 2 3" (sep " ") into out[cap]. */
static void join_ids(char *out, size_t cap, const json_t *a, const char *sep) {
    size_t k = 0;
    out[0] = '\0';
    for (size_t i = 0; i < json_array_size(a) && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%lld", i ? sep : "",
                              (long long)json_integer_value(json_array_get(a, i)));
}

/* Gemma 3 case `cname` of fixture `name`: `celer generate --image... --ids` prints the golden
 * greedy ids, `celer logits --image... --all` writes every golden row; with -p (the chat
 * template's image parts) and --text (the template's text), the markers rewritten as
 * Gemma3Processor does give the same greedy ids. */
static void check_image_gemma3(const char *name, const char *cname) {
    char path[4400], cmd[16384], out[4096], ids[4096], want[2048], images[4096] = "";
    const char *d = fixture_path(name);
    snprintf(path, sizeof path, "%s/golden.json", d);
    json_t *g = json_load_file(path, 0, NULL);
    const json_t *c = NULL, *cases = json_object_get(g, "cases");
    for (size_t i = 0; i < json_array_size(cases); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(cases, i), "name")), cname))
            c = json_array_get(cases, i);
    if (!CHECK(c != NULL, "%s: golden case %s", name, cname)) goto out;
    const json_t *files = json_object_get(c, "images"), *gr = json_object_get(c, "greedy");
    size_t k = 0;
    for (size_t i = 0; i < json_array_size(files); i++)
        k += (size_t)snprintf(images + k, sizeof images - k, " --image '%s/%s'", d,
                              json_string_value(json_array_get(files, i)));
    join_ids(ids, sizeof ids, json_object_get(c, "text_ids"), ",");
    join_ids(want, sizeof want - 1, gr, " ");
    strcat(want, "\n");
    snprintf(cmd, sizeof cmd,
             "'%s' generate -m '%s'%s --ids %s -n %zu --temp 0 --output-ids --ignore-eos", bin(), d,
             images, ids, json_array_size(gr));
    CHECK(run_capture(cmd, out, sizeof out) == 0, "%s/%s: generate --image --ids exits 0", name,
          cname);
    CHECK(strcmp(out, want) == 0, "%s/%s: generate --image --ids printed \"%s\", golden \"%s\"",
          name, cname, out, want);
    snprintf(path, sizeof path, "/tmp/celer-g3-%d.npy", (int)getpid());
    snprintf(cmd, sizeof cmd, "'%s' logits -m '%s'%s --ids %s --all --cache-type f32 -o %s", bin(),
             d, images, ids, path);
    CHECK(run_capture(cmd, out, sizeof out) == 0, "%s/%s: logits --image --all exits 0", name,
          cname);
    int64_t r, cols, gr_rows, gcols;
    float *got = npy_read_f32(path, &r, &cols);
    remove(path);
    snprintf(path, sizeof path, "%s/golden_logits_%s.npy", d, cname);
    float *gold = npy_read_f32(path, &gr_rows, &gcols);
    double dd = -1;
    if (CHECK(got && gold && r == gr_rows && cols == gcols, "%s/%s: logits --image --all shape",
              name, cname)) {
        dd = max_abs_diff(got, gold, r * cols) / max_abs(gold, r * cols);
        CHECK(dd <= 2e-3, "%s/%s: logits --image --all differ by %g", name, cname, dd);
    }
    free(got), free(gold);
    /* the chat template's text: its last user text is the -p prompt, its images the --image files
     */
    const json_t *msg = json_array_get(json_object_get(c, "messages"), 0),
                 *parts = json_object_get(msg, "content");
    const char *prompt = json_string_value(
        json_object_get(json_array_get(parts, json_array_size(parts) - 1), "text"));
    if (json_array_size(parts) ==
        json_array_size(files) + 1) { /* [images..., text]: the -p layout */
        snprintf(
            cmd, sizeof cmd,
            "'%s' generate -m '%s'%s -p '%s' -n %zu --temp 0 --output-ids --ignore-eos 2>/dev/null",
            bin(), d, images, prompt, json_array_size(gr));
        CHECK(run_capture(cmd, out, sizeof out) == 0, "%s/%s: generate --image -p exits 0", name,
              cname);
        CHECK(strcmp(out, want) == 0, "%s/%s: generate --image -p printed \"%s\", golden \"%s\"",
              name, cname, out, want);
    }
    char fmt[4096] = "";
    const char *text = json_string_value(json_object_get(c, "text"));
    for (size_t i = 0, j = 0; text[i] && j + 3 < sizeof fmt; i++) /* newlines as printf's \n */
        if (text[i] == '\n')
            fmt[j++] = '\\', fmt[j++] = 'n';
        else
            fmt[j++] = text[i];
    /* (an x after the text keeps the command substitution from eating its last newline) */
    snprintf(cmd, sizeof cmd,
             "t=\"$(printf '%sx')\"; '%s' generate -m '%s'%s --text \"${t%%x}\" -n %zu --temp 0 "
             "--output-ids --ignore-eos "
             "2>/dev/null",
             fmt, bin(), d, images, json_array_size(gr));
    CHECK(run_capture(cmd, out, sizeof out) == 0, "%s/%s: generate --image --text exits 0", name,
          cname);
    CHECK(strcmp(out, want) == 0, "%s/%s: generate --image --text printed \"%s\", golden \"%s\"",
          name, cname, out, want);
    printf("  %s/%s: generate --image (--ids, -p, --text) == golden greedy; logits --image --all "
           "rel %.2e\n",
           name, cname, dd);
    /* a marker without its image: one clear line */
    char args[16384];
    snprintf(args, sizeof args, "generate -m '%s' --text \"$(printf '%s')\" -n 2", d, fmt);
    check_fails("a marker without an image", args, "markers for 0 images");
out:
    json_decref(g);
}

/* The usual conventions: --version, and COMMAND --help on stdout with exit 0. */
static void check_help(void) {
    char cmd[512], out[4096];
    snprintf(cmd, sizeof cmd, "'%s' --version", bin());
    CHECK(run_capture(cmd, out, sizeof out) == 0 && !strncmp(out, "celer ", 6), "--version: \"%s\"",
          out);
    const char *cmds[] = {"logits",  "generate", "run",        "inspect",  "perplexity",
                          "convert", "tokenize", "detokenize", "template", "bench",
                          "serve",   "ls",       "pull"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        snprintf(cmd, sizeof cmd, "'%s' %s --help 2>/dev/null", bin(), cmds[i]);
        const int rc = run_capture(cmd, out, sizeof out);
        CHECK(rc == 0 && strstr(out, "usage: celer") && strstr(out, cmds[i]),
              "%s --help: exit %d, stdout \"%.80s\"", cmds[i], rc, out);
    }
}

/* generate under a JSON Schema or a GBNF grammar, on the real model: the text is valid
 * JSON of the schema, or a sentence of the grammar; a keyword the compiler refuses is named. */
static void check_structured(void) {
    const char *model = real_model_path();
    if (access(model, R_OK) != 0) {
        SKIP_REQUIRED("structured generate: the default model is missing (%s)", model);
        return;
    }
    const char *schema = "/tmp/celer-cli-schema.json";
    FILE *f = fopen(schema, "w");
    if (!f) return;
    fputs("{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", "
          "\"maxLength\": 20}, \"people\": {\"type\": \"integer\", \"minimum\": 0}}, "
          "\"required\": [\"city\", \"people\"], \"additionalProperties\": false}",
          f);
    fclose(f);
    char cmd[4096], out[4096];
    for (int seed = 1; seed <= 3; seed++) {
        snprintf(cmd, sizeof cmd,
                 "'%s' generate -m '%s' -p 'A city as JSON.' --json-schema %s -n 80 --temp 0.8 "
                 "--seed %d -t 2 2>/dev/null",
                 bin(), model, schema, seed);
        CHECK(run_capture(cmd, out, sizeof out) == 0, "generate --json-schema exits 0");
        json_error_t je;
        json_t *v = json_loads(out, 0, &je);
        const json_t *city = json_object_get(v, "city"), *people = json_object_get(v, "people");
        CHECK(json_is_object(v) && json_object_size(v) == 2 && json_is_string(city) &&
                  json_string_length(city) <= 20 && json_is_integer(people) &&
                  json_integer_value(people) >= 0,
              "--json-schema seed %d: \"%s\"", seed, out);
        json_decref(v);
    }
    snprintf(
        cmd, sizeof cmd,
        "'%s' generate -m '%s' -p 'Is water wet?' --grammar 'root ::= (\"yes\" | \"no\") \".\"' "
        "-n 10 -t 2 2>/dev/null",
        bin(), model);
    CHECK(run_capture(cmd, out, sizeof out) == 0 &&
              (!strcmp(out, "yes.\n") || !strcmp(out, "no.\n")),
          "--grammar: \"%s\"", out);
    char args[4200];
    snprintf(args, sizeof args,
             "generate -m '%s' -p x --json-schema '{\"type\": \"integer\", "
             "\"multipleOf\": 2}'",
             model);
    check_fails("an unsupported schema keyword", args, "multipleOf");
    snprintf(args, sizeof args, "generate -m '%s' -p x --grammar 'root ::= ['", model);
    check_fails("a malformed grammar", args, "grammar: line 1");
    unlink(schema);
}

int main(void) {
    check_help();
    check_structured();
    check_image("llava-mistral-mlx-q4");
    check_image_gemma3("gemma3-vision-mlx-bf16", "wide");
    check_image_gemma3("gemma3-vision-hf-bf16", "two");
    check_image_chat();
    check_convert("llama-tied-gguf-q4_1");
    check_convert("qwen2-gguf-q8_0");
    check_config_variants();
    check_fixture("llama3-q4g64");
    check_fixture("qwen2-bf16");
    char args[4200];
    snprintf(args, sizeof args, "logits -m '%s' --ids 1,2,x -o /tmp/x.npy",
             fixture_path("llama3-bf16"));
    check_fails("bad --ids", args, "--ids");
    snprintf(args, sizeof args, "logits -m '%s' --ids 1,99999 -o /tmp/x.npy",
             fixture_path("llama3-bf16"));
    check_fails("token id past vocab", args, "outside the vocabulary");
    snprintf(args, sizeof args, "generate -m '%s' --ids 1,2 -n 10 -c 4",
             fixture_path("llama3-bf16"));
    check_fails("context too small", args, "-c 4");
    check_fails("no model", "logits --ids 1 -o /tmp/x.npy", "-m MODEL");
    check_fails("unknown command", "frobnicate", "unknown command");
    return harness_done("test_cli");
}
