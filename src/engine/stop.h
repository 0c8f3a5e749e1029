/*
 * stop.h - stop strings matched across token boundaries.
 *
 * Generated text arrives a token at a time. Bytes that could still turn into a stop
 * string are held back; once a stop string appears, the text before it is the last that
 * is released and the stop string itself never is. Pure string logic, no tokens.
 */
#ifndef CELER_ENGINE_STOP_H
#define CELER_ENGINE_STOP_H

#include <stdbool.h>
#include <stddef.h>

/* text[len] is everything generated so far, of which text[0, sent) was released. Returns
 * the end of what may be released now: the start of the earliest stop string (and
 * *matched = true), else len minus the longest suffix that is a prefix of a stop string.
 * stops[n] are non-empty. */
size_t stop_scan(const char *const *stops, int n, const char *text, size_t len, size_t sent,
                 bool *matched);

#endif
