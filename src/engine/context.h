/*
 * context.h - what the engine's scheduler needs of a context beyond the public API: its
 * KV cache, to look up, attach and publish prefix blocks and to check room before a step.
 */
#ifndef CELER_ENGINE_CONTEXT_H
#define CELER_ENGINE_CONTEXT_H

#include "celer.h"
#include "engine/kv_cache.h"

/* The context's KV cache; valid until celer_context_destroy. */
kv_cache *context_kv(celer_context *ctx);

#endif
