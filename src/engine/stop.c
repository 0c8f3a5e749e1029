/*
 * stop.c - the stop-string scan of stop.h.
 *
 * A match can only start at or after `sent`: every released byte was followed by text
 * that ruled out a match starting there.
 */
#include "engine/stop.h"

#include <string.h>

static const char *find(const char *hay, size_t n, const char *needle, size_t m) {
    for (size_t i = 0; m <= n && i + m <= n; i++)
        if (hay[i] == needle[0] && !memcmp(hay + i, needle, m)) return hay + i;
    return NULL;
}

size_t stop_scan(const char *const *stops, int n, const char *text, size_t len, size_t sent,
                 bool *matched) {
    *matched = false;
    size_t end = len, hold = 0;
    for (int i = 0; i < n; i++) {
        const size_t m = strlen(stops[i]);
        const char *at = find(text + sent, len - sent, stops[i], m);
        if (at && (size_t)(at - text) < end) {
            end = (size_t)(at - text);
            *matched = true;
        }
        /* The longest suffix of the unreleased text that this stop string begins with. */
        for (size_t k = m - 1 < len - sent ? m - 1 : len - sent; k > hold; k--)
            if (!memcmp(text + len - k, stops[i], k)) {
                hold = k;
                break;
            }
    }
    return *matched ? end : len - hold;
}
