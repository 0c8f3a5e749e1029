/*
 * hf_download.c - models by name from the Hugging Face Hub into the Hugging Face cache (see
 * hf_download.h), written exactly as huggingface_hub writes it:
 *   models--ORG--NAME/blobs/<etag>              the bytes (the etag is the sha256 of an LFS
 *                                               file, the git blob sha1 of a small one)
 *   models--ORG--NAME/snapshots/<commit>/<path> a relative link, ../../blobs/<etag> (one
 *                                               ../ more per folder of path)
 *   models--ORG--NAME/refs/<revision>           the commit, no newline
 *   .locks/models--ORG--NAME/<etag>.lock        held (flock, as its filelock) while the
 *                                               blob is written
 * A blob is written to blobs/<etag>.incomplete and renamed only once its size and, for an
 * LFS file, its sha256 check; links are made once every blob is in, the ref last. So an
 * interrupted pull leaves at most a .incomplete, which the next one resumes.
 *
 * Requests, all to $HF_ENDPOINT: GET /api/models/ORG/NAME/revision/REV?blobs=true (the commit
 * and the file list, hf_repo.c), then per file a HEAD of /ORG/NAME/resolve/COMMIT/PATH not
 * following the redirect (the Hub's 302 to its CDN carries X-Linked-Etag and X-Linked-Size;
 * a small file answers 200 with ETag and Content-Length) and a GET of the same URL that
 * follows it. The token is a custom Authorization header: libcurl sends it to the first
 * host only and drops it on a redirect to another host, port or scheme (CURLOPT_
 * UNRESTRICTED_AUTH off, the default), so the CDN never sees it. It is never printed.
 *
 * Resuming uses CURLOPT_RANGE ("N-") rather than CURLOPT_RESUME_FROM_LARGE: libcurl refuses
 * a 200 answer to the latter, where a 200 here simply restarts the file from zero.
 * Bounded: a connect timeout, a transfer that moves no byte for HF_HUB_DOWNLOAD_TIMEOUT
 * seconds ends, metadata requests have a total limit, redirects and retries are capped.
 * It never prints: progress goes to the caller's callback, errors to one line.
 */
#define _DEFAULT_SOURCE
#include "io/hf_download.h"

#include "io/hf_cache.h"
#include "io/hf_repo.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define HF_PATH            4096
#define HF_URL             8192
#define HF_ETAG            129 /* an etag: 128 characters at most */
#define HF_HEADER          256 /* a header value kept from a response */
#define HF_ATTEMPTS        4   /* GETs of one file, each resuming the last, before giving up */
#define HF_CONNECT_TIMEOUT 10L /* seconds to connect */
#define HF_META_TIMEOUT    60L /* seconds for the file list or a HEAD, all in */
#define HF_MAX_REDIRS      5L
#define HF_STALL_DEFAULT   30L /* seconds a transfer may move nothing */
#define HF_TOKEN_MAX       1024
#define HF_HASH_CHUNK      (1 << 20)

/* snprintf into out[cap]; false when the text did not fit. */
static bool fmt(char *out, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));
static bool fmt(char *out, size_t cap, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(out, cap, f, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < cap;
}

/* ==== Environment ==== */

bool hf_offline(void) {
    const char *v = getenv("HF_HUB_OFFLINE");
    return v && (!strcasecmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "yes") ||
                 !strcasecmp(v, "true"));
}

typedef struct hub {
    char repo[256], quant[HF_TAG], rev[HF_REV];
    char endpoint[1024];              /* $HF_ENDPOINT, no trailing '/' */
    char root[HF_PATH], dir[HF_PATH]; /* the cache, and models--ORG--NAME in it */
    char commit[41];
    long stall_s;
    bool has_token;
    struct curl_slist *headers; /* the Authorization header, when there is a token */
    CURL *curl;
    celer_pull_progress progress;
    void *user;
} hub;

static celer_status endpoint_get(hub *h, celer_error *e) {
    const char *v = getenv("HF_ENDPOINT");
    if (!v || !*v) v = "https://huggingface.co";
    size_t n = strlen(v);
    while (n > 0 && v[n - 1] == '/') n--;
    bool ok = (!strncmp(v, "http://", 7) || !strncmp(v, "https://", 8)) && n < sizeof h->endpoint;
    for (size_t i = 0; ok && i < n; i++) ok = v[i] > 0x20 && v[i] < 0x7f;
    if (!ok) {
        char shown[128];
        hf_printable(v, strlen(v), shown, sizeof shown);
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "HF_ENDPOINT=%s: expected an http:// or https:// URL", shown);
    }
    snprintf(h->endpoint, sizeof h->endpoint, "%.*s", (int)n, v);
    return CELER_OK;
}

/* The token into out[cap], "" when there is none: $HF_TOKEN, else the file huggingface_hub
 * keeps it in ($HF_TOKEN_PATH, $HF_HOME/token, ~/.cache/huggingface/token). The messages
 * never hold it. */
static celer_status token_get(char *out, size_t cap, celer_error *e) {
    const char *v = getenv("HF_TOKEN");
    size_t n = 0;
    out[0] = 0;
    if (v && *v) {
        n = strlen(v);
        if (n < cap) memcpy(out, v, n + 1);
    } else {
        const char *tp = getenv("HF_TOKEN_PATH"), *home = getenv("HF_HOME"), *user = getenv("HOME");
        char path[HF_PATH];
        if (tp && *tp)
            fmt(path, sizeof path, "%s", tp);
        else if (home && *home)
            fmt(path, sizeof path, "%s/token", home);
        else
            fmt(path, sizeof path, "%s/.cache/huggingface/token", user && *user ? user : ".");
        FILE *f = fopen(path, "r");
        if (!f) return CELER_OK;
        n = fread(out, 1, cap, f);
        fclose(f);
        if (n < cap) out[n] = 0;
    }
    if (n >= cap) {
        out[0] = 0;
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "the Hugging Face token (HF_TOKEN or the token file) is longer than %zu "
                         "bytes",
                         cap - 1);
    }
    size_t start = strspn(out, " \t\r\n");
    while (n > start && strchr(" \t\r\n", out[n - 1])) n--;
    memmove(out, out + start, n - start);
    out[n - start] = 0;
    for (const char *p = out; *p; p++)
        if (*p <= 0x20 || *p >= 0x7f) {
            explicit_bzero(out, cap);
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "the Hugging Face token (HF_TOKEN or the token file) holds "
                             "characters an HTTP header cannot carry");
        }
    return CELER_OK;
}

/* Frees a header list, its token wiped first. */
static void headers_free(struct curl_slist *list) {
    for (struct curl_slist *p = list; p; p = p->next) explicit_bzero(p->data, strlen(p->data));
    curl_slist_free_all(list);
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_FAILED_INIT;
static void curl_init(void) {
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static celer_status hub_open(hub *h, celer_error *e) {
    celer_status rc = endpoint_get(h, e);
    if (rc != CELER_OK) return rc;
    const char *t = getenv("HF_HUB_DOWNLOAD_TIMEOUT");
    char *end = NULL;
    double stall = t && *t ? strtod(t, &end) : (double)HF_STALL_DEFAULT;
    if (end && (*end || !(stall > 0)))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "HF_HUB_DOWNLOAD_TIMEOUT=%.32s: expected a number of seconds", t);
    h->stall_s = stall < 1 ? 1 : stall > 3600 ? 3600 : (long)(stall + 0.999);
    hf_cache_root(h->root, sizeof h->root);
    if (!hf_repo_dir(h->root, h->repo, h->dir, sizeof h->dir))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "%s: path too long", h->root);
    char token[HF_TOKEN_MAX], line[HF_TOKEN_MAX + 32];
    rc = token_get(token, sizeof token, e);
    if (rc == CELER_OK && *token) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", token);
        h->headers = curl_slist_append(NULL, line);
        h->has_token = true;
        if (!h->headers) rc = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    explicit_bzero(token, sizeof token);
    explicit_bzero(line, sizeof line);
    if (rc != CELER_OK) return rc;
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK || !(h->curl = curl_easy_init()))
        return error_set(e, CELER_STATUS_NETWORK, "libcurl failed to start (%s)",
                         curl_easy_strerror(curl_init_rc));
    return CELER_OK;
}

static void hub_close(hub *h) {
    if (h->curl) curl_easy_cleanup(h->curl);
    headers_free(h->headers);
    h->curl = NULL, h->headers = NULL;
}

/* ==== One request ==== */

/* A blob being written: the .incomplete file, what it holds, and its running sha256. */
typedef struct sink {
    int fd;
    int64_t have, size; /* bytes in the file; bytes expected */
    EVP_MD_CTX *sha;    /* NULL when the file has no sha256 to check */
    bool started;       /* the response's first body byte came */
    bool bad_range;     /* a 206 that does not start where the file ends */
    bool too_long;      /* more bytes than the size */
    int err;            /* errno of a failed write */
    const char *file;   /* its path in the repository, for progress */
    const hub *h;
} sink;

/* The last response of a request: its status and the headers huggingface_hub reads (reset
 * at each status line, so after redirects they are the final response's); its body in
 * memory (keep_body) or into a blob (sink, for a 200 or 206 only). */
typedef struct reply {
    long code;
    char error_code[64], error_message[160];
    char commit[HF_HEADER], etag[HF_HEADER], linked_etag[HF_HEADER];
    int64_t length, linked_size, range_start; /* -1 absent, -2 not a size */
    bool keep_body, body_full;
    char *body;
    size_t n_body, cap_body;
    sink *sink;
} reply;

static void reply_reset(reply *r) {
    r->code = 0;
    r->error_code[0] = r->error_message[0] = 0;
    r->commit[0] = r->etag[0] = r->linked_etag[0] = 0;
    r->length = r->linked_size = r->range_start = -1;
    r->n_body = 0;
}

/* A decimal byte count: 0..HF_MAX_FILE_BYTES, else -2. */
static int64_t size_parse(const char *v, size_t n) {
    if (n == 0 || n > 15 || strspn(v, "0123456789") < n) return -2;
    int64_t x = 0;
    for (size_t i = 0; i < n; i++) x = 10 * x + (v[i] - '0');
    return x > HF_MAX_FILE_BYTES ? -2 : x;
}

static size_t on_header(char *buf, size_t size, size_t n, void *user) {
    reply *r = user;
    const size_t len = size * n;
    char line[1024];
    const size_t k = len < sizeof line ? len : sizeof line - 1;
    memcpy(line, buf, k);
    line[k] = 0;
    line[strcspn(line, "\r\n")] = 0;
    if (!strncmp(line, "HTTP/", 5)) {
        reply_reset(r);
        const char *sp = strchr(line, ' ');
        r->code = sp ? strtol(sp + 1, NULL, 10) : 0;
        return len;
    }
    char *colon = strchr(line, ':');
    if (!colon) return len;
    *colon = 0;
    char *v = colon + 1 + strspn(colon + 1, " \t");
    size_t nv = strlen(v);
    while (nv > 0 && (v[nv - 1] == ' ' || v[nv - 1] == '\t')) v[--nv] = 0;
    if (!strcasecmp(line, "X-Repo-Commit"))
        hf_printable(v, nv, r->commit, sizeof r->commit);
    else if (!strcasecmp(line, "ETag"))
        hf_printable(v, nv, r->etag, sizeof r->etag);
    else if (!strcasecmp(line, "X-Linked-Etag"))
        hf_printable(v, nv, r->linked_etag, sizeof r->linked_etag);
    else if (!strcasecmp(line, "X-Linked-Size"))
        r->linked_size = size_parse(v, nv);
    else if (!strcasecmp(line, "Content-Length"))
        r->length = size_parse(v, nv);
    else if (!strcasecmp(line, "X-Error-Code"))
        hf_printable(v, nv, r->error_code, sizeof r->error_code);
    else if (!strcasecmp(line, "X-Error-Message"))
        hf_printable(v, nv, r->error_message, sizeof r->error_message);
    else if (!strcasecmp(line, "Content-Range") && !strncasecmp(v, "bytes ", 6))
        r->range_start = size_parse(v + 6, strspn(v + 6, "0123456789"));
    return len;
}

/* Starts the blob over from zero (a 200 answer to a Range request). */
static bool sink_restart(sink *s) {
    if (ftruncate(s->fd, 0) != 0 || lseek(s->fd, 0, SEEK_SET) != 0) {
        s->err = errno;
        return false;
    }
    s->have = 0;
    if (s->sha && !EVP_DigestInit_ex(s->sha, EVP_sha256(), NULL)) {
        s->err = ENOMEM;
        return false;
    }
    return true;
}

static bool sink_write(reply *r, const char *buf, size_t len) {
    sink *s = r->sink;
    if (!s->started) {
        s->started = true;
        if (r->code == 206 && r->range_start != s->have) {
            s->bad_range = true;
            return false;
        }
        if (r->code == 200 && s->have > 0 && !sink_restart(s)) return false;
    }
    if ((int64_t)len > s->size - s->have) {
        s->too_long = true;
        return false;
    }
    for (size_t off = 0; off < len;) {
        ssize_t w = write(s->fd, buf + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            s->err = w < 0 ? errno : EIO;
            return false;
        }
        if (s->sha && !EVP_DigestUpdate(s->sha, buf + off, (size_t)w)) {
            s->err = ENOMEM;
            return false;
        }
        off += (size_t)w;
        s->have += w;
    }
    if (s->h->progress) s->h->progress(s->h->user, s->file, s->have, s->size, false);
    return true;
}

static size_t on_body(char *buf, size_t size, size_t n, void *user) {
    reply *r = user;
    const size_t len = size * n;
    if (r->sink)
        return (r->code == 200 || r->code == 206) ? (sink_write(r, buf, len) ? len : 0) : len;
    if (!r->keep_body) return len;
    if (len > (size_t)HF_MAX_LISTING - r->n_body) {
        r->body_full = true;
        return 0;
    }
    if (r->n_body + len + 1 > r->cap_body) {
        size_t cap = r->cap_body ? r->cap_body : 1 << 16;
        while (cap < r->n_body + len + 1) cap *= 2;
        char *p = realloc(r->body, cap);
        if (!p) {
            r->body_full = true;
            return 0;
        }
        r->body = p, r->cap_body = cap;
    }
    memcpy(r->body + r->n_body, buf, len);
    r->n_body += len;
    r->body[r->n_body] = 0;
    return len;
}

/* One request to url: a HEAD (head), or a GET into r's body or sink; follow: follow
 * redirects; range: "N-" or NULL; timeout: seconds all in, 0 for none. Returns libcurl's
 * code, its words in errbuf[CURL_ERROR_SIZE]. */
static CURLcode hub_perform(hub *h, const char *url, bool head, bool follow, const char *range,
                            long timeout, reply *r, char *errbuf) {
    CURL *c = h->curl;
    curl_easy_reset(c);
    reply_reset(r);
    errbuf[0] = 0;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "celer");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h->headers);
    curl_easy_setopt(c, CURLOPT_UNRESTRICTED_AUTH, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, follow ? 1L : 0L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, HF_MAX_REDIRS);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, HF_CONNECT_TIMEOUT);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, h->stall_s);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout);
    curl_easy_setopt(c, CURLOPT_NOBODY, head ? 1L : 0L);
    curl_easy_setopt(c, CURLOPT_RANGE, range);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    return curl_easy_perform(c);
}

/* ==== Errors ==== */

static celer_status net_error(const hub *h, CURLcode cc, const char *errbuf, const char *file,
                              celer_error *e) {
    char why[CURL_ERROR_SIZE];
    const char *w = *errbuf ? errbuf : curl_easy_strerror(cc);
    hf_printable(w, strlen(w), why, sizeof why);
    return error_set(e, CELER_STATUS_NETWORK,
                     "%s%s%s: cannot reach the Hugging Face Hub at %s (%s)", h->repo,
                     file ? ": " : "", file ? file : "", h->endpoint, why);
}

/* The one line for an HTTP error answer to a request for file (NULL: the file list). */
static celer_status http_error(const hub *h, const reply *r, const char *file, celer_error *e) {
    const char *code = r->error_code, *sep = *code ? " " : "";
    if (!strcmp(code, "RepoNotFound") || (!file && r->code == 404 && !*code))
        return error_set(e, CELER_STATUS_NOT_FOUND,
                         "%s: no such repository on the Hugging Face Hub at %s (HTTP %ld "
                         "RepoNotFound%s), and it is not in the Hugging Face cache %s",
                         h->repo, h->endpoint, r->code,
                         h->has_token ? "" : "; a private one needs HF_TOKEN", h->root);
    if (!strcmp(code, "GatedRepo") || r->code == 401 || r->code == 403)
        return error_set(e, CELER_STATUS_NETWORK,
                         h->has_token
                             ? "%s: access refused (HTTP %ld%s%s): the token in HF_TOKEN (or the "
                               "token file) gives no access to this gated or private repository; "
                               "ask for access on its page on the Hub"
                             : "%s: access refused (HTTP %ld%s%s): the repository is gated or "
                               "private; set HF_TOKEN to a Hugging Face token with access",
                         h->repo, r->code, sep, code);
    if (!strcmp(code, "RevisionNotFound"))
        return error_set(e, CELER_STATUS_NOT_FOUND,
                         "%s: no revision %s on the Hugging Face Hub (HTTP %ld RevisionNotFound)",
                         h->repo, h->rev, r->code);
    if (!strcmp(code, "EntryNotFound") || r->code == 404)
        return error_set(e, CELER_STATUS_NOT_FOUND,
                         "%s: no file %s at revision %s on the Hugging Face Hub (HTTP %ld%s%s)",
                         h->repo, file ? file : "list", h->rev, r->code, sep, code);
    if (r->code == 429)
        return error_set(e, CELER_STATUS_NETWORK,
                         "%s: the Hugging Face Hub at %s limits the rate of requests (HTTP 429); "
                         "try again later",
                         h->repo, h->endpoint);
    return error_set(e, CELER_STATUS_NETWORK,
                     "%s%s%s: the Hugging Face Hub at %s answered HTTP %ld%s%s%s%s", h->repo,
                     file ? ": " : "", file ? file : "", h->endpoint, r->code, sep, code,
                     *r->error_message ? ": " : "", r->error_message);
}

/* ==== The file list ==== */

static celer_status listing_get(hub *h, hf_repo_info *info, celer_error *e) {
    char url[HF_URL], errbuf[CURL_ERROR_SIZE];
    char *rev = curl_easy_escape(h->curl, h->rev, 0);
    if (!rev) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    bool fits =
        fmt(url, sizeof url, "%s/api/models/%s/revision/%s?blobs=true", h->endpoint, h->repo, rev);
    curl_free(rev);
    if (!fits) return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "%s: URL too long", h->repo);
    reply r = {.keep_body = true};
    CURLcode cc = hub_perform(h, url, false, true, NULL, HF_META_TIMEOUT, &r, errbuf);
    celer_status rc;
    if (r.body_full)
        rc = error_set(e, CELER_STATUS_BAD_FILE,
                       "%s: the Hub's file list is larger than %d bytes (or memory ran out)",
                       h->repo, HF_MAX_LISTING);
    else if (cc != CURLE_OK)
        rc = net_error(h, cc, errbuf, NULL, e);
    else if (r.code != 200)
        rc = http_error(h, &r, NULL, e);
    else
        rc = hf_repo_info_parse(r.body ? r.body : "", r.n_body, h->repo, info, e);
    free(r.body);
    return rc;
}

/* ==== One file: what to fetch ==== */

typedef struct plan {
    const hf_file *f;
    char etag[HF_ETAG]; /* the blob's name */
    char sha256[65];    /* what its bytes must hash to, "" for no check */
    int64_t size;
} plan;

/* $HF_ENDPOINT/ORG/NAME/resolve/COMMIT/PATH, each part of PATH escaped. */
static bool resolve_url(hub *h, const char *path, char *url, size_t cap) {
    if (!fmt(url, cap, "%s/%s/resolve/%s", h->endpoint, h->repo, h->commit)) return false;
    size_t k = strlen(url);
    for (const char *p = path; *p;) {
        const size_t n = strcspn(p, "/");
        char *part = curl_easy_escape(h->curl, p, (int)n);
        bool ok = part && fmt(url + k, cap - k, "/%s", part);
        curl_free(part);
        if (!ok) return false;
        k += strlen(url + k);
        p += n + (p[n] == '/');
    }
    return true;
}

/* An ETag as huggingface_hub keeps it (no W/, no quotes) into out[HF_ETAG], if it is safe to
 * name a file: 1 to 128 of [A-Za-z0-9._-], not starting with '.'. */
static bool etag_normalize(const char *v, char *out) {
    if (!strncmp(v, "W/", 2)) v += 2;
    size_t n = strlen(v);
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"') v++, n -= 2;
    if (n == 0 || n >= HF_ETAG || v[0] == '.') return false;
    for (size_t i = 0; i < n; i++)
        if (!((v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'z') ||
              (v[i] >= 'A' && v[i] <= 'Z') || strchr("._-", v[i])))
            return false;
    memcpy(out, v, n);
    out[n] = 0;
    return true;
}

static bool is_sha256(const char *s) {
    return strlen(s) == 64 && strspn(s, "0123456789abcdef") == 64;
}

/* The HEAD of a file's resolve URL, not following the CDN redirect (a same-host one, a
 * renamed repository's, is followed): its etag, size and sha256 into p. */
static celer_status meta_get(hub *h, plan *p, celer_error *e) {
    char url[HF_URL], errbuf[CURL_ERROR_SIZE];
    const char *file = p->f->path;
    if (!resolve_url(h, file, url, sizeof url))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "%s: %s: URL too long", h->repo, file);
    reply r = {0};
    for (int hop = 0;; hop++) {
        CURLcode cc = hub_perform(h, url, true, false, NULL, HF_META_TIMEOUT, &r, errbuf);
        if (cc != CURLE_OK) return net_error(h, cc, errbuf, file, e);
        if (r.code < 300 || r.code >= 400 || *r.linked_etag) break;
        char *loc = NULL;
        curl_easy_getinfo(h->curl, CURLINFO_REDIRECT_URL, &loc);
        const size_t ne = strlen(h->endpoint);
        if (hop >= HF_MAX_REDIRS || !loc || strncmp(loc, h->endpoint, ne) || loc[ne] != '/' ||
            !fmt(url, sizeof url, "%s", loc))
            return error_set(e, CELER_STATUS_BAD_FILE,
                             "%s: %s: the Hub redirected elsewhere without X-Linked-Etag", h->repo,
                             file);
    }
    if (r.code < 200 || r.code >= 400) return http_error(h, &r, file, e);
    const bool lfs = *r.linked_etag;
    const int64_t size = lfs ? r.linked_size : r.length;
    if (*r.commit && strcmp(r.commit, h->commit))
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: %s: the Hub answered for commit %.40s, not %s", h->repo, file,
                         r.commit, h->commit);
    if (!etag_normalize(lfs ? r.linked_etag : r.etag, p->etag))
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: %s: the Hub's answer has no usable %s (\"%.64s\")", h->repo, file,
                         lfs ? "X-Linked-Etag" : "ETag", lfs ? r.linked_etag : r.etag);
    if (size < 0)
        return error_set(e, CELER_STATUS_BAD_FILE, "%s: %s: the Hub's answer gives %s size (%s)",
                         h->repo, file, size == -1 ? "no" : "an absurd",
                         lfs ? "X-Linked-Size" : "Content-Length");
    if (p->f->size >= 0 && p->f->size != size)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: %s: the Hub's file list gives %lld bytes, its answer %lld", h->repo,
                         file, (long long)p->f->size, (long long)size);
    p->size = size;
    p->sha256[0] = 0;
    if (*p->f->sha256) {
        if (lfs && is_sha256(p->etag) && strcmp(p->etag, p->f->sha256))
            return error_set(e, CELER_STATUS_BAD_FILE,
                             "%s: %s: the Hub's file list gives sha256 %s, X-Linked-Etag %s",
                             h->repo, file, p->f->sha256, p->etag);
        memcpy(p->sha256, p->f->sha256, sizeof p->sha256);
    } else if (lfs && is_sha256(p->etag)) {
        memcpy(p->sha256, p->etag, sizeof p->sha256);
    }
    return CELER_OK;
}

/* ==== One file: the blob ==== */

/* mkdir -p path. */
static bool mkdir_p(const char *path) {
    char tmp[HF_PATH];
    if (!fmt(tmp, sizeof tmp, "%s", path)) return false;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return false;
        *p = '/';
    }
    return mkdir(tmp, 0755) == 0 || errno == EEXIST;
}

/* Takes huggingface_hub's lock on the blob etag (.locks/models--ORG--NAME/<etag>.lock) into
 * *fd; BUSY when another download holds it. */
static celer_status lock_take(const hub *h, const char *etag, int *fd, celer_error *e) {
    char dir[HF_PATH], path[HF_PATH];
    if (!fmt(dir, sizeof dir, "%s/.locks/%s", h->root, strrchr(h->dir, '/') + 1) ||
        !fmt(path, sizeof path, "%s/%s.lock", dir, etag))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "%s: path too long", h->root);
    if (!mkdir_p(dir) || (*fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0)
        return error_set(e, CELER_STATUS_IO, "%s: cannot create %s (%s)", h->repo, path,
                         strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        close(*fd);
        *fd = -1;
        return error_set(e, CELER_STATUS_BUSY,
                         "%s: another download of this file is under way (%s is locked); try "
                         "again once it ends",
                         h->repo, path);
    }
    return CELER_OK;
}

static celer_status write_error(const hub *h, const plan *p, const sink *s, const char *part,
                                celer_error *e) {
    if (s->err == ENOSPC || s->err == EDQUOT)
        return error_set(e, CELER_STATUS_IO,
                         "%s: %s: disk full after %lld of %lld bytes; the part is kept in %s: "
                         "free space and pull again to resume",
                         h->repo, p->f->path, (long long)s->have, (long long)p->size, part);
    return error_set(e, CELER_STATUS_IO, "%s: %s: cannot write %s (%s)", h->repo, p->f->path, part,
                     strerror(s->err));
}

/* Hashes the s->have bytes already in the file (a resumed download). */
static bool sha_prefix(sink *s) {
    char *buf = malloc(HF_HASH_CHUNK);
    if (!buf) return false;
    bool ok = true;
    for (int64_t off = 0; ok && off < s->have;) {
        const int64_t left = s->have - off;
        ssize_t n = pread(s->fd, buf, left < HF_HASH_CHUNK ? (size_t)left : HF_HASH_CHUNK, off);
        ok = n > 0 && EVP_DigestUpdate(s->sha, buf, (size_t)n);
        off += n > 0 ? n : 0;
    }
    free(buf);
    return ok;
}

static bool retryable(CURLcode cc) {
    return cc == CURLE_PARTIAL_FILE || cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR ||
           cc == CURLE_OPERATION_TIMEDOUT || cc == CURLE_GOT_NOTHING || cc == CURLE_HTTP2 ||
           cc == CURLE_HTTP2_STREAM;
}

/* GETs the rest of the file into s until it holds p->size bytes: each try resumes where the
 * last broke off (Range); a 200 starts over; a 416 starts over unless the file is whole. */
static celer_status blob_transfer(hub *h, const plan *p, sink *s, const char *part,
                                  celer_error *e) {
    char url[HF_URL], errbuf[CURL_ERROR_SIZE], range[48];
    const char *file = p->f->path;
    if (!resolve_url(h, file, url, sizeof url))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "%s: %s: URL too long", h->repo, file);
    for (int attempt = 1; s->have < s->size; attempt++) {
        if (attempt > HF_ATTEMPTS)
            return error_set(e, CELER_STATUS_NETWORK,
                             "%s: %s: the download broke off %d times; %lld of %lld bytes are "
                             "kept in %s for the next try",
                             h->repo, file, HF_ATTEMPTS, (long long)s->have, (long long)s->size,
                             part);
        reply r = {.sink = s};
        s->started = s->bad_range = s->too_long = false;
        snprintf(range, sizeof range, "%lld-", (long long)s->have);
        CURLcode cc = hub_perform(h, url, false, true, s->have > 0 ? range : NULL, 0, &r, errbuf);
        if (s->err) return write_error(h, p, s, part, e);
        if (s->too_long)
            return error_set(e, CELER_STATUS_BAD_FILE,
                             "%s: %s: the Hub sent more than the %lld bytes it announced", h->repo,
                             file, (long long)s->size);
        if (s->bad_range || r.code == 416) {
            if (!sink_restart(s)) return write_error(h, p, s, part, e);
            continue;
        }
        if (cc == CURLE_OK && (r.code == 200 || r.code == 206)) continue; /* whole, or short */
        if (cc == CURLE_OK && r.code < 500) return http_error(h, &r, file, e);
        if (cc != CURLE_OK && !retryable(cc)) return net_error(h, cc, errbuf, file, e);
        if (cc == CURLE_OK) sleep(1); /* a server error: a moment before the next try */
    }
    return CELER_OK;
}

/* The size and sha256 of the finished part; a mismatch removes it. */
static celer_status blob_check(const hub *h, const plan *p, sink *s, const char *part,
                               celer_error *e) {
    if (s->have != p->size) {
        unlink(part);
        return error_set(e, CELER_STATUS_BAD_FILE, "%s: %s: %lld bytes came, %lld expected",
                         h->repo, p->f->path, (long long)s->have, (long long)p->size);
    }
    if (!s->sha) return CELER_OK;
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    char hex[2 * EVP_MAX_MD_SIZE + 1];
    if (!EVP_DigestFinal_ex(s->sha, d, &n))
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: sha256 failed", h->repo);
    for (unsigned int i = 0; i < n; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    hex[2 * n] = 0;
    if (!strcmp(hex, p->sha256)) return CELER_OK;
    unlink(part);
    return error_set(e, CELER_STATUS_BAD_FILE,
                     "%s: %s: checksum mismatch (sha256 %s, expected %s); the download was "
                     "removed",
                     h->repo, p->f->path, hex, p->sha256);
}

/* blobs/<etag>, fetched unless it is there: written to blobs/<etag>.incomplete (resumed when
 * one is there), checked, then renamed. */
static celer_status blob_fetch(hub *h, const plan *p, celer_error *e) {
    char blobs[HF_PATH], blob[HF_PATH], part[HF_PATH];
    if (!fmt(blobs, sizeof blobs, "%s/blobs", h->dir) ||
        !fmt(blob, sizeof blob, "%s/%s", blobs, p->etag) ||
        !fmt(part, sizeof part, "%s.incomplete", blob))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "%s: path too long", h->dir);
    struct stat st;
    if (stat(blob, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == p->size) {
        if (h->progress) h->progress(h->user, p->f->path, p->size, p->size, true);
        return CELER_OK;
    }
    int lock = -1;
    sink s = {.fd = -1, .size = p->size, .file = p->f->path, .h = h};
    celer_status rc = lock_take(h, p->etag, &lock, e);
    if (rc != CELER_OK) return rc;
    if (stat(blob, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == p->size)
        goto out; /* another download finished it while we waited for the lock */
    if (!mkdir_p(blobs) || (s.fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0 ||
        fstat(s.fd, &st) != 0) {
        rc = error_set(e, CELER_STATUS_IO, "%s: cannot write %s (%s)", h->repo, part,
                       strerror(errno));
        goto out;
    }
    s.have = st.st_size <= p->size ? (int64_t)st.st_size : 0;
    if ((st.st_size > p->size && ftruncate(s.fd, 0) != 0) || lseek(s.fd, s.have, SEEK_SET) < 0) {
        s.err = errno;
        rc = write_error(h, p, &s, part, e);
        goto out;
    }
    if (*p->sha256 && (!(s.sha = EVP_MD_CTX_new()) ||
                       !EVP_DigestInit_ex(s.sha, EVP_sha256(), NULL) || !sha_prefix(&s))) {
        rc = error_set(e, CELER_STATUS_IO, "%s: cannot hash %s", h->repo, part);
        goto out;
    }
    rc = blob_transfer(h, p, &s, part, e);
    if (rc == CELER_OK) rc = blob_check(h, p, &s, part, e);
    if (rc == CELER_OK && fsync(s.fd) != 0) {
        s.err = errno;
        rc = write_error(h, p, &s, part, e);
    }
    if (rc == CELER_OK) {
        const int fd = s.fd;
        s.fd = -1;
        if (close(fd) != 0 || rename(part, blob) != 0)
            rc = error_set(e, CELER_STATUS_IO, "%s: cannot move %s into place (%s)", h->repo, part,
                           strerror(errno));
    }
out:
    if (s.fd >= 0) close(s.fd);
    EVP_MD_CTX_free(s.sha);
    if (lock >= 0) close(lock); /* releases the flock */
    if (rc == CELER_OK && h->progress) h->progress(h->user, p->f->path, p->size, p->size, true);
    return rc;
}

/* ==== The snapshot and the ref ==== */

/* dir/.base.celer-PID beside path, into out[cap]: a name to write before renaming. */
static bool tmp_beside(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    return fmt(out, cap, "%.*s/.%s.celer-%d", (int)(slash - path), path, slash + 1, (int)getpid());
}

/* snapshots/<commit>/<path> -> ../../blobs/<etag>, one ../ more per folder of path. */
static celer_status link_make(const hub *h, const plan *p, celer_error *e) {
    char link[HF_PATH], target[HF_PATH], tmp[HF_PATH], cur[HF_PATH];
    size_t k = 0;
    target[0] = 0;
    for (const char *c = p->f->path; *c; c++)
        if (*c == '/') k += (size_t)snprintf(target + k, sizeof target - k, "../");
    if (!fmt(link, sizeof link, "%s/snapshots/%s/%s", h->dir, h->commit, p->f->path) ||
        !fmt(target + k, sizeof target - k, "../../blobs/%s", p->etag) ||
        !tmp_beside(link, tmp, sizeof tmp))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "%s: path too long", h->dir);
    char *slash = strrchr(link, '/');
    *slash = 0;
    bool ok = mkdir_p(link);
    *slash = '/';
    ssize_t n = readlink(link, cur, sizeof cur - 1);
    if (ok && n >= 0) {
        cur[n] = 0;
        if (!strcmp(cur, target)) return CELER_OK;
    }
    unlink(tmp);
    if (!ok || symlink(target, tmp) != 0 || rename(tmp, link) != 0) {
        const int err = errno;
        unlink(tmp);
        return error_set(e, CELER_STATUS_IO, "%s: cannot link %s (%s)", h->repo, link,
                         strerror(err));
    }
    return CELER_OK;
}

/* refs/<rev> holding the commit (none when rev is the commit itself). */
static celer_status ref_write(const hub *h, celer_error *e) {
    char path[HF_PATH], tmp[HF_PATH], cur[64];
    if (!strcmp(h->rev, h->commit)) return CELER_OK;
    if (!fmt(path, sizeof path, "%s/refs/%s", h->dir, h->rev) || !tmp_beside(path, tmp, sizeof tmp))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "%s: path too long", h->dir);
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(cur, 1, sizeof cur - 1, f);
        fclose(f);
        cur[n] = 0;
        if (!strcmp(cur, h->commit)) return CELER_OK;
    }
    char *slash = strrchr(path, '/');
    *slash = 0;
    bool ok = mkdir_p(path);
    *slash = '/';
    f = ok ? fopen(tmp, "w") : NULL;
    ok = f && fputs(h->commit, f) >= 0;
    ok = f && fclose(f) == 0 && ok && rename(tmp, path) == 0;
    if (!ok) {
        const int err = errno;
        unlink(tmp);
        return error_set(e, CELER_STATUS_IO, "%s: cannot write %s (%s)", h->repo, path,
                         strerror(err));
    }
    return CELER_OK;
}

/* ==== Pulling a model ==== */

celer_status hf_download(const char *name, celer_pull_progress progress, void *user,
                         celer_error *e) {
    hub h = {.progress = progress, .user = user};
    if (!name ||
        !hf_name_parse(name, h.repo, sizeof h.repo, h.quant, sizeof h.quant, h.rev, sizeof h.rev))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "%s: not a model name ORG/NAME[:QUANT][@REV]", name ? name : "(null)");
    if (hf_offline())
        return error_set(e, CELER_STATUS_NOT_FOUND,
                         "%s: HF_HUB_OFFLINE is on, so nothing is downloaded", name);
    hf_repo_info info = {0};
    int *idx = NULL, n = 0;
    plan *plans = NULL;
    celer_status rc = hub_open(&h, e);
    if (rc == CELER_OK) rc = listing_get(&h, &info, e);
    if (rc == CELER_OK) {
        memcpy(h.commit, info.commit, sizeof h.commit);
        rc = hf_repo_select(&info, h.repo, h.quant, &idx, &n, e);
    }
    if (rc == CELER_OK && !(plans = calloc((size_t)(n ? n : 1), sizeof *plans)))
        rc = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; rc == CELER_OK && i < n; i++) {
        plans[i].f = &info.files[idx[i]];
        rc = meta_get(&h, &plans[i], e);
    }
    for (int i = 0; rc == CELER_OK && i < n; i++) rc = blob_fetch(&h, &plans[i], e);
    for (int i = 0; rc == CELER_OK && i < n; i++) rc = link_make(&h, &plans[i], e);
    if (rc == CELER_OK) rc = ref_write(&h, e);
    free(plans);
    free(idx);
    hf_repo_info_free(&info);
    hub_close(&h);
    return rc;
}

celer_status celer_model_pull(const char *name, celer_pull_progress progress, void *user,
                              char *path, size_t path_size, char *err, size_t err_size) {
    celer_error e = {{0}};
    celer_status s;
    if (!name) {
        s = error_set(&e, CELER_STATUS_INVALID_ARGUMENT, "no model name given");
    } else if (hf_offline()) {
        s = hf_cache_find(name, path, path_size, &e);
        const size_t k = strlen(e.msg);
        if (s == CELER_STATUS_NOT_FOUND)
            snprintf(e.msg + k, sizeof e.msg - k,
                     "; HF_HUB_OFFLINE is on, so nothing was downloaded");
    } else {
        s = hf_download(name, progress, user, &e);
        if (s == CELER_OK) s = hf_cache_find(name, path, path_size, &e);
    }
    error_copy(&e, err, err_size);
    return s;
}
