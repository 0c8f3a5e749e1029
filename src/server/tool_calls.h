/*
 * tool_calls.h - the tool-call formats of chat models: which one a chat template speaks,
 * how a model's output splits into content and calls (all at once or piece by piece as it
 * is generated), and the GBNF frame that forces a call.
 *
 * Pure text in, structures out: no HTTP, no engine, no tokens. The caller (the server's
 * OpenAI routes) renders the prompt, runs generation and turns the structures below into
 * JSON. It compiles each tool's `parameters` schema into the grammar rule `tool<i>-args`
 * itself; this module writes only the frame around those rules.
 *
 *     tool_format f = tool_format_detect(template_src);
 *     tool_stream *s = tool_stream_create(f, tools, seed);
 *     for each generated piece:
 *         const tool_stream_out *o = tool_stream_push(s, piece, len);
 *         send o->content, o->reasoning and o->deltas[] (OpenAI chunk deltas)
 *     o = tool_stream_finish(s);   send the rest
 *     tool_stream_malformed(s) ? log tool_stream_problem(s) : ...
 *     tool_stream_destroy(s);
 *
 * Formats (what the model writes; "ws" is JSON whitespace):
 *   hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, one block per
 *                call (Qwen2.5, Qwen3, Hermes)
 *   llama3       {"name": "f", "parameters": {...}} at the start of the output or after
 *                <|python_tag|>; "arguments" and "type": "function" are accepted; several calls
 *                separated by ';' and/or ws (Llama 3.1 / 3.2)
 *   mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "abcdefghi"}] (v3
 *                templates; ws after the marker is accepted, so is a single object)
 *   command_r7b  <|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f", "parameters":
 *                {...}}]<|END_ACTION|>; <|START_THINKING|>...<|END_THINKING|> is reasoning, not
 *                content; <|START_RESPONSE|> and <|END_RESPONSE|> are dropped
 *   phi4_mini    functools[{"name": "f", "arguments": {...}}]
 *   generic      the whole output is one JSON object: {"tool_calls": [{"name": "f",
 *                "arguments": {...}}]} or {"response": "text"}; for templates that render no
 *                tools, with the tools described by tool_calls_generic_system()
 *
 * Parsing rules, the same for the complete and the streamed parse:
 *   - text outside call blocks is content; whitespace touching a call block is dropped
 *     (the templates put a newline between content and a call);
 *   - "arguments" is a JSON object, passed on compactly (whitespace outside strings removed,
 *     everything else byte for byte as the model wrote it); a string holding a JSON object
 *     is accepted too (transformers templates render string arguments that way);
 *   - a call block that does not parse (bad JSON, a name not among the tools, arguments not
 *     an object, a missing end marker followed by other text) turns itself and everything
 *     after it back into content, marker and whitespace included, and sets the malformed
 *     flag. Calls before it stand: a stream may already have sent them. Nothing is lost.
 *   - ids: OpenAI style "call_" + 24 alphanumerics from the seeded generator, except for
 *     mistral, whose templates refuse any id but 9 alphanumerics: the model's own id when it
 *     is such, else 9 generated alphanumerics. Command R7B's tool_call_id ("0", "1", ...) is
 *     a per-turn counter that its template renumbers anyway, so it gets a "call_" id.
 *   - a block may end without its end marker when the output ends there (generation
 *     stopped on it or on a stop string).
 * Limits: a call block of at most TOOL_CALLS_MAX_BLOCK bytes and TOOL_CALLS_MAX_CALLS calls
 * per output; beyond either the block is malformed (content), never an error.
 */
#ifndef CELER_SERVER_TOOL_CALLS_H
#define CELER_SERVER_TOOL_CALLS_H

#include "celer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Why a call failed: one line. */
typedef struct tool_error {
    char msg[256];
} tool_error;

#define TOOL_CALLS_MAX_BLOCK (1u << 20)
#define TOOL_CALLS_MAX_CALLS 128

typedef enum tool_format {
    TOOL_FORMAT_GENERIC = 0,
    TOOL_FORMAT_HERMES,
    TOOL_FORMAT_LLAMA3,
    TOOL_FORMAT_MISTRAL,
    TOOL_FORMAT_COMMAND_R7B,
    TOOL_FORMAT_PHI4_MINI,
    TOOL_FORMAT_COUNT
} tool_format;

/* The format a chat template's source speaks, from the tokens it emits (in this order):
 * <|START_ACTION|> command_r7b; [TOOL_CALLS] mistral; <tool_call> hermes; <|tool|> with
 * <|/tool|>, or functools, phi4_mini; <|start_header_id|> with ipython or <|python_tag|>
 * llama3; anything else (NULL too) generic. */
tool_format tool_format_detect(const char *template_src);
/* "hermes", "llama3", ...; "?" out of range. */
const char *tool_format_name(tool_format f);

/* ==== Complete parse ==== */

typedef struct tool_call {
    char *id;        /* "call_..." or the model's (see above) */
    char *name;      /* the function's name */
    char *arguments; /* a compact JSON object */
} tool_call;

typedef struct tool_calls_result {
    char *content; /* NUL-terminated, content_len bytes (it may hold NUL bytes itself) */
    size_t content_len;
    char *reasoning; /* command_r7b's thinking; "" otherwise */
    size_t reasoning_len;
    tool_call *calls;
    size_t n_calls;
    bool malformed;    /* a call block was turned back into content */
    char problem[200]; /* why, one line, when malformed */
} tool_calls_result;

/* Splits a complete output text[len] of format f into content and calls. tools: the
 * request's OpenAI tools array (names are checked against it; NULL accepts any name).
 * seed drives the generated ids (the same seed gives the same ids as a tool_stream).
 * Fails only when out of memory; everything in *out is the caller's, freed by
 * tool_calls_result_free. */
celer_status tool_calls_parse(tool_format f, const char *text, size_t len, const json_t *tools,
                              uint64_t seed, tool_calls_result *out, tool_error *e);
void tool_calls_result_free(tool_calls_result *r);

/* ==== Stream parse ==== */

typedef struct tool_stream tool_stream;

/* One OpenAI streamed tool-call delta. The first of a call carries id and name (and
 * arguments ""); later ones only index and a piece of arguments (id == name == NULL). */
typedef struct tool_call_delta {
    int index;
    const char *id;
    const char *name;
    const char *arguments;
} tool_call_delta;

/* What one push (or finish) releases. Owned by the stream, valid until its next call. */
typedef struct tool_stream_out {
    const char *content; /* NUL-terminated, content_len bytes */
    size_t content_len;
    const char *reasoning;
    size_t reasoning_len;
    const tool_call_delta *deltas;
    size_t n_deltas;
} tool_stream_out;

/* A parser for one output. tools as for tool_calls_parse (the stream keeps a reference).
 * NULL when out of memory. */
tool_stream *tool_stream_create(tool_format f, const json_t *tools, uint64_t seed);
/* Feeds the next piece; returns what can be released now: text that cannot start a call
 * marker, and each call once its JSON is complete. NULL when out of memory (the stream is
 * then unusable). */
const tool_stream_out *tool_stream_push(tool_stream *s, const char *piece, size_t len);
/* The end of the output: releases everything held. NULL when out of memory. */
const tool_stream_out *tool_stream_finish(tool_stream *s);
/* The calls so far (owned by the stream). */
const tool_call *tool_stream_calls(const tool_stream *s, size_t *n);
bool tool_stream_malformed(const tool_stream *s);
const char *tool_stream_problem(const tool_stream *s); /* "" unless malformed */
void tool_stream_destroy(tool_stream *s);

/* ==== Grammar frame ==== */

/* GBNF (llama.cpp syntax) whose rule `root` produces exactly one call of format f (one or
 * more, separated as the format does, when parallel), the name forced to forced_name (NULL:
 * any of the tools). The arguments of tools[i] are the rule `tool<i>-args`, which the
 * caller appends (i is the tool's index in tools, also when one is forced); the frame's own
 * rules are named root and tc-*. For the generic format with allow_response, root also
 * admits {"response": "<JSON string>"} (tool_choice "auto"); other formats need no grammar
 * for "auto" and allow_response gives *out = NULL. *out is malloc'd (the caller frees it).
 * Errors: tools not an array of functions with names, an empty one, forced_name not
 * among them. */
celer_status tool_calls_grammar(tool_format f, const json_t *tools, const char *forced_name,
                                bool parallel, bool allow_response, char **out, tool_error *e);

/* ==== The generic format's prompt ==== */

/* The system text that describes tools (an OpenAI tools array) and the generic answer
 * format: the tools' name, description and parameters as JSON, one per line, then the two
 * answer shapes (with parallel, the model is told it may list several calls). malloc'd;
 * NULL with e set when tools is not an array of named functions or out of memory. */
char *tool_calls_generic_system(const json_t *tools, bool parallel, tool_error *e);

/* messages (an OpenAI messages array) with that text merged in: appended after a blank
 * line to the content of a first "system" message (a string, or a list of parts, where it
 * becomes one more text part), or as a new first system message when there is none. A new
 * reference; messages is not changed. NULL with e set as above. */
json_t *tool_calls_generic_messages(const json_t *messages, const json_t *tools, bool parallel,
                                    tool_error *e);

#endif
