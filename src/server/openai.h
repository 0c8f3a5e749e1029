/*
 * openai.h - the JSON the OpenAI-compatible endpoints answer with: completion and chat
 * completion objects, their streamed chunks as server-sent events, log-probabilities in
 * the chat and the legacy completions shapes, usage, and error objects.
 *
 * Builders only: they take plain values (texts, numbers, finish reasons) and return
 * jansson objects or malloc'd strings. They know nothing of HTTP, the engine or the
 * tokenizer; a caller turns token ids into text first.
 */
#ifndef CELER_SERVER_OPENAI_H
#define CELER_SERVER_OPENAI_H

#include "celer.h"
#include "server/request.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What every object of one response shares. */
typedef struct openai_meta {
    const char *id;    /* "chatcmpl-..." or "cmpl-..." */
    int64_t created;   /* Unix seconds */
    const char *model; /* the served model's name */
    bool chat;         /* chat.completion(.chunk) rather than text_completion */
} openai_meta;

typedef struct openai_usage {
    int64_t prompt_tokens, completion_tokens, cached_tokens;
} openai_usage;

/* One sampled token with its log-probability and the most likely alternatives, as text
 * (token texts may hold any bytes; they are written as valid UTF-8 plus "bytes"). */
typedef struct openai_logprob {
    const char *token;
    size_t token_len;
    float logprob;
    int32_t n_top;
    const char *const *top_tokens; /* [n_top] */
    const size_t *top_lens;
    const float *top_logprobs;
} openai_logprob;

/* A fresh id: prefix followed by 24 random letters and digits, into out[cap]. */
void openai_make_id(const char *prefix, char *out, size_t cap);

/* "stop" / "length" (a cancelled choice reads as "length": it was cut short). */
const char *openai_finish_reason(celer_finish_reason f);

/* A JSON string of s[len]; invalid UTF-8 bytes become U+FFFD. NULL when out of memory. */
json_t *openai_string(const char *s, size_t len);

/* Characters of openai_string(s, len): code points, each invalid byte counting one. */
size_t openai_char_count(const char *s, size_t len);

/* {"error": {"message", "type", "param", "code"}}. */
json_t *openai_error(const request_error *e);

/* {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details":
 * {"cached_tokens"}}. */
json_t *openai_usage_json(const openai_usage *u);

/* Chat: {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}. */
json_t *openai_chat_logprob(const openai_logprob *lp);

/* Legacy completions: {"tokens": [], "token_logprobs": [], "top_logprobs": [],
 * "text_offset": []}, and appending one token at character offset `offset` of the text. */
json_t *openai_completion_logprobs_new(void);
bool openai_completion_logprobs_append(json_t *obj, const openai_logprob *lp, size_t offset);

/* One finished choice: chat {"index", "message": {"role", "content"}, "logprobs",
 * "finish_reason"} or completion {"index", "text", "logprobs", "finish_reason"}.
 * logprobs is stolen (a chat content array or a legacy object), or NULL for null. */
json_t *openai_choice(const openai_meta *m, int32_t index, const char *text, size_t len,
                      json_t *logprobs, celer_finish_reason finish);

/* A chat choice from its message object (stolen: {"role", "content", "tool_calls"?, ...}),
 * logprobs (stolen chat content array, or NULL) and finish reason ("stop", "length",
 * "tool_calls"). */
json_t *openai_chat_choice(int32_t index, json_t *message, json_t *logprobs, const char *finish);

/* A chat chunk of one choice from its delta object (stolen), logprobs (stolen, or NULL) and
 * finish reason (NULL while the choice goes on). */
json_t *openai_chat_chunk(const openai_meta *m, int32_t index, json_t *delta, json_t *logprobs,
                          const char *finish);

/* The whole non-streamed answer; choices (an array) is stolen. */
json_t *openai_response(const openai_meta *m, json_t *choices, const openai_usage *u);

/* A streamed chunk for choice `index`: a delta (chat: role when `role`, content when
 * text is not NULL; completion: "text") with logprobs (stolen, may be NULL) and
 * finish_reason (null while f is CELER_FINISH_NONE). */
json_t *openai_chunk(const openai_meta *m, int32_t index, bool role, const char *text, size_t len,
                     json_t *logprobs, celer_finish_reason f);
/* The last chunk when include_usage: "choices": [] and usage. */
json_t *openai_usage_chunk(const openai_meta *m, const openai_usage *u);

/* "data: <compact json>\n\n" appended to *buf (length *len, capacity *cap, realloc'd);
 * obj is released. False when out of memory. */
bool openai_sse_append(char **buf, size_t *len, size_t *cap, json_t *obj);

#endif
