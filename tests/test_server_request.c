/*
 * test_server_request.c - the server's request parser (src/server/request.c): every
 * field's accepted and rejected forms, the field each error names and its status; the
 * image_url content parts (data: URLs, the strict base64 decoder against an independent
 * encoder, the parts the template sees); chat_template_kwargs and how it combines with
 * the server's --chat-template-kwargs; the response builders (UTF-8 repair, error,
 * chunk and logprob shapes); the metrics text;
 * and, without a model, the HTTP plumbing (404, 405, 401, 413, /health while loading).
 * Generation over a real model is left to the end-to-end suite.
 */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"

#include "server/metrics.h"
#include "server/openai.h"
#include "server/request.h"
#include "server/server.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const request_limits lim = {1000, 512, false, NULL};

/* Parses body as kind; true when it was accepted. */
static bool parse(request_kind kind, const char *body, server_request *r, request_error *e) {
    return request_parse(kind, body, strlen(body), &lim, r, e);
}

static void accepts(request_kind kind, const char *body) {
    server_request r;
    request_error e;
    CHECK(parse(kind, body, &r, &e), "accepts %s: refused with \"%s\"", body, e.message);
    request_free(&r);
}

/* Refused with status 400 naming param ("" for none). */
static void refuses(request_kind kind, const char *body, const char *param) {
    server_request r;
    request_error e;
    const bool ok = parse(kind, body, &r, &e);
    CHECK(!ok && e.status == 400 && !strcmp(e.param, param) && e.message[0] &&
              !strcmp(e.type, "invalid_request_error"),
          "refuses %s: ok %d status %d param \"%s\" (want \"%s\") message \"%s\"", body, ok,
          e.status, e.param, param, e.message);
    if (ok) request_free(&r);
}

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void chat(const char *extra, bool ok, const char *param) {
    char body[1024];
    snprintf(body, sizeof body, "{" MSG "%s%s}", extra[0] ? "," : "", extra);
    if (ok)
        accepts(REQUEST_CHAT, body);
    else
        refuses(REQUEST_CHAT, body, param);
}

static void completion(const char *extra, bool ok, const char *param) {
    char body[1024];
    snprintf(body, sizeof body, "{\"prompt\":\"hi\"%s%s}", extra[0] ? "," : "", extra);
    if (ok)
        accepts(REQUEST_COMPLETION, body);
    else
        refuses(REQUEST_COMPLETION, body, param);
}

/* ==== Bodies and messages ==== */

static void check_bodies(void) {
    server_request r;
    request_error e;
    CHECK(!parse(REQUEST_CHAT, "{\"messages\": [}", &r, &e) && e.status == 400 && !e.param[0] &&
              strstr(e.message, "line 1") && strstr(e.message, "column"),
          "malformed JSON: %s", e.message);
    refuses(REQUEST_CHAT, "", "");
    refuses(REQUEST_CHAT, "[1,2]", "");
    refuses(REQUEST_CHAT, "\"text\"", "");
    refuses(REQUEST_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
            ""); /* bad UTF-8 */
    refuses(REQUEST_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", "");
    refuses(REQUEST_CHAT, "{" MSG "} trailing", "");
    /* Not NUL-terminated: the parser reads exactly len bytes. */
    const char body[] = "{" MSG "}XXXX";
    CHECK(request_parse(REQUEST_CHAT, body, sizeof body - 5, &lim, &r, &e),
          "length-bounded body: %s", e.message);
    request_free(&r);
}

static void check_messages(void) {
    refuses(REQUEST_CHAT, "{}", "messages");
    refuses(REQUEST_CHAT, "{\"messages\":null}", "messages");
    refuses(REQUEST_CHAT, "{\"messages\":[]}", "messages");
    refuses(REQUEST_CHAT, "{\"messages\":{}}", "messages");
    refuses(REQUEST_CHAT, "{\"messages\":[\"hi\"]}", "messages[0]");
    refuses(REQUEST_CHAT, "{\"messages\":[{\"content\":\"hi\"}]}", "messages[0].role");
    refuses(REQUEST_CHAT, "{\"messages\":[{\"role\":\"\",\"content\":\"hi\"}]}",
            "messages[0].role");
    refuses(REQUEST_CHAT, "{\"messages\":[{\"role\":7,\"content\":\"hi\"}]}", "messages[0].role");
    refuses(REQUEST_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}",
            "messages[0].content");
    refuses(REQUEST_CHAT,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
            "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image_"
            "url\"}]}]}",
            "messages[1].content[1].type");
    refuses(REQUEST_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]}",
            "messages[0].content[0].type");
    refuses(REQUEST_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
            "messages[0].content[0].text");
    refuses(REQUEST_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[\"a\"]}]}",
            "messages[0].content[0]");
    accepts(REQUEST_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"content\":null}]}");
    accepts(REQUEST_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\"}]}");

    /* Parts are joined; other message fields stay; the content becomes one string. */
    server_request r;
    request_error e;
    const bool ok =
        parse(REQUEST_CHAT,
              "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
              "{\"role\":\"user\",\"name\":\"x\",\"content\":[{\"type\":\"text\",\"text\":\"Hel\"},"
              "{\"type\":\"text\",\"text\":\"lo \\u00e9\"}]}]}",
              &r, &e);
    json_t *m = ok ? json_loads(r.messages_json, 0, NULL) : NULL;
    const char *c1 = json_string_value(json_object_get(json_array_get(m, 1), "content"));
    CHECK(ok && json_array_size(m) == 2 && c1 && !strcmp(c1, "Hello \xc3\xa9") &&
              !strcmp(json_string_value(json_object_get(json_array_get(m, 1), "name")), "x") &&
              !strcmp(json_string_value(json_object_get(json_array_get(m, 0), "content")),
                      "Be brief."),
          "content parts joined: %s", ok ? r.messages_json : e.message);
    json_decref(m);
    if (ok) request_free(&r);
}

/* ==== Images ==== */

static const request_limits lim_vision = {1000, 512, true, "llava-test"};
static const request_limits lim_text = {1000, 512, false, "SmolLM2-test"};

/* Plain base64 with padding, written independently of the decoder: out[] must hold
 * 4 * ceil(n / 3) + 1 characters. */
static void b64_encode(const unsigned char *in, size_t n, char *out) {
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t w = 0;
    for (size_t i = 0; i < n; i += 3) {
        const size_t k = n - i < 3 ? n - i : 3;
        unsigned v = (unsigned)in[i] << 16;
        if (k > 1) v |= (unsigned)in[i + 1] << 8;
        if (k > 2) v |= in[i + 2];
        out[w++] = digits[v >> 18 & 63];
        out[w++] = digits[v >> 12 & 63];
        out[w++] = k > 1 ? digits[v >> 6 & 63] : '=';
        out[w++] = k > 2 ? digits[v & 63] : '=';
    }
    out[w] = '\0';
}

/* Decodes s; true with the bytes in out[*n], or false with *at and *why. */
static bool b64(const char *s, unsigned char *out, int64_t *n, size_t *at, const char **why) {
    *at = 12345, *why = NULL;
    *n = request_base64_decode(s, strlen(s), out, why, at);
    return *n >= 0;
}

static void check_base64(void) {
    unsigned char out[256];
    int64_t n = 0;
    size_t at = 0;
    const char *why = NULL;
    CHECK(b64("", out, &n, &at, &why) && n == 0, "empty base64: %lld", (long long)n);
    CHECK(b64("TWFu", out, &n, &at, &why) && n == 3 && !memcmp(out, "Man", 3), "TWFu");
    CHECK(b64("TWE=", out, &n, &at, &why) && n == 2 && !memcmp(out, "Ma", 2), "TWE=");
    CHECK(b64("TQ==", out, &n, &at, &why) && n == 1 && out[0] == 'M', "TQ==");
    CHECK(b64("+/+/", out, &n, &at, &why) && n == 3 && out[0] == 0xfb && out[1] == 0xff &&
              out[2] == 0xbf,
          "+/ digits");

    /* Every length 0..99 of pseudo-random bytes round-trips through the encoder above. */
    uint64_t seed = 0x5eed;
    int bad = 0;
    for (size_t len = 0; len < 100; len++) {
        unsigned char in[100];
        char enc[160];
        for (size_t i = 0; i < len; i++) in[i] = (unsigned char)((rand_uniform(&seed) + 1) * 128);
        b64_encode(in, len, enc);
        if (!b64(enc, out, &n, &at, &why) || n != (int64_t)len || memcmp(in, out, len)) bad++;
    }
    CHECK(bad == 0, "base64 round trips: %d of 100 lengths wrong", bad);

    static const struct {
        const char *s;
        size_t at;
        const char *why; /* a word of the reason */
    } refused[] = {
        {"TWF", 3, "multiple of 4"},       {"TWFuT", 5, "multiple of 4"},
        {"TW=u", 3, "after '='"},          {"TW=uTWFu", 2, "before the end"},
        {"T===", 1, "before the end"},     {"====", 0, "before the end"},
        {"TWE=TWFu", 3, "before the end"}, {"TQ=A", 3, "after '='"},
        {"TR==", 1, "not zero"},           {"TWF=", 2, "not zero"},
        {"TW u", 2, "alphabet"},           {"TWF\n", 3, "alphabet"},
        {"TW-_", 2, "alphabet"},           {"TWFu\r\n", 6, "multiple of 4"},
        {"TW\xc3\xa9", 2, "alphabet"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        const bool ok = b64(refused[i].s, out, &n, &at, &why);
        CHECK(!ok && n == -1 && at == refused[i].at && why && strstr(why, refused[i].why),
              "base64 \"%s\" refused at %zu (%s): ok %d at %zu why %s", refused[i].s, refused[i].at,
              refused[i].why, ok, at, why ? why : "(none)");
    }
}

/* A chat body with one user message whose content is the JSON array parts. */
static bool parse_parts(const request_limits *l, const char *parts, server_request *r,
                        request_error *e) {
    char body[4096];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":%s}]}", parts);
    return request_parse(REQUEST_CHAT, body, strlen(body), l, r, e);
}

/* An image part with url (a JSON string's contents). */
#define IMG(url) "{\"type\":\"image_url\",\"image_url\":{\"url\":\"" url "\"}}"
#define PNG64    "data:image/png;base64,iVBORw0KGgo="

/* Refused (400) naming param, with word in the message. */
static void parts_refused(const request_limits *l, const char *parts, const char *param,
                          const char *word) {
    server_request r;
    request_error e;
    const bool ok = parse_parts(l, parts, &r, &e);
    CHECK(!ok && e.status == 400 && !strcmp(e.param, param) && strstr(e.message, word) &&
              !strncmp(e.message, param, strlen(param)),
          "refuses %s: ok %d status %d param \"%s\" (want \"%s\") message \"%s\" (want \"%s\")",
          parts, ok, e.status, e.param, param, e.message, word);
    if (ok) request_free(&r);
}

static void check_image_parts(void) {
    server_request r;
    request_error e;
    static const unsigned char png_head[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

    /* The file's bytes, where they came from, and the parts in order for the template. */
    bool ok = parse_parts(&lim_vision,
                          "[{\"type\":\"text\",\"text\":\"Look: \"}," IMG(
                              PNG64) ",{\"type\":\"text\",\"text\":\"what is it?\"}]",
                          &r, &e);
    json_t *m = ok ? json_loads(r.messages_json, 0, NULL) : NULL;
    json_t *c = json_object_get(json_array_get(m, 0), "content");
    CHECK(ok && r.n_images == 1 && r.images[0].len == 8 && !memcmp(r.images[0].data, png_head, 8) &&
              !strcmp(r.images[0].param, "messages[0].content[1].image_url.url"),
          "an image part's bytes: %s", ok ? "" : e.message);
    CHECK(json_array_size(c) == 3 &&
              !strcmp(json_string_value(json_object_get(json_array_get(c, 0), "type")), "text") &&
              !strcmp(json_string_value(json_object_get(json_array_get(c, 0), "text")), "Look: ") &&
              !strcmp(json_string_value(json_object_get(json_array_get(c, 1), "type")), "image") &&
              json_object_size(json_array_get(c, 1)) == 1 &&
              !strcmp(json_string_value(json_object_get(json_array_get(c, 2), "text")),
                      "what is it?"),
          "the template sees [text, image, text] in order: %s", ok ? r.messages_json : e.message);
    json_decref(m);
    if (ok) request_free(&r);

    /* Images across messages, in order; text-only messages keep one string; detail and the
     * JPEG media types, in any case, are accepted. */
    const char *body =
        "{\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"S\"}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":"
        "\"data:image/jpeg;base64,/9j/\",\"detail\":\"low\"}}]},"
        "{\"role\":\"assistant\",\"content\":\"A\"},"
        "{\"role\":\"user\",\"content\":[" IMG("DATA:Image/JPG;name=x.jpg;BASE64,AAE=") "," IMG(
            PNG64) "]}]}";
    ok = request_parse(REQUEST_CHAT, body, strlen(body), &lim_vision, &r, &e);
    m = ok ? json_loads(r.messages_json, 0, NULL) : NULL;
    CHECK(ok && r.n_images == 3 && r.images[0].len == 3 && r.images[0].data[0] == 0xff &&
              r.images[0].data[1] == 0xd8 && r.images[1].len == 2 && r.images[1].data[1] == 1 &&
              r.images[2].len == 8 &&
              !strcmp(r.images[1].param, "messages[3].content[0].image_url.url") &&
              !strcmp(r.images[2].param, "messages[3].content[1].image_url.url"),
          "images of several messages, in order: %s", ok ? "" : e.message);
    CHECK(json_is_string(json_object_get(json_array_get(m, 0), "content")) &&
              json_is_string(json_object_get(json_array_get(m, 2), "content")) &&
              json_array_size(json_object_get(json_array_get(m, 1), "content")) == 1 &&
              json_array_size(json_object_get(json_array_get(m, 3), "content")) == 2,
          "only messages with images keep a list: %s", ok ? r.messages_json : "");
    json_decref(m);
    if (ok) request_free(&r);

    /* URLs celer does not take. */
    const char *url = "messages[0].content[0].image_url.url";
    parts_refused(&lim_vision, "[" IMG("http://example.com/cat.png") "]", url,
                  "only base64 data: URLs");
    parts_refused(&lim_vision, "[" IMG("https://example.com/cat.png") "]", url, "\"https:\"");
    parts_refused(&lim_vision, "[" IMG("file:///etc/passwd") "]", url, "never fetches");
    parts_refused(&lim_vision, "[" IMG("cat.png") "]", url, "only base64 data: URLs");
    parts_refused(&lim_vision, "[" IMG("") "]", url, "only base64 data: URLs");
    parts_refused(&lim_vision, "[" IMG("data:image/png,iVBORw0KGgo=") "]", url, "not base64");
    parts_refused(&lim_vision, "[" IMG("data:image/png;base64") "]", url, "','");
    parts_refused(&lim_vision, "[" IMG("data:text/plain;base64,aGk=") "]", url, "\"text/plain\"");
    parts_refused(&lim_vision, "[" IMG("data:;base64,aGk=") "]", url, "only base64 data: URLs");
    parts_refused(&lim_vision, "[" IMG("data:image/gif;base64,R0lGODlh") "]", url, "image/gif");
    parts_refused(&lim_vision, "[" IMG("data:image/png;base64,") "]", url, "no data");
    /* Bad base64: the offset is within the data. */
    parts_refused(&lim_vision, "[" IMG("data:image/png;base64,iVBO*wAA") "]", url,
                  "invalid base64 at character 4");
    parts_refused(&lim_vision, "[" IMG("data:image/png;base64,iVB=RwAA") "]", url, "padding");
    parts_refused(&lim_vision, "[" IMG("data:image/png;base64,iVBORw0KGgo") "]", url,
                  "multiple of 4");
    parts_refused(&lim_vision, "[" IMG("data:image/png;base64,iVBO Rw0") "]", url, "alphabet");
    /* The part's shape. */
    parts_refused(&lim_vision, "[{\"type\":\"image_url\"}]", "messages[0].content[0].image_url",
                  "expected an object");
    parts_refused(&lim_vision, "[{\"type\":\"image_url\",\"image_url\":\"" PNG64 "\"}]",
                  "messages[0].content[0].image_url", "found a string");
    parts_refused(&lim_vision, "[{\"type\":\"image_url\",\"image_url\":{\"url\":5}}]", url,
                  "expected a string");
    parts_refused(&lim_vision,
                  "[{\"type\":\"image_url\",\"image_url\":{\"url\":\"" PNG64 "\",\"detail\":7}}]",
                  "messages[0].content[0].image_url.detail", "\"low\"");
    parts_refused(&lim_vision, "[{\"type\":\"input_audio\",\"input_audio\":{}}]",
                  "messages[0].content[0].type", "\"input_audio\"");
    parts_refused(&lim_vision, "[{\"type\":\"image\"}]", "messages[0].content[0].type",
                  "\"image_url\" parts are supported");
    /* A text-only model names itself; images outside user messages are refused. */
    parts_refused(&lim_text, "[{\"type\":\"text\",\"text\":\"a\"}," IMG(PNG64) "]",
                  "messages[0].content[1].type", "SmolLM2-test is text-only");
    refuses(REQUEST_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"content\":[" IMG(PNG64) "]}]}",
            "messages[0].content[0].type");
    body = "{\"messages\":[{\"role\":\"system\",\"content\":[" IMG(PNG64) "]}]}";
    ok = request_parse(REQUEST_CHAT, body, strlen(body), &lim_vision, &r, &e);
    CHECK(!ok && !strcmp(e.param, "messages[0].content[0].type") &&
              strstr(e.message, "user messages"),
          "an image in a system message: %s", e.message);
    if (ok) request_free(&r);

    /* At most REQUEST_MAX_IMAGES images. */
    char many[4096] = "[";
    for (int i = 0; i <= REQUEST_MAX_IMAGES; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%s" IMG(PNG64), i ? "," : "");
    strcat(many, "]");
    char last[64];
    snprintf(last, sizeof last, "messages[0].content[%d].image_url.url", REQUEST_MAX_IMAGES);
    parts_refused(&lim_vision, many, last, "at most");
    many[strlen(many) - strlen("," IMG(PNG64) "]")] = '\0';
    strcat(many, "]");
    ok = parse_parts(&lim_vision, many, &r, &e);
    CHECK(ok && r.n_images == REQUEST_MAX_IMAGES, "%d images accepted: %s", REQUEST_MAX_IMAGES,
          ok ? "" : e.message);
    if (ok) request_free(&r);

    /* An error that quotes a client's text cut inside a UTF-8 sequence stays valid JSON. */
    request_fail(&e, 400, "invalid_request_error", NULL, "x\xc3", "bad \xe2\x82");
    json_t *err = openai_error(&e);
    CHECK(err &&
              !strcmp(json_string_value(json_object_get(json_object_get(err, "error"), "message")),
                      "bad \xef\xbf\xbd\xef\xbf\xbd"),
          "error text cut inside UTF-8 is repaired");
    json_decref(err);
}

/* ==== Fields ==== */

static void check_defaults(void) {
    server_request r;
    request_error e;
    bool ok = parse(REQUEST_CHAT, "{" MSG "}", &r, &e);
    CHECK(ok && r.max_tokens == -1 && r.n == 1 && r.sampling.temp == 1.0f &&
              r.sampling.top_p == 1.0f && r.sampling.top_k == 0 && r.sampling.min_p == 0.0f &&
              r.sampling.repeat_penalty == 1.0f && !r.seed_given && !r.stream && !r.logprobs &&
              r.n_stop == 0 && r.n_bias == 0,
          "chat defaults (OpenAI's): max_tokens %lld temp %g top_p %g", (long long)r.max_tokens,
          r.sampling.temp, r.sampling.top_p);
    if (ok) request_free(&r);
    ok = parse(REQUEST_COMPLETION, "{\"prompt\":\"hi\"}", &r, &e);
    CHECK(ok && r.max_tokens == 16 && r.text && !strcmp(r.text, "hi") && !r.ids,
          "completion defaults: max_tokens 16");
    if (ok) request_free(&r);
    /* null is the default, as absent. */
    ok = parse(REQUEST_CHAT,
               "{" MSG ",\"temperature\":null,\"max_tokens\":null,\"stop\":null,\"seed\":null,"
               "\"logit_bias\":null,\"tools\":null,\"response_format\":null,\"n\":null}",
               &r, &e);
    CHECK(ok && r.sampling.temp == 1.0f && r.max_tokens == -1 && r.n == 1, "nulls are defaults: %s",
          e.message);
    if (ok) request_free(&r);
}

static void check_numbers(void) {
    chat("\"max_tokens\":1", true, "");
    chat("\"max_tokens\":512", true, "");
    chat("\"max_tokens\":8.0", true, "");
    chat("\"max_tokens\":0", false, "max_tokens");
    chat("\"max_tokens\":-1", false, "max_tokens");
    chat("\"max_tokens\":513", false, "max_tokens"); /* beyond the context */
    chat("\"max_tokens\":1e300", false, "max_tokens");
    chat("\"max_tokens\":8.5", false, "max_tokens");
    chat("\"max_tokens\":\"8\"", false, "max_tokens");
    chat("\"max_tokens\":true", false, "max_tokens");
    chat("\"max_completion_tokens\":0", false, "max_completion_tokens");
    completion("\"max_tokens\":99999999999999999", false, "max_tokens");
    refuses(REQUEST_COMPLETION, "{\"prompt\":\"hi\",\"max_tokens\":99999999999999999999999}", "");

    server_request r;
    request_error e;
    bool ok = parse(REQUEST_CHAT, "{" MSG ",\"max_tokens\":9,\"max_completion_tokens\":7}", &r, &e);
    CHECK(ok && r.max_tokens == 7, "max_completion_tokens wins over max_tokens");
    if (ok) request_free(&r);

    chat("\"temperature\":0", true, "");
    chat("\"temperature\":2", true, "");
    chat("\"temperature\":-0.1", false, "temperature");
    chat("\"temperature\":2.01", false, "temperature");
    chat("\"temperature\":\"1\"", false, "temperature");
    chat("\"top_p\":1", true, "");
    chat("\"top_p\":0.01", true, "");
    chat("\"top_p\":0", false, "top_p");
    chat("\"top_p\":1.5", false, "top_p");
    chat("\"top_k\":0", true, "");
    chat("\"top_k\":40", true, "");
    chat("\"top_k\":-1", false, "top_k");
    chat("\"top_k\":1.5", false, "top_k");
    chat("\"min_p\":0.05", true, "");
    chat("\"min_p\":1.1", false, "min_p");
    chat("\"repeat_penalty\":1.1", true, "");
    chat("\"repeat_penalty\":0", false, "repeat_penalty");
    chat("\"presence_penalty\":-2", true, "");
    chat("\"presence_penalty\":2.5", false, "presence_penalty");
    chat("\"frequency_penalty\":2", true, "");
    chat("\"frequency_penalty\":-3", false, "frequency_penalty");
    chat("\"frequency_penalty\":[]", false, "frequency_penalty");
    chat("\"n\":1", true, "");
    chat("\"n\":16", true, "");
    chat("\"n\":0", false, "n");
    chat("\"n\":17", false, "n");
    chat("\"seed\":-5", true, "");
    chat("\"seed\":\"x\"", false, "seed");

    ok =
        parse(REQUEST_CHAT,
              "{" MSG ",\"temperature\":0.5,\"top_p\":0.9,\"top_k\":7,\"min_p\":0.1,\"seed\":42,"
              "\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"n\":3,\"repeat_penalty\":1.2}",
              &r, &e);
    CHECK(ok && fabsf(r.sampling.temp - 0.5f) < 1e-6f && fabsf(r.sampling.top_p - 0.9f) < 1e-6f &&
              r.sampling.top_k == 7 && fabsf(r.sampling.min_p - 0.1f) < 1e-6f && r.seed_given &&
              r.sampling.seed == 42 && fabsf(r.presence_penalty - 0.5f) < 1e-6f &&
              fabsf(r.frequency_penalty + 0.5f) < 1e-6f && r.n == 3 &&
              fabsf(r.sampling.repeat_penalty - 1.2f) < 1e-6f,
          "sampling fields reach the request: %s", e.message);
    if (ok) request_free(&r);
    ok = parse(REQUEST_CHAT, "{" MSG ",\"seed\":-1}", &r, &e);
    CHECK(ok && !r.seed_given, "seed -1 means a random seed");
    if (ok) request_free(&r);
}

static void check_stop_and_bias(void) {
    chat("\"stop\":\"\\n\"", true, "");
    chat("\"stop\":[\"a\",\"b\",\"c\",\"d\"]", true, "");
    chat("\"stop\":[]", true, "");
    chat("\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]", false, "stop");
    chat("\"stop\":\"\"", false, "stop");
    chat("\"stop\":[\"a\",\"\"]", false, "stop[1]");
    chat("\"stop\":[\"a\",3]", false, "stop[1]");
    chat("\"stop\":7", false, "stop");
    server_request r;
    request_error e;
    bool ok = parse(REQUEST_CHAT, "{" MSG ",\"stop\":[\"END\",\"\\n\\n\"]}", &r, &e);
    CHECK(ok && r.n_stop == 2 && !strcmp(r.stop[0], "END") && !strcmp(r.stop[1], "\n\n"),
          "stop list");
    if (ok) request_free(&r);

    chat("\"logit_bias\":{}", true, "");
    chat("\"logit_bias\":{\"0\":-100,\"999\":100}", true, "");
    chat("\"logit_bias\":{\"1000\":1}", false, "logit_bias.1000"); /* outside the vocabulary */
    chat("\"logit_bias\":{\"-1\":1}", false, "logit_bias.-1");
    chat("\"logit_bias\":{\"abc\":1}", false, "logit_bias.abc");
    chat("\"logit_bias\":{\"\":1}", false, "logit_bias.");
    chat("\"logit_bias\":{\"5\":101}", false, "logit_bias.5");
    chat("\"logit_bias\":{\"5\":\"1\"}", false, "logit_bias.5");
    chat("\"logit_bias\":[1]", false, "logit_bias");
    ok = parse(REQUEST_CHAT, "{" MSG ",\"logit_bias\":{\"7\":-2.5,\"9\":3}}", &r, &e);
    CHECK(
        ok && r.n_bias == 2 &&
            ((r.bias_ids[0] == 7 && r.bias[0] == -2.5f && r.bias_ids[1] == 9 &&
              r.bias[1] == 3.0f) ||
             (r.bias_ids[1] == 7 && r.bias[1] == -2.5f && r.bias_ids[0] == 9 && r.bias[0] == 3.0f)),
        "logit_bias ids and values");
    if (ok) request_free(&r);
}

static void check_flags_and_unsupported(void) {
    chat("\"stream\":true", true, "");
    chat("\"stream\":\"yes\"", false, "stream");
    chat("\"stream\":1", false, "stream");
    chat("\"stream\":true,\"stream_options\":{\"include_usage\":true}", true, "");
    chat("\"stream_options\":5", false, "stream_options");
    chat("\"stream_options\":{\"include_usage\":\"y\"}", false, "stream_options.include_usage");
    chat("\"logprobs\":true,\"top_logprobs\":20", true, "");
    chat("\"logprobs\":true,\"top_logprobs\":21", false, "top_logprobs");
    chat("\"top_logprobs\":2", false, "top_logprobs"); /* needs logprobs: true */
    chat("\"logprobs\":2", false, "logprobs");
    chat("\"model\":\"anything\"", true, "");
    chat("\"model\":5", false, "model");
    chat("\"user\":\"u\",\"metadata\":{\"x\":1},\"whatever\":[1,2]", true,
         ""); /* unknown: ignored */
    chat("\"ignore_eos\":true", true, "");
    chat("\"tools\":[]", true, "");
    chat("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", true, "");
    chat("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{"
         "\"type\":\"object\"}}}],\"tool_choice\":\"required\",\"parallel_tool_calls\":false",
         true, "");
    chat("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{"
         "\"type\":\"function\",\"function\":{\"name\":\"f\"}}",
         true, "");
    chat("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{"
         "\"type\":\"function\",\"function\":{\"name\":\"g\"}}",
         false, "tool_choice");
    chat("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f g\"}}]", false,
         "tools[0].function.name");
    chat("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]",
         false, "tools[0].function.parameters");
    chat("\"tools\":[{\"type\":\"code\"}]", false, "tools[0]");
    chat("\"tool_choice\":\"required\"", false, "tool_choice");
    chat("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"parallel_tool_"
         "calls\":1",
         false, "parallel_tool_calls");
    chat("\"functions\":[{\"name\":\"f\"}]", false, "functions");
    chat("\"tools\":{}", false, "tools");
    chat("\"response_format\":{\"type\":\"text\"}", true, "");
    chat("\"response_format\":{\"type\":\"json_object\"}", true, "");
    chat("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\","
         "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
         "\"required\":[\"a\"],\"additionalProperties\":false},\"strict\":true}}",
         true, "");
    chat("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"any\"}}", true,
         "");
    chat("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}", false,
         "response_format.json_schema.name");
    chat("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a b\"}}", false,
         "response_format.json_schema.name");
    chat("\"response_format\":{\"type\":\"json_schema\"}", false, "response_format.json_schema");
    chat("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\","
         "\"schema\":{\"type\":\"integer\",\"multipleOf\":3}}}",
         false, "response_format.json_schema.schema");
    chat("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\","
         "\"schema\":[1]}}",
         false, "response_format.json_schema.schema");
    chat("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\","
         "\"strict\":1}}",
         false, "response_format.json_schema.strict");
    chat("\"json_schema\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}", true, "");
    chat("\"json_schema\":{\"type\":\"string\",\"if\":{}}", false, "json_schema");
    chat("\"json_schema\":\"{}\"", false, "json_schema");
    chat("\"grammar\":\"root ::= \\\"yes\\\"\"", true, "");
    chat("\"grammar\":\"\"", true, "");
    chat("\"grammar\":7", false, "grammar");
    chat("\"grammar\":\"root ::= \\\"a\\\"\",\"json_schema\":{}", false, "grammar");
    chat("\"response_format\":{\"type\":\"json_object\"},\"grammar\":\"root ::= \\\"a\\\"\"", false,
         "response_format");
    chat("\"response_format\":{\"type\":\"xml\"}", false, "response_format.type");
    chat("\"response_format\":\"text\"", false, "response_format");
    chat("\"chat_template_kwargs\":{\"enable_thinking\":false}", true, "");
    chat("\"chat_template_kwargs\":null", true, "");
    chat("\"chat_template_kwargs\":{}", true, "");
    chat("\"chat_template_kwargs\":\"enable_thinking\"", false, "chat_template_kwargs");
    chat("\"chat_template_kwargs\":[]", false, "chat_template_kwargs");
    chat("\"chat_template_kwargs\":{\"tools\":[]}", false, "chat_template_kwargs.tools");
    chat("\"chat_template_kwargs\":{\"messages\":[]}", false, "chat_template_kwargs.messages");
    chat("\"chat_template_kwargs\":{\"bos_token\":\"x\"}", false, "chat_template_kwargs.bos_token");

    server_request r;
    request_error e;
    bool ok = parse(REQUEST_CHAT,
                    "{" MSG ",\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                    "\"logprobs\":true,\"top_logprobs\":3}",
                    &r, &e);
    CHECK(ok && r.stream && r.include_usage && r.logprobs && r.top_logprobs == 3, "chat flags");
    if (ok) request_free(&r);
    ok = parse(REQUEST_CHAT, "{" MSG ",\"logprobs\":true}", &r, &e);
    CHECK(ok && r.logprobs && r.top_logprobs == 0, "logprobs without top_logprobs: 0 alternatives");
    if (ok) request_free(&r);
    ok = parse(REQUEST_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":5}", &r, &e);
    CHECK(ok && r.logprobs && r.top_logprobs == 5, "completion logprobs 5");
    if (ok) request_free(&r);
    completion("\"logprobs\":0", true, "");
    completion("\"logprobs\":6", false, "logprobs");
    completion("\"logprobs\":true", false, "logprobs");
    completion("\"echo\":true", false, "echo");
    completion("\"echo\":false", true, "");
    completion("\"best_of\":2", false, "best_of");
    completion("\"suffix\":\"x\"", false, "suffix");
}

/* chat_template_kwargs kept as JSON text, and over the server's default kwargs */
/* What a structured-output field leaves for the engine: the grammar of its schema, GBNF as
 * given, nothing for "text"; a keyword the compiler does not enforce is named. */
static void check_structured(void) {
    server_request r;
    request_error e;
    const char *json_object = "{" MSG ",\"response_format\":{\"type\":\"json_object\"}}";
    if (CHECK(parse(REQUEST_CHAT, json_object, &r, &e), "%s", e.message)) {
        CHECK(r.grammar && strstr(r.grammar, "root ::="), "json_object: grammar \"%.60s\"",
              r.grammar ? r.grammar : "(none)");
        request_free(&r);
    }
    const char *gbnf = "{\"prompt\":\"hi\",\"grammar\":\"root ::= [a-z]+\"}";
    if (CHECK(parse(REQUEST_COMPLETION, gbnf, &r, &e), "%s", e.message)) {
        CHECK(r.grammar && !strcmp(r.grammar, "root ::= [a-z]+"), "grammar: \"%s\"",
              r.grammar ? r.grammar : "(none)");
        request_free(&r);
    }
    const char *text = "{" MSG ",\"response_format\":{\"type\":\"text\"}}";
    if (CHECK(parse(REQUEST_CHAT, text, &r, &e), "%s", e.message)) {
        CHECK(!r.grammar, "text: no grammar");
        request_free(&r);
    }
    const char *bad = "{" MSG ",\"json_schema\":{\"type\":\"object\",\"patternProperties\":{}}}";
    CHECK(!parse(REQUEST_CHAT, bad, &r, &e) && strstr(e.message, "patternProperties") &&
              strstr(e.message, "/patternProperties"),
          "an unsupported keyword is named with its pointer: \"%s\"", e.message);
}

static void check_template_kwargs(void) {
    server_request r;
    request_error e;
    char *vars;
    bool ok = parse(REQUEST_CHAT, "{" MSG "}", &r, &e);
    CHECK(ok && !r.template_kwargs, "no chat_template_kwargs: none kept");
    CHECK(ok && request_template_vars(NULL, &r, &vars) && !vars,
          "no kwargs anywhere: no variables");
    CHECK(ok && request_template_vars("{\"a\":1}", &r, &vars) && vars && !strcmp(vars, "{\"a\":1}"),
          "the server's kwargs alone: %s", ok && vars ? vars : "(none)");
    if (ok) free(vars), request_free(&r);
    ok = parse(REQUEST_CHAT, "{" MSG ",\"chat_template_kwargs\":{}}", &r, &e);
    CHECK(ok && !r.template_kwargs, "empty chat_template_kwargs: none kept");
    if (ok) request_free(&r);
    ok = parse(REQUEST_CHAT,
               "{" MSG ",\"chat_template_kwargs\":{\"enable_thinking\":false,\"x\":[1,\"é\"]}}", &r,
               &e);
    CHECK(ok && r.template_kwargs &&
              !strcmp(r.template_kwargs, "{\"enable_thinking\":false,\"x\":[1,\"é\"]}"),
          "chat_template_kwargs kept: %s", ok && r.template_kwargs ? r.template_kwargs : e.message);
    CHECK(ok && request_template_vars(NULL, &r, &vars) && vars && !strcmp(vars, r.template_kwargs),
          "the request's kwargs alone");
    if (ok) free(vars);
    CHECK(ok && request_template_vars("{\"enable_thinking\":true,\"d\":2}", &r, &vars) && vars &&
              !strcmp(vars, "{\"enable_thinking\":false,\"d\":2,\"x\":[1,\"é\"]}"),
          "the request's kwargs over the server's: %s", ok && vars ? vars : "(none)");
    if (ok) free(vars), request_free(&r);

    /* the server's own default is checked when it starts */
    const char *bad[] = {"[1]", "{\"tools\": []}", "{\"x\": ", "{\"add_generation_prompt\": true}"};
    const char *want[] = {"expected an object", "--chat-template-kwargs.tools", "not valid JSON",
                          "--chat-template-kwargs.add_generation_prompt"};
    for (int i = 0; i < 4; i++) {
        const server_config cfg = {.host = "127.0.0.1",
                                   .port = 0,
                                   .model_path = "/x/model.gguf",
                                   .max_body_bytes = 4096,
                                   .quiet = true,
                                   .chat_template_kwargs = bad[i],
                                   .engine = celer_engine_default_params()};
        char err[256] = "";
        server *s = server_start(&cfg, err, sizeof err);
        CHECK(!s && strstr(err, want[i]), "server_start with --chat-template-kwargs %s: %s", bad[i],
              err);
        if (s) server_destroy(s);
    }
}

static void check_prompts(void) {
    refuses(REQUEST_COMPLETION, "{}", "prompt");
    refuses(REQUEST_COMPLETION, "{\"prompt\":\"\"}", "prompt");
    refuses(REQUEST_COMPLETION, "{\"prompt\":[]}", "prompt");
    refuses(REQUEST_COMPLETION, "{\"prompt\":5}", "prompt");
    refuses(REQUEST_COMPLETION, "{\"prompt\":[1,\"a\"]}", "prompt");
    refuses(REQUEST_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", "prompt");
    refuses(REQUEST_COMPLETION, "{\"prompt\":[1,-2]}", "prompt[1]");
    refuses(REQUEST_COMPLETION, "{\"prompt\":[1,1000]}", "prompt[1]");
    refuses(REQUEST_COMPLETION, "{\"prompt\":[1,2.5]}", "prompt[1]");
    refuses(REQUEST_COMPLETION, "{\"prompt\":[[1,5000]]}", "prompt[0][1]");
    refuses(REQUEST_COMPLETION, "{\"prompt\":[\"\"]}", "prompt[0]");
    refuses(REQUEST_COMPLETION, "{\"prompt\":[[]]}", "prompt[0]");
    server_request r;
    request_error e;
    bool ok = parse(REQUEST_COMPLETION, "{\"prompt\":[3,1,4]}", &r, &e);
    CHECK(ok && !r.text && r.n_ids == 3 && r.ids[0] == 3 && r.ids[2] == 4, "prompt as ids");
    if (ok) request_free(&r);
    ok = parse(REQUEST_COMPLETION, "{\"prompt\":[[9,8]]}", &r, &e);
    CHECK(ok && r.n_ids == 2 && r.ids[0] == 9, "prompt as a batch of one id list");
    if (ok) request_free(&r);
    ok = parse(REQUEST_COMPLETION, "{\"prompt\":[\"Once\"]}", &r, &e);
    CHECK(ok && r.text && !strcmp(r.text, "Once"), "prompt as a batch of one string");
    if (ok) request_free(&r);

    accepts(REQUEST_TOKENIZE, "{\"content\":\"hello\"}");
    accepts(REQUEST_TOKENIZE, "{\"content\":\"\",\"add_special\":true}");
    refuses(REQUEST_TOKENIZE, "{}", "content");
    refuses(REQUEST_TOKENIZE, "{\"content\":1}", "content");
    refuses(REQUEST_TOKENIZE, "{\"content\":\"x\",\"add_special\":\"yes\"}", "add_special");
    ok = parse(REQUEST_TOKENIZE, "{\"content\":\"ab\",\"add_special\":true}", &r, &e);
    CHECK(ok && r.add_special && r.text_len == 2, "tokenize fields");
    if (ok) request_free(&r);
    accepts(REQUEST_DETOKENIZE, "{\"tokens\":[]}");
    accepts(REQUEST_DETOKENIZE, "{\"tokens\":[0,999]}");
    refuses(REQUEST_DETOKENIZE, "{}", "tokens");
    refuses(REQUEST_DETOKENIZE, "{\"tokens\":\"1,2\"}", "tokens");
    refuses(REQUEST_DETOKENIZE, "{\"tokens\":[1,1000]}", "tokens[1]");
}

/* ==== Builders and metrics ==== */

static void check_builders(void) {
    json_t *s = openai_string("a\xff"
                              "b\xe2\x82",
                              5);
    CHECK(s && !strcmp(json_string_value(s), "a\xef\xbf\xbd"
                                             "b\xef\xbf\xbd\xef\xbf\xbd"),
          "invalid UTF-8 becomes U+FFFD");
    json_decref(s);
    s = openai_string("\xe2\x82\xac", 3);
    CHECK(s && !strcmp(json_string_value(s), "\xe2\x82\xac"), "valid UTF-8 kept");
    json_decref(s);

    request_error e;
    request_fail(&e, 400, "invalid_request_error", NULL, "temperature", "temperature: %s", "bad");
    json_t *err = openai_error(&e), *inner = json_object_get(err, "error");
    CHECK(inner && !strcmp(json_string_value(json_object_get(inner, "param")), "temperature") &&
              json_is_null(json_object_get(inner, "code")) &&
              !strcmp(json_string_value(json_object_get(inner, "type")), "invalid_request_error") &&
              !strcmp(json_string_value(json_object_get(inner, "message")), "temperature: bad"),
          "error object shape");
    json_decref(err);

    char id[64];
    openai_make_id("chatcmpl-", id, sizeof id);
    CHECK(strlen(id) == 9 + 24 && !strncmp(id, "chatcmpl-", 9), "id %s", id);

    const openai_meta m = {"chatcmpl-x", 5, "model", true};
    const char *tops[] = {"a", "\xff"};
    const size_t top_lens[] = {1, 1};
    const float top_lp[] = {-0.1f, -INFINITY};
    const openai_logprob lp = {"a", 1, -0.1f, 2, tops, top_lens, top_lp};
    json_t *entries = json_array();
    json_array_append_new(entries, openai_chat_logprob(&lp));
    json_t *chunk = openai_chunk(&m, 1, false, "hi", 2, entries, CELER_FINISH_NONE);
    json_t *c0 = json_array_get(json_object_get(chunk, "choices"), 0);
    json_t *t1 = json_array_get(
        json_object_get(
            json_array_get(json_object_get(json_object_get(c0, "logprobs"), "content"), 0),
            "top_logprobs"),
        1);
    CHECK(
        chunk &&
            !strcmp(json_string_value(json_object_get(chunk, "object")), "chat.completion.chunk") &&
            json_integer_value(json_object_get(c0, "index")) == 1 &&
            !strcmp(json_string_value(json_object_get(json_object_get(c0, "delta"), "content")),
                    "hi") &&
            json_is_null(json_object_get(c0, "finish_reason")) &&
            json_real_value(json_object_get(t1, "logprob")) == -9999.0 &&
            json_integer_value(json_array_get(json_object_get(t1, "bytes"), 0)) == 255,
        "chat chunk with logprobs (-inf reads -9999, raw bytes kept)");
    json_decref(chunk);

    char *buf = NULL;
    size_t len = 0, cap = 0;
    const openai_usage u = {10, 4, 3};
    const openai_meta mc = {"cmpl-x", 5, "model", false};
    bool ok = openai_sse_append(&buf, &len, &cap, openai_usage_chunk(&mc, &u));
    json_error_t je;
    json_t *back = ok && len > 8 ? json_loadb(buf + 6, len - 8, 0, &je) : NULL;
    json_t *usage = json_object_get(back, "usage");
    CHECK(ok && !strncmp(buf, "data: ", 6) && !strcmp(buf + len - 2, "\n\n") &&
              json_array_size(json_object_get(back, "choices")) == 0 &&
              json_integer_value(json_object_get(usage, "total_tokens")) == 14 &&
              json_integer_value(json_object_get(json_object_get(usage, "prompt_tokens_details"),
                                                 "cached_tokens")) == 3,
          "usage chunk as one SSE event");
    json_decref(back);
    free(buf);

    json_t *legacy = openai_completion_logprobs_new();
    ok = openai_completion_logprobs_append(legacy, &lp, 7);
    json_t *choice = openai_choice(&mc, 0, "a", 1, legacy, CELER_FINISH_STOP);
    json_t *lpo = json_object_get(choice, "logprobs");
    CHECK(ok && !strcmp(json_string_value(json_object_get(choice, "finish_reason")), "stop") &&
              json_integer_value(json_array_get(json_object_get(lpo, "text_offset"), 0)) == 7 &&
              json_object_size(json_array_get(json_object_get(lpo, "top_logprobs"), 0)) == 2,
          "legacy completion logprobs");
    json_decref(choice);
}

static void check_metrics(void) {
    server_metrics m;
    metrics_init(&m);
    metrics_observe(&m.ttft, 0.003);
    metrics_observe(&m.ttft, 0.5);
    metrics_observe(&m.ttft, 1000);
    m.requests_total = 3;
    const celer_engine_stats st = {.running = 2,
                                   .waiting = 1,
                                   .kv_blocks_total = 8,
                                   .kv_blocks_used = 2,
                                   .prompt_tokens_total = 40,
                                   .generation_tokens_total = 9};
    char *t = metrics_format(&m, &st);
    CHECK(
        t && strstr(t, "# TYPE celer_requests_running gauge\nceler_requests_running 2\n") &&
            strstr(t, "celer_kv_cache_usage_ratio 0.25\n") &&
            strstr(t, "# TYPE celer_prompt_tokens_total counter\nceler_prompt_tokens_total 40\n") &&
            strstr(t, "celer_requests_total 3\n") &&
            strstr(t, "celer_time_to_first_token_seconds_bucket{le=\"0.001\"} 0\n") &&
            strstr(t, "celer_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n") &&
            strstr(t, "celer_time_to_first_token_seconds_bucket{le=\"0.5\"} 2\n") &&
            strstr(t, "celer_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n") &&
            strstr(t, "celer_time_to_first_token_seconds_count 3\n") &&
            strstr(t, "# TYPE celer_e2e_request_latency_seconds histogram\n") &&
            strstr(t, "# HELP celer_inter_token_latency_seconds "),
        "metrics text");
    free(t);
}

/* ==== HTTP without a model ==== */

/* Sends req to 127.0.0.1:port and reads the whole answer into out; its status, or -1. */
static int http_exchange(int port, const char *req, size_t req_len, char *out, size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    for (size_t sent = 0; sent < req_len;) {
        const ssize_t k = send(fd, req + sent, req_len - sent, MSG_NOSIGNAL);
        if (k <= 0) break; /* the server may answer and close before the whole body */
        sent += (size_t)k;
    }
    size_t n = 0;
    for (ssize_t k; n + 1 < cap && (k = recv(fd, out + n, cap - 1 - n, 0)) > 0;) n += (size_t)k;
    out[n] = '\0';
    close(fd);
    int status = -1;
    return sscanf(out, "HTTP/1.%*d %d", &status) == 1 ? status : -1;
}

static void check_http(void) {
    const char *keys[] = {"sekrit"};
    const server_config cfg = {.host = "127.0.0.1",
                               .port = 0,
                               .model_path = "/x/model.gguf",
                               .api_keys = keys,
                               .n_api_keys = 1,
                               .max_body_bytes = 4096,
                               .drain_seconds = 1,
                               .quiet = true,
                               .engine = celer_engine_default_params()};
    char err[256], out[8192];
    server *s = server_start(&cfg, err, sizeof err);
    if (!CHECK(s != NULL, "server_start: %s", err)) return;
    const int port = server_port(s);
    const char close_hdr[] = "Connection: close\r\n";
    char req[8192];
    int st;

    snprintf(req, sizeof req, "GET /health HTTP/1.1\r\nHost: x\r\n%s\r\n", close_hdr);
    st = http_exchange(port, req, strlen(req), out, sizeof out);
    CHECK(st == 503 && strstr(out, "\"loading\""), "/health while loading: %d", st);
    snprintf(req, sizeof req, "GET /nope HTTP/1.1\r\nHost: x\r\n%s\r\n", close_hdr);
    st = http_exchange(port, req, strlen(req), out, sizeof out);
    CHECK(st == 404 && strstr(out, "\"error\""), "unknown path: %d", st);
    snprintf(req, sizeof req, "GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%s\r\n", close_hdr);
    st = http_exchange(port, req, strlen(req), out, sizeof out);
    CHECK(st == 405 && strstr(out, "Allow: POST"), "wrong method: %d", st);
    snprintf(req, sizeof req, "GET /metrics HTTP/1.1\r\nHost: x\r\n%s\r\n", close_hdr);
    st = http_exchange(port, req, strlen(req), out, sizeof out);
    CHECK(st == 404, "/metrics without --metrics: %d", st);
    snprintf(req, sizeof req, "GET /v1/models HTTP/1.1\r\nHost: x\r\n%s\r\n", close_hdr);
    st = http_exchange(port, req, strlen(req), out, sizeof out);
    CHECK(st == 401 && strstr(out, "authentication_error"), "no key: %d", st);
    snprintf(req, sizeof req,
             "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekri\r\n%s\r\n",
             close_hdr);
    st = http_exchange(port, req, strlen(req), out, sizeof out);
    CHECK(st == 401, "a prefix of the key: %d", st);
    snprintf(req, sizeof req,
             "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\r\n%s\r\n",
             close_hdr);
    st = http_exchange(port, req, strlen(req), out, sizeof out);
    CHECK(st == 200 && strstr(out, "\"model.gguf\""), "models with the key: %d", st);
    snprintf(req, sizeof req, "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Api-Key: sekrit\r\n%s\r\n",
             close_hdr);
    st = http_exchange(port, req, strlen(req), out, sizeof out);
    CHECK(st == 200, "X-Api-Key: %d", st);
    const char body[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    snprintf(req, sizeof req,
             "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Api-Key: "
             "sekrit\r\nContent-Length: %zu\r\n%s\r\n%s",
             strlen(body), close_hdr, body);
    st = http_exchange(port, req, strlen(req), out, sizeof out);
    CHECK(st == 503 && strstr(out, "loading"), "generation while loading: %d", st);
    snprintf(req, sizeof req,
             "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Api-Key: "
             "sekrit\r\nContent-Length: 5000\r\n%s\r\n",
             close_hdr);
    const size_t head = strlen(req);
    memset(req + head, 'x', sizeof req - head - 1);
    st = http_exchange(port, req, head + 5000 < sizeof req ? head + 5000 : sizeof req - 1, out,
                       sizeof out);
    CHECK(st == 413 && strstr(out, "request_too_large"), "body over the limit: %d", st);
    snprintf(req, sizeof req, "OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\n%s\r\n", close_hdr);
    st = http_exchange(port, req, strlen(req), out, sizeof out);
    CHECK(st == 204, "OPTIONS needs no key: %d", st);
    server_destroy(s);
}

int main(void) {
    check_bodies();
    check_messages();
    check_base64();
    check_image_parts();
    check_defaults();
    check_numbers();
    check_stop_and_bias();
    check_flags_and_unsupported();
    check_structured();
    check_template_kwargs();
    check_prompts();
    check_builders();
    check_metrics();
    check_http();
    return harness_done("test_server_request");
}
