/*
 * chat_tools.h - OpenAI tool calling on the chat route: what a request with tools changes
 * in the prompt (the template sees `tools`, or, for a template that renders none, a system
 * message describing them), the grammar that forces a call (tool_choice "required" or a
 * named function, and the generic format's answer shapes), and the JSON of the calls parsed
 * from the output (tool_calls.h does the parsing).
 *
 * It knows nothing of HTTP or of how pieces are waited for; generate.c calls it.
 */
#ifndef CELER_SERVER_CHAT_TOOLS_H
#define CELER_SERVER_CHAT_TOOLS_H

#include "server/request.h"
#include "server/tool_calls.h"

#include <jansson.h>
#include <stdbool.h>

/* The prompt inputs and grammar of chat request r with tools (r->tools_json set) for a
 * template of format f: *messages_json (malloc'd JSON text) the messages the template
 * renders, *vars (malloc'd JSON object text, or NULL) its extra variables (r's
 * chat_template_kwargs over defaults, plus "tools"), *grammar (malloc'd GBNF, or NULL when
 * the output is free). A parameters schema the compiler refuses, when a grammar needs it,
 * is a 400 naming tools[i].function.parameters. */
bool chat_tools_prepare(tool_format f, const char *defaults, const server_request *r,
                        char **messages_json, char **vars, char **grammar, request_error *e);

/* [{"id", "type": "function", "function": {"name", "arguments"}}] of calls[n]. */
json_t *chat_tools_calls_json(const tool_call *calls, size_t n);

/* One streamed delta's tool_calls array: [{"index", "id"?, "type"?, "function": {"name"?,
 * "arguments"}}] (id, type and name on a call's first delta only). */
json_t *chat_tools_deltas_json(const tool_call_delta *d, size_t n);

#endif
