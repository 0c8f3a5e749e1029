/*
 * request.c - parses and checks the JSON bodies of the generation, tokenize and
 * detokenize endpoints (request.h).
 *
 * Every field is checked for its type and range, and an error names the field as a
 * client wrote it ("messages[2].content[0].text", "logit_bias.50256"). Unknown fields
 * are ignored, as OpenAI does; a field that asks for something celer does not do yet
 * (tools, JSON response formats, echo) is refused rather than silently ignored. Absent
 * and null fields take OpenAI's defaults. Image parts carry base64 data: URLs, decoded
 * here to the image file's bytes (strict base64; the image itself is decoded by the
 * server). This file does not tokenize, render templates, decode images or talk HTTP,
 * so it can be fuzzed alone.
 */
#include "server/request.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUEST_MAX_BIAS 1024

bool request_fail(request_error *e, int status, const char *type, const char *code,
                  const char *param, const char *fmt, ...) {
    va_list ap;
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

/* A 400 invalid_request_error about field. */
#define BAD(e, field, ...)                                                                         \
    request_fail((e), 400, "invalid_request_error", NULL, (field), __VA_ARGS__)

void request_free(server_request *r) {
    free(r->messages_json);
    free(r->template_kwargs);
    for (int32_t i = 0; i < r->n_images; i++) free(r->images[i].data);
    free(r->images);
    free(r->text);
    free(r->ids);
    free(r->bias_ids);
    free(r->bias);
    for (int32_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->grammar);
    free(r->tools_json);
    memset(r, 0, sizeof *r);
}

/* ==== Typed fields ==== */

/* "a string", "an array", ... for messages that say what was found. */
static const char *found(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number with a fraction";
    case JSON_TRUE:
        return "true";
    case JSON_FALSE:
        return "false";
    default:
        return "null";
    }
}

/* The field, or NULL when it is absent or null (both mean "the default"). */
static json_t *field_get(const json_t *obj, const char *name) {
    json_t *v = json_object_get(obj, name);
    return json_is_null(v) ? NULL : v;
}

/* A number in [lo, hi] (lo excluded when lo_open) into *out. */
static bool value_number(const json_t *v, const char *name, double lo, double hi, bool lo_open,
                         float *out, request_error *e) {
    if (!json_is_number(v)) return BAD(e, name, "%s: expected a number, found %s", name, found(v));
    const double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
        return BAD(e, name, "%s: expected a number %s %g %s %g, found %g", name,
                   lo_open ? "above" : "from", lo, lo_open ? "and at most" : "to", hi, x);
    *out = (float)x;
    return true;
}

/* The same for a field of obj; absent or null leaves *out. */
static bool field_number(const json_t *obj, const char *name, double lo, double hi, bool lo_open,
                         float *out, request_error *e) {
    const json_t *v = field_get(obj, name);
    return !v || value_number(v, name, lo, hi, lo_open, out, e);
}

/* An integer in [lo, hi] (an integral number like 8.0 counts) into *out; absent leaves
 * *out. Returns false with *e set otherwise. */
static bool value_int(const json_t *v, const char *name, int64_t lo, int64_t hi, int64_t *out,
                      request_error *e) {
    if (json_is_integer(v)) {
        const json_int_t i = json_integer_value(v);
        if (i < lo || i > hi)
            return BAD(e, name, "%s: expected an integer from %lld to %lld, found %lld", name,
                       (long long)lo, (long long)hi, (long long)i);
        *out = (int64_t)i;
        return true;
    }
    const double x = json_is_real(v) ? json_real_value(v) : 0.5;
    if (x != floor(x)) return BAD(e, name, "%s: expected an integer, found %s", name, found(v));
    if (!(x >= (double)lo && x <= (double)hi))
        return BAD(e, name, "%s: expected an integer from %lld to %lld, found %g", name,
                   (long long)lo, (long long)hi, x);
    *out = (int64_t)x;
    return true;
}

static bool field_int(const json_t *obj, const char *name, int64_t lo, int64_t hi, int64_t *out,
                      request_error *e) {
    const json_t *v = field_get(obj, name);
    return !v || value_int(v, name, lo, hi, out, e);
}

static bool field_bool(const json_t *obj, const char *name, bool *out, request_error *e) {
    const json_t *v = field_get(obj, name);
    if (!v) return true;
    if (!json_is_boolean(v))
        return BAD(e, name, "%s: expected true or false, found %s", name, found(v));
    *out = json_is_true(v);
    return true;
}

static char *dup_bytes(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n), d[n] = '\0';
    return d;
}

static bool out_of_memory(request_error *e) {
    return request_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

/* ==== Fields shared by chat and completions ==== */

static bool parse_stop(const json_t *root, server_request *r, request_error *e) {
    const json_t *v = field_get(root, "stop");
    if (!v) return true;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) return BAD(e, "stop", "stop: expected a non-empty string");
        if (!(r->stop[0] = dup_bytes(json_string_value(v), json_string_length(v))))
            return out_of_memory(e);
        r->n_stop = 1;
        return true;
    }
    if (!json_is_array(v))
        return BAD(e, "stop", "stop: expected a string or an array of strings, found %s", found(v));
    if (json_array_size(v) > REQUEST_MAX_STOP)
        return BAD(e, "stop", "stop: expected at most %d strings, found %zu", REQUEST_MAX_STOP,
                   json_array_size(v));
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *s = json_array_get(v, i);
        char name[32];
        snprintf(name, sizeof name, "stop[%zu]", i);
        if (!json_is_string(s) || json_string_length(s) == 0)
            return BAD(e, name, "%s: expected a non-empty string, found %s", name,
                       json_is_string(s) ? "an empty string" : found(s));
        if (!(r->stop[r->n_stop] = dup_bytes(json_string_value(s), json_string_length(s))))
            return out_of_memory(e);
        r->n_stop++;
    }
    return true;
}

/* "123" -> 123 when the key is a plain decimal id below n_vocab. */
static bool bias_key(const char *key, int64_t n_vocab, int32_t *id) {
    int64_t v = 0;
    size_t n = strlen(key);
    if (n == 0 || n > 10) return false;
    for (size_t i = 0; i < n; i++) {
        if (key[i] < '0' || key[i] > '9') return false;
        v = v * 10 + (key[i] - '0');
    }
    if (v >= n_vocab || v > INT32_MAX) return false;
    *id = (int32_t)v;
    return true;
}

static bool parse_logit_bias(const json_t *root, const request_limits *lim, server_request *r,
                             request_error *e) {
    const json_t *v = field_get(root, "logit_bias");
    if (!v) return true;
    if (!json_is_object(v))
        return BAD(e, "logit_bias",
                   "logit_bias: expected an object of token ids to numbers, found %s", found(v));
    const size_t n = json_object_size(v);
    if (n > REQUEST_MAX_BIAS)
        return BAD(e, "logit_bias", "logit_bias: expected at most %d entries, found %zu",
                   REQUEST_MAX_BIAS, n);
    if (n == 0) return true;
    r->bias_ids = malloc(n * sizeof *r->bias_ids);
    r->bias = malloc(n * sizeof *r->bias);
    if (!r->bias_ids || !r->bias) return out_of_memory(e);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        char name[64];
        snprintf(name, sizeof name, "logit_bias.%.40s", key);
        if (!bias_key(key, lim->n_vocab, &r->bias_ids[r->n_bias]))
            return BAD(e, name, "%s: expected a token id from 0 to %lld as the key", name,
                       (long long)lim->n_vocab - 1);
        float b = 0;
        if (!value_number(val, name, -100, 100, false, &b, e)) return false;
        r->bias[r->n_bias++] = b;
    }
    return true;
}

/* max_tokens (and chat's max_completion_tokens, which wins), n, sampling, penalties,
 * seed, stop, logit_bias, stream, stream_options, ignore_eos. */
static bool parse_common(const json_t *root, const request_limits *lim, server_request *r,
                         request_error *e) {
    const json_t *model = field_get(root, "model");
    if (model && !json_is_string(model))
        return BAD(e, "model", "model: expected a string, found %s", found(model));
    const int64_t max_cap = lim->max_tokens > 0 ? lim->max_tokens : INT32_MAX;
    int64_t i64;
    const char *const max_names[] = {"max_tokens", "max_completion_tokens"};
    for (int k = 0; k < (r->kind == REQUEST_CHAT ? 2 : 1); k++) {
        i64 = 0;
        if (!field_int(root, max_names[k], 1, max_cap, &i64, e)) return false;
        if (i64 > 0) r->max_tokens = i64;
    }
    i64 = 1;
    if (!field_int(root, "n", 1, REQUEST_MAX_N, &i64, e)) return false;
    r->n = (int32_t)i64;
    celer_sampler_params *sp = &r->sampling;
    if (!field_number(root, "temperature", 0, 2, false, &sp->temp, e) ||
        !field_number(root, "top_p", 0, 1, true, &sp->top_p, e) ||
        !field_number(root, "min_p", 0, 1, false, &sp->min_p, e) ||
        !field_number(root, "repeat_penalty", 0, 10, true, &sp->repeat_penalty, e) ||
        !field_number(root, "presence_penalty", -2, 2, false, &r->presence_penalty, e) ||
        !field_number(root, "frequency_penalty", -2, 2, false, &r->frequency_penalty, e))
        return false;
    i64 = sp->top_k;
    if (!field_int(root, "top_k", 0, INT32_MAX, &i64, e)) return false;
    sp->top_k = (int32_t)i64;
    i64 = sp->repeat_last_n;
    if (!field_int(root, "repeat_last_n", 0, INT32_MAX, &i64, e)) return false;
    sp->repeat_last_n = (int32_t)i64;
    i64 = -1;
    if (!field_int(root, "seed", INT64_MIN, INT64_MAX, &i64, e)) return false;
    if (i64 != -1) sp->seed = (uint64_t)i64, r->seed_given = true; /* -1: random, as llama-server */
    if (!parse_stop(root, r, e) || !parse_logit_bias(root, lim, r, e) ||
        !field_bool(root, "stream", &r->stream, e) ||
        !field_bool(root, "ignore_eos", &r->ignore_eos, e))
        return false;
    const json_t *so = field_get(root, "stream_options");
    if (so && !json_is_object(so))
        return BAD(e, "stream_options", "stream_options: expected an object, found %s", found(so));
    if (so) {
        const json_t *iu = field_get(so, "include_usage");
        if (iu && !json_is_boolean(iu))
            return BAD(e, "stream_options.include_usage",
                       "stream_options.include_usage: expected true or false, found %s", found(iu));
        r->include_usage = json_is_true(iu);
    }
    return true;
}

/* ==== Images ==== */

/* The value of a base64 digit, or -1. */
static int base64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int64_t request_base64_decode(const char *src, size_t n, unsigned char *out, const char **why,
                              size_t *at) {
    if (n % 4 != 0) {
        *why = "the length is not a multiple of 4 (missing '=' padding?)";
        *at = n;
        return -1;
    }
    size_t w = 0;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t acc = 0;
        int digits = 0; /* digits before any '=' of this quantum */
        for (int k = 0; k < 4; k++) {
            const unsigned char c = (unsigned char)src[i + k];
            const int v = base64_value(c);
            if (v >= 0 && digits == k) {
                acc = acc << 6 | (uint32_t)v;
                digits++;
                continue;
            }
            if (c == '=' && i + 4 == n && k >= 2) continue; /* "xx==" or "xxx=" at the end */
            *at = i + (size_t)k;
            *why = v >= 0     ? "a base64 digit after '=' padding"
                   : c == '=' ? "'=' padding before the end"
                              : "a character outside the base64 alphabet";
            return -1;
        }
        const int bytes = digits * 6 / 8; /* 4 digits: 3 bytes, 3: 2, 2: 1 */
        acc <<= 6 * (4 - digits);
        if (acc & ((1u << (24 - 8 * bytes)) - 1)) {
            *why = "the bits after the last byte are not zero";
            *at = i + (size_t)digits - 1;
            return -1;
        }
        out[w++] = (unsigned char)(acc >> 16);
        if (bytes > 1) out[w++] = (unsigned char)(acc >> 8);
        if (bytes > 2) out[w++] = (unsigned char)acc;
    }
    return (int64_t)w;
}

/* Whether s[n] equals lower (lower-case ASCII) ignoring ASCII case. */
static bool ascii_case_eq(const char *s, size_t n, const char *lower) {
    if (strlen(lower) != n) return false;
    for (size_t k = 0; k < n; k++) {
        const char c = s[k] >= 'A' && s[k] <= 'Z' ? (char)(s[k] - 'A' + 'a') : s[k];
        if (c != lower[k]) return false;
    }
    return true;
}

/* Up to cap - 1 leading characters of s[n] that are printable ASCII other than quotes and
 * backslashes (so an error message can quote them, cut anywhere, and stay valid UTF-8). */
static void ascii_prefix(const char *s, size_t n, char *out, size_t cap) {
    size_t k = 0;
    while (k < n && k + 1 < cap && s[k] > ' ' && s[k] < 0x7f && s[k] != '"' && s[k] != '\\')
        out[k] = s[k], k++;
    out[k] = '\0';
}

#define DATA_URLS_ONLY                                                                             \
    "only base64 data: URLs of PNG or JPEG images are accepted (data:image/png;base64,... or "     \
    "data:image/jpeg;base64,...); celer never fetches a URL"

/* The image file a data: URL holds, into img. param names the url field. */
static bool parse_data_url(const char *url, size_t len, const char *param, request_image *img,
                           request_error *e) {
    if (len < 5 || !ascii_case_eq(url, 5, "data:")) {
        const char *colon = memchr(url, ':', len);
        char scheme[24];
        ascii_prefix(url, colon ? (size_t)(colon - url) : 0, scheme, sizeof scheme);
        if (colon && scheme[0] && strlen(scheme) == (size_t)(colon - url))
            return BAD(e, param, "%s: found a URL of scheme \"%s:\"; " DATA_URLS_ONLY, param,
                       scheme);
        return BAD(e, param, "%s: found something that is not a data: URL; " DATA_URLS_ONLY, param);
    }
    const char *head = url + 5, *comma = memchr(head, ',', len - 5);
    if (!comma)
        return BAD(e, param, "%s: found a data: URL without a ',' before its data; " DATA_URLS_ONLY,
                   param);
    /* head: media type, then ";name=value" parameters, then ";base64" last */
    const size_t head_len = (size_t)(comma - head);
    const char *semi = memchr(head, ';', head_len);
    const size_t type_len = semi ? (size_t)(semi - head) : head_len;
    const bool base64 = head_len >= 7 && ascii_case_eq(comma - 7, 7, ";base64");
    char type[48];
    ascii_prefix(head, type_len, type, sizeof type);
    const bool image = ascii_case_eq(head, type_len, "image/png") ||
                       ascii_case_eq(head, type_len, "image/jpeg") ||
                       ascii_case_eq(head, type_len, "image/jpg");
    if (!image)
        return BAD(e, param, "%s: found a data: URL of media type \"%s\"; " DATA_URLS_ONLY, param,
                   type_len == 0              ? "text/plain"
                   : strlen(type) == type_len ? type
                                              : "(unreadable)");
    if (!base64)
        return BAD(e, param, "%s: found a data: URL that is not base64; " DATA_URLS_ONLY, param);
    const char *data = comma + 1;
    const size_t n = len - (size_t)(data - url);
    if (n == 0) return BAD(e, param, "%s: the data: URL holds no data", param);
    unsigned char *bytes = malloc(n / 4 * 3 + 1);
    if (!bytes) return out_of_memory(e);
    const char *why = NULL;
    size_t at = 0;
    const int64_t got = request_base64_decode(data, n, bytes, &why, &at);
    if (got <= 0) {
        free(bytes);
        if (got == 0) return BAD(e, param, "%s: the data: URL holds no data", param);
        return BAD(e, param, "%s: invalid base64 at character %zu of the data: %s", param, at, why);
    }
    img->data = bytes;
    img->len = (size_t)got;
    snprintf(img->param, sizeof img->param, "%s", param);
    return true;
}

/* An "image_url" part (pname: "messages[i].content[k]") of a user message into the next
 * slot of r->images. */
static bool parse_image_part(const json_t *part, const char *pname, server_request *r,
                             request_error *e) {
    char name[160];
    const json_t *iu = json_object_get(part, "image_url");
    snprintf(name, sizeof name, "%s.image_url", pname);
    if (!json_is_object(iu))
        return BAD(e, name,
                   "%s: expected an object {\"url\": \"data:image/png;base64,...\"}, found %s",
                   name, iu ? found(iu) : "nothing");
    const json_t *detail = field_get(iu, "detail");
    snprintf(name, sizeof name, "%s.image_url.detail", pname);
    if (detail && !(json_is_string(detail) && (!strcmp(json_string_value(detail), "auto") ||
                                               !strcmp(json_string_value(detail), "low") ||
                                               !strcmp(json_string_value(detail), "high"))))
        return BAD(e, name, "%s: expected \"auto\", \"low\" or \"high\"", name);
    const json_t *url = json_object_get(iu, "url");
    snprintf(name, sizeof name, "%s.image_url.url", pname);
    if (!json_is_string(url))
        return BAD(e, name, "%s: expected a string, found %s", name, url ? found(url) : "nothing");
    if (r->n_images >= REQUEST_MAX_IMAGES)
        return BAD(e, name, "%s: at most %d images are accepted in one request", name,
                   REQUEST_MAX_IMAGES);
    if (!r->images && !(r->images = calloc(REQUEST_MAX_IMAGES, sizeof *r->images)))
        return out_of_memory(e);
    if (!parse_data_url(json_string_value(url), json_string_length(url), name,
                        &r->images[r->n_images], e))
        return false;
    r->n_images++;
    return true;
}

/* ==== Chat ==== */

/* Message i's content as the template sees it, into *out: a string when it has no image
 * parts (a string, or its "text" parts joined), else a list of {"type": "image"} and
 * {"type": "text", "text"} parts in order, the images' files appended to r->images. Image
 * parts are accepted in user messages (user) of a vision-language model only. */
static bool parse_content(const json_t *content, size_t i, bool user, const request_limits *lim,
                          server_request *r, json_t **out, request_error *e) {
    char name[96];
    snprintf(name, sizeof name, "messages[%zu].content", i);
    if (!content) {
        *out = json_string("");
        return *out ? true : out_of_memory(e);
    }
    if (json_is_string(content)) {
        *out = json_incref((json_t *)content);
        return true;
    }
    if (!json_is_array(content))
        return BAD(e, name, "%s: expected a string or an array of content parts, found %s", name,
                   found(content));
    size_t total = 0;
    int32_t n_images = 0;
    for (size_t k = 0; k < json_array_size(content); k++) {
        const json_t *part = json_array_get(content, k);
        const json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        char pname[128], fname[160];
        snprintf(pname, sizeof pname, "%s[%zu]", name, k);
        if (!json_is_object(part))
            return BAD(e, pname,
                       "%s: expected an object {\"type\": \"text\", \"text\": ...}, found %s",
                       pname, found(part));
        snprintf(fname, sizeof fname, "%s.type", pname);
        if (!json_is_string(type))
            return BAD(e, fname, "%s: expected \"text\" or \"image_url\", found %s", fname,
                       type ? found(type) : "nothing");
        const char *ts = json_string_value(type);
        if (!strcmp(ts, "image_url")) {
            if (!lim->vision)
                return BAD(e, fname,
                           "%s: \"image_url\" parts need a vision-language model; %s is text-only",
                           fname, lim->model ? lim->model : "this model");
            if (!user)
                return BAD(e, fname, "%s: image parts are accepted in user messages only", fname);
            if (!parse_image_part(part, pname, r, e)) return false;
            n_images++;
            continue;
        }
        if (strcmp(ts, "text") != 0) {
            char shown[48];
            ascii_prefix(ts, json_string_length(type), shown, sizeof shown);
            return BAD(e, fname,
                       "%s: only \"text\" and \"image_url\" parts are supported, found \"%s\"",
                       fname, strlen(shown) == json_string_length(type) ? shown : "(other)");
        }
        const json_t *text = json_object_get(part, "text");
        snprintf(fname, sizeof fname, "%s.text", pname);
        if (!json_is_string(text))
            return BAD(e, fname, "%s: expected a string, found %s", fname,
                       text ? found(text) : "nothing");
        total += json_string_length(text);
    }
    if (n_images > 0) { /* the parts, as transformers' processors pass them to templates */
        json_t *parts = json_array();
        for (size_t k = 0; parts && k < json_array_size(content); k++) {
            const json_t *part = json_array_get(content, k);
            const char *ts = json_string_value(json_object_get(part, "type"));
            json_t *p = !strcmp(ts, "text") ? json_pack("{s:s, s:O}", "type", "text", "text",
                                                        json_object_get(part, "text"))
                                            : json_pack("{s:s}", "type", "image");
            if (json_array_append_new(parts, p) != 0) {
                json_decref(parts);
                parts = NULL;
            }
        }
        *out = parts;
        return *out ? true : out_of_memory(e);
    }
    char *buf = malloc(total + 1);
    if (!buf) return out_of_memory(e);
    size_t at = 0;
    for (size_t k = 0; k < json_array_size(content); k++) {
        const json_t *text = json_object_get(json_array_get(content, k), "text");
        memcpy(buf + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    *out = json_stringn_nocheck(buf, at); /* parts were valid UTF-8, so is their join */
    free(buf);
    return *out ? true : out_of_memory(e);
}

/* An assistant message's tool_calls as chat templates read them (transformers passes them
 * so): each call's function.arguments, a JSON string in OpenAI's API, parsed into the
 * object it holds. calls is the message's copy, changed in place. */
static bool parse_tool_calls(json_t *calls, size_t i, request_error *e) {
    char p[96];
    snprintf(p, sizeof p, "messages[%zu].tool_calls", i);
    if (!json_is_array(calls)) return BAD(e, p, "%s: expected an array, found %s", p, found(calls));
    for (size_t k = 0; k < json_array_size(calls); k++) {
        json_t *c = json_array_get(calls, k), *f = json_object_get(c, "function");
        snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].function", i, k);
        if (!json_is_object(f) || !json_is_string(json_object_get(f, "name")))
            return BAD(e, p, "%s: expected {\"name\", \"arguments\"}", p);
        const json_t *args = json_object_get(f, "arguments");
        if (!json_is_string(args)) continue; /* an object already, or absent */
        json_t *obj = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
        if (json_is_object(obj))
            json_object_set_new(f, "arguments", obj);
        else
            json_decref(obj); /* not an object: the template gets the string */
    }
    return true;
}

/* messages -> r->messages_json: each message a copy with its content as the template
 * sees it (parse_content), and the image parts into r->images. */
static bool parse_messages(const json_t *root, const request_limits *lim, server_request *r,
                           request_error *e) {
    const json_t *msgs = field_get(root, "messages");
    if (!msgs)
        return BAD(e, "messages",
                   "messages: required, an array of {\"role\", \"content\"} objects");
    if (!json_is_array(msgs))
        return BAD(e, "messages", "messages: expected an array, found %s", found(msgs));
    if (json_array_size(msgs) == 0)
        return BAD(e, "messages", "messages: expected at least one message");
    json_t *norm = json_array();
    if (!norm) return out_of_memory(e);
    bool ok = true;
    for (size_t i = 0; ok && i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        char name[64];
        snprintf(name, sizeof name, "messages[%zu]", i);
        if (!json_is_object(m)) {
            ok = BAD(e, name, "%s: expected an object, found %s", name, found(m));
            break;
        }
        const json_t *role = json_object_get(m, "role");
        snprintf(name, sizeof name, "messages[%zu].role", i);
        if (!json_is_string(role) || json_string_length(role) == 0) {
            ok = BAD(e, name, "%s: expected a non-empty string, found %s", name,
                     role ? (json_is_string(role) ? "an empty string" : found(role)) : "nothing");
            break;
        }
        json_t *text = NULL, *copy = NULL;
        ok = parse_content(field_get(m, "content"), i, !strcmp(json_string_value(role), "user"),
                           lim, r, &text, e);
        if (ok && (!(copy = json_deep_copy((json_t *)m)) ||
                   json_object_set_new(copy, "content", text) != 0 ||
                   json_array_append_new(norm, copy) != 0))
            ok = out_of_memory(e);
        else if (!ok)
            json_decref(text);
        json_t *calls = ok ? json_object_get(copy, "tool_calls") : NULL;
        if (calls && !json_is_null(calls)) ok = parse_tool_calls(calls, i, e);
    }
    if (ok && !(r->messages_json = json_dumps(norm, JSON_COMPACT))) ok = out_of_memory(e);
    json_decref(norm);
    return ok;
}

/* Whether s is a function name OpenAI accepts: 1 to 64 of [a-zA-Z0-9_-]. */
static bool function_name_ok(const char *s) {
    size_t n = 0;
    while (s[n] && n <= 64 && (isalnum((unsigned char)s[n]) || s[n] == '_' || s[n] == '-')) n++;
    return n > 0 && n <= 64 && !s[n];
}

/* The legacy "functions" field is refused (tools replaced it). */
static bool parse_unsupported(const json_t *root, request_error *e) {
    const json_t *v = field_get(root, "functions");
    if (v && !json_is_array(v))
        return BAD(e, "functions", "functions: expected an array, found %s", found(v));
    if (v && json_array_size(v) > 0)
        return BAD(e, "functions", "functions: the legacy field is not supported; use tools");
    return true;
}

/* tools[i]: {"type": "function", "function": {"name", "description"?, "parameters"?,
 * "strict"?}}. */
static bool parse_tool(const json_t *t, size_t i, request_error *e) {
    char p[96];
    snprintf(p, sizeof p, "tools[%zu]", i);
    if (!json_is_object(t)) return BAD(e, p, "%s: expected an object, found %s", p, found(t));
    const char *type = json_string_value(json_object_get(t, "type"));
    if (!type || strcmp(type, "function")) return BAD(e, p, "%s.type: expected \"function\"", p);
    const json_t *f = json_object_get(t, "function");
    snprintf(p, sizeof p, "tools[%zu].function", i);
    if (!json_is_object(f))
        return BAD(e, p, "%s: expected an object, found %s", p, f ? found(f) : "nothing");
    const char *name = json_string_value(json_object_get(f, "name"));
    snprintf(p, sizeof p, "tools[%zu].function.name", i);
    if (!name || !function_name_ok(name))
        return BAD(e, p, "%s: expected 1 to 64 letters, digits, '_' or '-'", p);
    const json_t *desc = field_get(f, "description"), *params = field_get(f, "parameters");
    snprintf(p, sizeof p, "tools[%zu].function.description", i);
    if (desc && !json_is_string(desc))
        return BAD(e, p, "%s: expected a string, found %s", p, found(desc));
    snprintf(p, sizeof p, "tools[%zu].function.parameters", i);
    if (params && !json_is_object(params))
        return BAD(e, p, "%s: expected a JSON Schema object, found %s", p, found(params));
    return true;
}

/* tools, tool_choice and parallel_tool_calls (chat). tool_choice "none" drops the tools:
 * the template does not see them and nothing is parsed as a call. */
static bool parse_tools(const json_t *root, server_request *r, request_error *e) {
    const json_t *tools = field_get(root, "tools"), *choice = field_get(root, "tool_choice");
    r->parallel_tool_calls = true;
    if (!field_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, e)) return false;
    if (tools && !json_is_array(tools))
        return BAD(e, "tools", "tools: expected an array, found %s", found(tools));
    const size_t n = tools ? json_array_size(tools) : 0;
    if (n > REQUEST_MAX_TOOLS)
        return BAD(e, "tools", "tools: at most %d tools, found %zu", REQUEST_MAX_TOOLS, n);
    for (size_t i = 0; i < n; i++) {
        if (!parse_tool(json_array_get(tools, i), i, e)) return false;
        for (size_t k = 0; k < i; k++)
            if (!strcmp(json_string_value(json_object_get(
                            json_object_get(json_array_get(tools, k), "function"), "name")),
                        json_string_value(json_object_get(
                            json_object_get(json_array_get(tools, i), "function"), "name"))))
                return BAD(e, "tools", "tools[%zu].function.name: the same name as tools[%zu]", i,
                           k);
    }
    bool none = false;
    if (choice && json_is_string(choice)) {
        const char *c = json_string_value(choice);
        if (!strcmp(c, "none"))
            none = true;
        else if (!strcmp(c, "required"))
            r->tool_choice = REQUEST_TOOLS_REQUIRED;
        else if (strcmp(c, "auto"))
            return BAD(e, "tool_choice",
                       "tool_choice: expected \"none\", \"auto\", \"required\" or {\"type\": "
                       "\"function\", \"function\": {\"name\": ...}}");
    } else if (choice) {
        const json_t *f = json_is_object(choice) ? json_object_get(choice, "function") : NULL;
        const char *type = json_string_value(json_object_get(choice, "type")),
                   *name = json_string_value(json_object_get(f, "name"));
        if (!type || strcmp(type, "function") || !name)
            return BAD(e, "tool_choice",
                       "tool_choice: expected {\"type\": \"function\", \"function\": {\"name\": "
                       "...}}, found %s",
                       found(choice));
        bool known = false;
        for (size_t i = 0; i < n && !known; i++)
            known =
                !strcmp(name, json_string_value(json_object_get(
                                  json_object_get(json_array_get(tools, i), "function"), "name")));
        if (!known)
            return BAD(e, "tool_choice",
                       "tool_choice: names function \"%.64s\", which is not among the tools", name);
        r->tool_choice = REQUEST_TOOLS_NAMED;
        snprintf(r->tool_name, sizeof r->tool_name, "%s", name);
    }
    if (n == 0) {
        if (r->tool_choice != REQUEST_TOOLS_AUTO)
            return BAD(e, "tool_choice",
                       "tool_choice: \"required\" and a named function need tools");
        return true;
    }
    if (none) return true;
    if (r->grammar && r->tool_choice != REQUEST_TOOLS_AUTO)
        return BAD(e, "tool_choice",
                   "tool_choice: a required tool call and a response format cannot be combined");
    if (r->grammar)
        return BAD(e, "response_format",
                   "response_format: with tools, give tool_choice \"none\" (a response format and "
                   "tool calls cannot be combined)");
    if (!(r->tools_json = json_dumps(tools, JSON_COMPACT))) return out_of_memory(e);
    return true;
}

/* The grammar of the JSON Schema schema (r->grammar), or a 400 about param naming what the
 * compiler refused. */
static bool schema_grammar(const json_t *schema, const char *param, server_request *r,
                           request_error *e) {
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY), err[400];
    if (!text) return out_of_memory(e);
    const celer_status st = celer_json_schema_to_grammar(text, &r->grammar, err, sizeof err);
    free(text);
    if (st == CELER_STATUS_OUT_OF_MEMORY) return out_of_memory(e);
    if (st != CELER_OK) return BAD(e, param, "%s: %s", param, err);
    return true;
}

/* OpenAI's json_schema response format: {"name", "schema", "strict", "description"}. */
static bool parse_json_schema_format(const json_t *js, server_request *r, request_error *e) {
    const char *p = "response_format.json_schema";
    if (!json_is_object(js))
        return BAD(e, p, "%s: expected an object, found %s", p, js ? found(js) : "nothing");
    const json_t *name = json_object_get(js, "name");
    const char *ns = json_string_value(name);
    size_t len = ns ? strlen(ns) : 0, ok = 0;
    while (ok < len && (isalnum((unsigned char)ns[ok]) || ns[ok] == '_' || ns[ok] == '-')) ok++;
    if (!ns || len == 0 || len > 64 || ok != len)
        return BAD(e, "response_format.json_schema.name",
                   "response_format.json_schema.name: expected 1 to 64 letters, digits, '_' or "
                   "'-', found %s",
                   ns     ? "other characters"
                   : name ? found(name)
                          : "nothing");
    const json_t *strict = field_get(js, "strict");
    if (strict && !json_is_boolean(strict))
        return BAD(e, "response_format.json_schema.strict",
                   "response_format.json_schema.strict: expected a boolean, found %s",
                   found(strict));
    const json_t *schema = field_get(js, "schema");
    if (schema && !json_is_object(schema) && !json_is_boolean(schema))
        return BAD(e, "response_format.json_schema.schema",
                   "response_format.json_schema.schema: expected an object, found %s",
                   found(schema));
    /* without a schema, any JSON value: the empty schema */
    json_t *any = schema ? NULL : json_object();
    const bool done =
        schema_grammar(schema ? schema : any, "response_format.json_schema.schema", r, e);
    json_decref(any);
    return done;
}

/* What the output must look like, as a GBNF grammar in r->grammar (NULL: free text):
 * OpenAI's response_format ("text"; "json_object": a JSON object; "json_schema": a JSON
 * Schema), or llama-server's fields "json_schema" (a schema object) and "grammar" (GBNF
 * text, checked when the engine compiles it). One of them at most. */
static bool parse_structured(const json_t *root, server_request *r, request_error *e) {
    const json_t *rf = field_get(root, "response_format"), *js = field_get(root, "json_schema"),
                 *g = field_get(root, "grammar");
    const char *ts = NULL;
    if (rf) {
        if (!json_is_object(rf))
            return BAD(e, "response_format", "response_format: expected an object, found %s",
                       found(rf));
        const json_t *t = json_object_get(rf, "type");
        if (!json_is_string(t))
            return BAD(e, "response_format.type",
                       "response_format.type: expected a string, found %s",
                       t ? found(t) : "nothing");
        ts = json_string_value(t);
        if (strcmp(ts, "text") && strcmp(ts, "json_object") && strcmp(ts, "json_schema"))
            return BAD(e, "response_format.type",
                       "response_format.type: expected \"text\", \"json_object\" or "
                       "\"json_schema\", found \"%.40s\"",
                       ts);
        if (!strcmp(ts, "text")) ts = NULL;
    }
    if ((ts != NULL) + (js != NULL) + (g != NULL) > 1)
        return BAD(e, ts ? "response_format" : "grammar",
                   "%s: give one of response_format, json_schema and grammar",
                   ts ? "response_format" : "grammar");
    if (ts && !strcmp(ts, "json_object")) {
        json_t *object = json_pack("{s:s}", "type", "object");
        const bool done = object && schema_grammar(object, "response_format", r, e);
        json_decref(object);
        return object ? done : out_of_memory(e);
    }
    if (ts) return parse_json_schema_format(json_object_get(rf, "json_schema"), r, e);
    if (js) {
        if (!json_is_object(js) && !json_is_boolean(js))
            return BAD(e, "json_schema", "json_schema: expected an object, found %s", found(js));
        return schema_grammar(js, "json_schema", r, e);
    }
    if (g) {
        if (!json_is_string(g))
            return BAD(e, "grammar", "grammar: expected a string of GBNF, found %s", found(g));
        if (json_string_length(g) == 0) return true; /* llama-server: empty means none */
        const size_t n = json_string_length(g);
        if (!(r->grammar = malloc(n + 1))) return out_of_memory(e);
        memcpy(r->grammar, json_string_value(g), n + 1);
    }
    return true;
}

bool request_check_template_kwargs(const json_t *kwargs, const char *param, request_error *e) {
    static const char *const reserved[] = {
        "messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "documents"};
    if (!json_is_object(kwargs))
        return BAD(e, param, "%s: expected an object, found %s", param,
                   kwargs ? found(kwargs) : "nothing");
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++) {
        if (!json_object_get(kwargs, reserved[i])) continue;
        char name[160];
        snprintf(name, sizeof name, "%s.%s", param, reserved[i]);
        if (i >= 4)
            return BAD(e, name, "%s: \"%s\" is a request field of its own, not a template variable",
                       name, reserved[i]);
        return BAD(e, name, "%s: the server sets \"%s\" itself", name, reserved[i]);
    }
    return true;
}

/* chat_template_kwargs (vLLM's and llama-server's field) -> r->template_kwargs. */
static bool parse_template_kwargs(const json_t *root, server_request *r, request_error *e) {
    const json_t *kw = field_get(root, "chat_template_kwargs");
    if (!kw) return true;
    if (!request_check_template_kwargs(kw, "chat_template_kwargs", e)) return false;
    if (json_object_size(kw) && !(r->template_kwargs = json_dumps(kw, JSON_COMPACT)))
        return out_of_memory(e);
    return true;
}

bool request_template_vars(const char *defaults, const server_request *r, char **out) {
    *out = NULL;
    if (!defaults || !r->template_kwargs) {
        const char *one = r->template_kwargs ? r->template_kwargs : defaults;
        if (!one) return true;
        const size_t n = strlen(one) + 1;
        if (!(*out = malloc(n))) return false;
        memcpy(*out, one, n);
        return true;
    }
    json_t *vars = json_loads(defaults, 0, NULL), *kw = json_loads(r->template_kwargs, 0, NULL);
    if (vars && kw && json_object_update(vars, kw) == 0) *out = json_dumps(vars, JSON_COMPACT);
    json_decref(vars);
    json_decref(kw);
    return *out != NULL;
}

static bool parse_chat(const json_t *root, const request_limits *lim, server_request *r,
                       request_error *e) {
    r->max_tokens = -1;
    if (!parse_messages(root, lim, r, e) || !parse_template_kwargs(root, r, e) ||
        !parse_unsupported(root, e) || !parse_structured(root, r, e) || !parse_tools(root, r, e) ||
        !parse_common(root, lim, r, e) || !field_bool(root, "logprobs", &r->logprobs, e))
        return false;
    int64_t k = -1;
    if (!field_int(root, "top_logprobs", 0, CELER_MAX_TOP_LOGPROBS, &k, e)) return false;
    if (k >= 0 && !r->logprobs)
        return BAD(e, "top_logprobs", "top_logprobs: needs \"logprobs\": true");
    r->top_logprobs = k > 0 ? (int32_t)k : 0;
    return true;
}

/* ==== Completions, tokenize, detokenize ==== */

/* An array of token ids below n_vocab into *ids (malloc'd). */
static bool parse_ids(const json_t *arr, const char *name, const request_limits *lim, int32_t **ids,
                      int64_t *n, request_error *e) {
    const size_t len = json_array_size(arr);
    *n = 0;
    if (!(*ids = malloc((len ? len : 1) * sizeof **ids))) return out_of_memory(e);
    for (size_t i = 0; i < len; i++) {
        char ename[64];
        int64_t v = 0;
        snprintf(ename, sizeof ename, "%s[%zu]", name, i);
        if (!value_int(json_array_get(arr, i), ename, 0, lim->n_vocab - 1, &v, e)) return false;
        (*ids)[(*n)++] = (int32_t)v;
    }
    return true;
}

static bool all_integers(const json_t *arr) {
    for (size_t i = 0; i < json_array_size(arr); i++)
        if (!json_is_number(json_array_get(arr, i))) return false;
    return true;
}

static bool parse_prompt(const json_t *root, const request_limits *lim, server_request *r,
                         request_error *e) {
    const json_t *p = field_get(root, "prompt");
    const char *name = "prompt";
    char name0[16] = "prompt[0]";
    if (!p) return BAD(e, "prompt", "prompt: required, a string or an array of token ids");
    if (json_is_array(p) && json_array_size(p) == 1 && !json_is_number(json_array_get(p, 0))) {
        p = json_array_get(p, 0); /* ["text"] or [[1, 2, 3]]: a batch of one */
        name = name0;
    }
    if (json_is_string(p)) {
        if (json_string_length(p) == 0)
            return BAD(e, name, "%s: expected a non-empty string", name);
        r->text_len = json_string_length(p);
        return (r->text = dup_bytes(json_string_value(p), r->text_len)) ? true : out_of_memory(e);
    }
    if (!json_is_array(p))
        return BAD(e, name, "%s: expected a string or an array of token ids, found %s", name,
                   found(p));
    if (json_array_size(p) == 0) return BAD(e, name, "%s: expected at least one token id", name);
    if (!all_integers(p))
        return BAD(e, name,
                   "%s: expected one prompt (a string or an array of token ids); batches of "
                   "several prompts are not supported",
                   name);
    return parse_ids(p, name, lim, &r->ids, &r->n_ids, e);
}

static bool parse_completion(const json_t *root, const request_limits *lim, server_request *r,
                             request_error *e) {
    r->max_tokens = 16;
    if (!parse_prompt(root, lim, r, e) || !parse_structured(root, r, e) ||
        !parse_common(root, lim, r, e))
        return false;
    int64_t k = -1;
    if (!field_int(root, "logprobs", 0, REQUEST_MAX_COMPLETION_LOGPROBS, &k, e)) return false;
    r->logprobs = k >= 0;
    r->top_logprobs = k > 0 ? (int32_t)k : 0;
    bool echo = false;
    if (!field_bool(root, "echo", &echo, e)) return false;
    if (echo) return BAD(e, "echo", "echo: echoing the prompt is not supported yet");
    k = 1;
    if (!field_int(root, "best_of", 1, REQUEST_MAX_N, &k, e)) return false;
    if (k > 1) return BAD(e, "best_of", "best_of: only 1 is supported");
    const json_t *suffix = field_get(root, "suffix");
    if (suffix && (!json_is_string(suffix) || json_string_length(suffix) > 0))
        return BAD(e, "suffix", "suffix: insertion after a suffix is not supported yet");
    return true;
}

static bool parse_tokenize(const json_t *root, server_request *r, request_error *e) {
    const json_t *c = field_get(root, "content");
    if (!json_is_string(c))
        return BAD(e, "content", "content: expected a string, found %s", c ? found(c) : "nothing");
    r->text_len = json_string_length(c);
    if (!(r->text = dup_bytes(json_string_value(c), r->text_len))) return out_of_memory(e);
    return field_bool(root, "add_special", &r->add_special, e);
}

static bool parse_detokenize(const json_t *root, const request_limits *lim, server_request *r,
                             request_error *e) {
    const json_t *t = field_get(root, "tokens");
    if (!json_is_array(t))
        return BAD(e, "tokens", "tokens: expected an array of token ids, found %s",
                   t ? found(t) : "nothing");
    return parse_ids(t, "tokens", lim, &r->ids, &r->n_ids, e);
}

/* ==== Entry point ==== */

bool request_parse(request_kind kind, const char *body, size_t len, const request_limits *lim,
                   server_request *out, request_error *e) {
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    out->kind = kind;
    out->n = 1;
    out->top_logprobs = 0;
    /* OpenAI's defaults, not the CLI's: temperature 1, nucleus, top-k and min-p off; the
     * repetition window is llama.cpp's 64, though the penalty is off (1). Set here rather
     * than from celer_sampler_default_params so this file links alone (the fuzz target). */
    out->sampling = (celer_sampler_params){.temp = 1.0f,
                                           .top_k = 0,
                                           .top_p = 1.0f,
                                           .min_p = 0.0f,
                                           .repeat_penalty = 1.0f,
                                           .repeat_last_n = 64,
                                           .seed = 0};
    json_error_t jerr;
    json_t *root = json_loadb(body ? body : "", len, 0, &jerr);
    if (!root) {
        /* jansson says "unable to decode byte 0x.." for bytes that are not UTF-8. */
        const bool utf8 = strstr(jerr.text, "decode byte") || strstr(jerr.text, "Unicode");
        return BAD(e, NULL, "the body is not valid %s: %s (line %d, column %d)",
                   utf8 ? "UTF-8 JSON" : "JSON", jerr.text, jerr.line, jerr.column);
    }
    bool ok;
    if (!json_is_object(root)) {
        ok = BAD(e, NULL, "the body must be a JSON object, found %s", found(root));
    } else {
        switch (kind) {
        case REQUEST_CHAT:
            ok = parse_chat(root, lim, out, e);
            break;
        case REQUEST_COMPLETION:
            ok = parse_completion(root, lim, out, e);
            break;
        case REQUEST_TOKENIZE:
            ok = parse_tokenize(root, out, e);
            break;
        default:
            ok = parse_detokenize(root, lim, out, e);
            break;
        }
    }
    json_decref(root);
    if (!ok) request_free(out);
    return ok;
}
