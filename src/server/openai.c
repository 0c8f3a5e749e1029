/*
 * openai.c - builders of the JSON objects the OpenAI-compatible endpoints answer with
 * (openai.h): responses, streamed chunks, log-probabilities, usage and errors.
 *
 * Shapes follow OpenAI's API reference: chat.completion / chat.completion.chunk and
 * text_completion, with finish_reason, usage and logprobs in the same places. Nothing
 * here decides what to generate or when to send it.
 */
#define _DEFAULT_SOURCE
#include "server/openai.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

void openai_make_id(const char *prefix, char *out, size_t cap) {
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char r[24];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x =
            (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec ^ (uintptr_t)out;
        for (size_t i = 0; i < sizeof r; i++)
            x ^= x << 13, x ^= x >> 7, x ^= x << 17, r[i] = (unsigned char)x;
    }
    size_t n = strlen(prefix);
    if (cap == 0) return;
    if (n > cap - 1) n = cap - 1;
    memcpy(out, prefix, n);
    for (size_t i = 0; i < sizeof r && n + 1 < cap; i++)
        out[n++] = digits[r[i] % (sizeof digits - 1)];
    out[n] = '\0';
}

const char *openai_finish_reason(celer_finish_reason f) {
    return f == CELER_FINISH_STOP ? "stop" : "length";
}

/* Length of the valid UTF-8 sequence at s[0, n), or 0 when it is not one. */
static size_t utf8_valid_len(const unsigned char *s, size_t n) {
    const unsigned c = s[0];
    size_t len;
    uint32_t cp, min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

json_t *openai_string(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    bool clean = true;
    for (size_t i = 0; i < len && clean;) {
        const size_t k = utf8_valid_len(u + i, len - i);
        clean = k > 0 && !(k == 1 && u[i] == 0);
        i += k;
    }
    if (clean) return json_stringn_nocheck(s, len);
    char *buf = malloc(len * 3 + 1), *w = buf; /* each bad byte grows to 3 */
    if (!buf) return NULL;
    for (size_t i = 0; i < len;) {
        const size_t k = utf8_valid_len(u + i, len - i);
        if (k == 0 || (k == 1 && u[i] == 0)) {
            memcpy(w, "\xEF\xBF\xBD", 3), w += 3, i++;
        } else {
            memcpy(w, s + i, k), w += k, i += k;
        }
    }
    json_t *j = json_stringn_nocheck(buf, (size_t)(w - buf));
    free(buf);
    return j;
}

size_t openai_char_count(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = 0;
    for (size_t i = 0; i < len; n++) {
        const size_t k = utf8_valid_len(u + i, len - i);
        i += k ? k : 1;
    }
    return n;
}

/* JSON has no infinities: a log-probability of -inf reads as OpenAI's -9999. */
static json_t *logprob_json(float lp) {
    return json_real(isfinite(lp) ? (double)lp : -9999.0);
}

static json_t *bytes_json(const char *s, size_t len) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < len; i++)
        json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* Message and param may quote a client's text cut at any byte: they go through
 * openai_string, so the error object is always valid UTF-8. */
json_t *openai_error(const request_error *e) {
    return json_pack("{s:{s:o, s:s, s:o?, s:s?}}", "error", "message",
                     openai_string(e->message, strlen(e->message)), "type",
                     e->type ? e->type : "invalid_request_error", "param",
                     e->param[0] ? openai_string(e->param, strlen(e->param)) : NULL, "code",
                     e->code);
}

json_t *openai_usage_json(const openai_usage *u) {
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)u->prompt_tokens,
                     "completion_tokens", (json_int_t)u->completion_tokens, "total_tokens",
                     (json_int_t)(u->prompt_tokens + u->completion_tokens), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)u->cached_tokens);
}

/* ==== Log-probabilities ==== */

json_t *openai_chat_logprob(const openai_logprob *lp) {
    json_t *tops = json_array();
    for (int32_t i = 0; tops && i < lp->n_top; i++)
        json_array_append_new(tops, json_pack("{s:o, s:o, s:o}", "token",
                                              openai_string(lp->top_tokens[i], lp->top_lens[i]),
                                              "logprob", logprob_json(lp->top_logprobs[i]), "bytes",
                                              bytes_json(lp->top_tokens[i], lp->top_lens[i])));
    return json_pack("{s:o, s:o, s:o, s:o}", "token", openai_string(lp->token, lp->token_len),
                     "logprob", logprob_json(lp->logprob), "bytes",
                     bytes_json(lp->token, lp->token_len), "top_logprobs", tops);
}

json_t *openai_completion_logprobs_new(void) {
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

bool openai_completion_logprobs_append(json_t *obj, const openai_logprob *lp, size_t offset) {
    json_t *tops = json_object();
    for (int32_t i = 0; tops && i < lp->n_top; i++) {
        json_t *key = openai_string(lp->top_tokens[i], lp->top_lens[i]);
        if (key)
            json_object_set_new(tops, json_string_value(key), logprob_json(lp->top_logprobs[i]));
        json_decref(key);
    }
    int bad = !tops;
    bad |= json_array_append_new(json_object_get(obj, "tokens"),
                                 openai_string(lp->token, lp->token_len));
    bad |= json_array_append_new(json_object_get(obj, "token_logprobs"), logprob_json(lp->logprob));
    bad |= json_array_append_new(json_object_get(obj, "top_logprobs"), tops);
    bad |= json_array_append_new(json_object_get(obj, "text_offset"),
                                 json_integer((json_int_t)offset));
    return !bad;
}

/* ==== Responses and chunks ==== */

json_t *openai_choice(const openai_meta *m, int32_t index, const char *text, size_t len,
                      json_t *logprobs, celer_finish_reason finish) {
    json_t *lp = logprobs ? logprobs : json_null();
    if (m->chat && logprobs) lp = json_pack("{s:o, s:n}", "content", logprobs, "refusal");
    if (m->chat)
        return json_pack("{s:i, s:{s:s, s:o, s:n}, s:o, s:s}", "index", index, "message", "role",
                         "assistant", "content", openai_string(text, len), "refusal", "logprobs",
                         lp, "finish_reason", openai_finish_reason(finish));
    return json_pack("{s:i, s:o, s:o, s:s}", "index", index, "text", openai_string(text, len),
                     "logprobs", lp, "finish_reason", openai_finish_reason(finish));
}

json_t *openai_chat_choice(int32_t index, json_t *message, json_t *logprobs, const char *finish) {
    json_t *lp = logprobs ? json_pack("{s:o, s:n}", "content", logprobs, "refusal") : json_null();
    if (message) json_object_set_new(message, "refusal", json_null());
    return json_pack("{s:i, s:o, s:o, s:s}", "index", index, "message", message, "logprobs", lp,
                     "finish_reason", finish);
}

json_t *openai_response(const openai_meta *m, json_t *choices, const openai_usage *u) {
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", m->id, "object",
                     m->chat ? "chat.completion" : "text_completion", "created",
                     (json_int_t)m->created, "model", m->model, "choices", choices, "usage",
                     openai_usage_json(u));
}

static json_t *chunk_json(const openai_meta *m, json_t *choices) {
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", m->id, "object",
                     m->chat ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)m->created, "model", m->model, "choices", choices);
}

json_t *openai_chunk(const openai_meta *m, int32_t index, bool role, const char *text, size_t len,
                     json_t *logprobs, celer_finish_reason f) {
    json_t *choice = json_pack("{s:i}", "index", index), *lp = logprobs ? logprobs : json_null();
    if (!choice) {
        json_decref(logprobs);
        return NULL;
    }
    if (m->chat) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (text) json_object_set_new(delta, "content", openai_string(text, len));
        json_object_set_new(choice, "delta", delta);
        if (logprobs) lp = json_pack("{s:o, s:n}", "content", logprobs, "refusal");
    } else {
        json_object_set_new(choice, "text", openai_string(text ? text : "", text ? len : 0));
    }
    json_object_set_new(choice, "logprobs", lp);
    json_object_set_new(choice, "finish_reason",
                        f == CELER_FINISH_NONE ? json_null()
                                               : json_string(openai_finish_reason(f)));
    return chunk_json(m, json_pack("[o]", choice));
}

json_t *openai_chat_chunk(const openai_meta *m, int32_t index, json_t *delta, json_t *logprobs,
                          const char *finish) {
    json_t *lp = logprobs ? json_pack("{s:o, s:n}", "content", logprobs, "refusal") : json_null();
    json_t *choice = json_pack("{s:i, s:o, s:o, s:o}", "index", index, "delta", delta, "logprobs",
                               lp, "finish_reason", finish ? json_string(finish) : json_null());
    return choice ? chunk_json(m, json_pack("[o]", choice)) : NULL;
}

json_t *openai_usage_chunk(const openai_meta *m, const openai_usage *u) {
    json_t *c = chunk_json(m, json_array());
    if (c) json_object_set_new(c, "usage", openai_usage_json(u));
    return c;
}

bool openai_sse_append(char **buf, size_t *len, size_t *cap, json_t *obj) {
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (!s) return false;
    const size_t n = strlen(s), need = *len + n + 8 + 1;
    if (need > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < need) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) {
            free(s);
            return false;
        }
        *buf = b, *cap = c;
    }
    memcpy(*buf + *len, "data: ", 6);
    memcpy(*buf + *len + 6, s, n);
    memcpy(*buf + *len + 6 + n, "\n\n", 3);
    *len += n + 8;
    free(s);
    return true;
}
