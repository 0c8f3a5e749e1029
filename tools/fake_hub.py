#!/usr/bin/env python3
"""A fake Hugging Face Hub for tests: serves the repositories under ROOT (ROOT/ORG/NAME/...)
on 127.0.0.1, on a free port it prints as its first line ("http://127.0.0.1:PORT").

It answers the routes huggingface_hub (tools/requirements-hub.txt) uses for
snapshot_download and hf_hub_download, with the headers it reads:
  GET  /api/models/ORG/NAME[/revision/REV]   sha, siblings [{rfilename, size, lfs}]
  GET  /api/models/ORG/NAME/tree/REV[/PATH]  [{type, oid, size, path, lfs}] (recursive=true)
  HEAD/GET /ORG/NAME/resolve/REV/PATH        X-Repo-Commit, ETag (the git blob sha1 of small
        files), Content-Length; LFS files (*.gguf, *.safetensors, *.bin, >= 10 MiB) answer
        302 with X-Linked-Etag (quoted sha256) and X-Linked-Size to
  HEAD/GET /lfs/ORG/NAME/SHA256              the bytes, with Range requests (206, 416)
Errors carry the Hub's X-Error-Code: 404 RepoNotFound, RevisionNotFound, EntryNotFound;
401 GatedRepo for a --gated repository without "Authorization: Bearer TOKEN".
The only revision is "main", or the commit sha, a digest of the files. Python 3 stdlib
only; it never reaches out, and it stops on SIGTERM, on SIGINT or after --lifetime seconds.

Options for tests of a downloader:
  --cdn                  a second server on another port plays the Hub's CDN: LFS files
                         redirect there (an absolute URL) and it serves /lfs/... without
                         asking for a token, as a signed URL would; its URL is printed as the
                         second line
  --log FILE             one JSON line per request: {"server": "hub"|"cdn", "method",
                         "path", "range" (the Range header or null), "authorization" (whether
                         one came; never its value)}, written before the answer
  --cut-after BYTES      the first GET of each LFS file sends that many bytes of its body, then
                         drops the connection; later GETs are whole
  --stall-after BYTES    the same, but the connection then stalls (sends nothing) for up to
                         60 s instead of closing
  --ignore-range         LFS files answer 200 with every byte even to a Range request
  --corrupt ORG/NAME/PATH  serve that LFS file with one byte changed (same size, same
                         advertised sha256); repeatable
  --sibling ORG/NAME:PATH  list PATH as one more file of ORG/NAME (a path no disk holds:
                         "../x.gguf", "/abs.gguf"); repeatable
  --bad-listing ORG/NAME   answer that repository's model info with a body that is not JSON
"""
import argparse
import hashlib
import http.server
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.parse

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".npy")
LFS_MIN_SIZE = 10 << 20


class Repo:
    """The files of ROOT/ORG/NAME, hashed once at start."""

    def __init__(self, repo_id, path, gated):
        self.repo_id, self.gated, self.files = repo_id, gated, {}
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, path).replace(os.sep, "/")
                with open(full, "rb") as f:
                    data = f.read()
                lfs = rel.endswith(LFS_SUFFIXES) or len(data) >= LFS_MIN_SIZE
                blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                self.files[rel] = {
                    "path": full,
                    "size": len(data),
                    "blob": blob,
                    "sha256": hashlib.sha256(data).hexdigest() if lfs else None,
                }
        listing = "".join(f"{p} {f['blob']}\n" for p, f in sorted(self.files.items()))
        self.sha = hashlib.sha1(f"{repo_id}\n{listing}".encode()).hexdigest()

    def lfs_info(self, f):
        return {"sha256": f["sha256"], "size": f["size"]} if f["sha256"] else None


def load_repos(root, gated):
    repos = {}
    for org in sorted(os.listdir(root)):
        if not os.path.isdir(os.path.join(root, org)):
            continue
        for name in sorted(os.listdir(os.path.join(root, org))):
            if os.path.isdir(os.path.join(root, org, name)):
                repo_id = f"{org}/{name}"
                repos[repo_id] = Repo(repo_id, os.path.join(root, org, name), repo_id in gated)
    return repos


class Options:
    """What the command line asked for, shared by both servers' handlers."""

    cdn_url = None
    log = None
    log_lock = threading.Lock()
    cut_after = None
    stall_after = None
    ignore_range = False
    corrupt = set()  # "ORG/NAME/PATH"
    siblings = {}  # repo id -> [extra paths]
    bad_listing = set()
    cut_done = set()  # sha256 of LFS files whose first GET was cut
    cut_lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    repos = {}
    token = None
    server_name = "hub"

    def log_message(self, fmt, *args):
        if self.server.verbose:
            sys.stderr.write(f"fake_hub ({self.server_name}): " + fmt % args + "\n")

    def log_request_json(self):
        if Options.log is None:
            return
        entry = {
            "server": self.server_name,
            "method": self.command,
            "path": self.path,
            "range": self.headers.get("Range"),
            "authorization": self.headers.get("Authorization") is not None,
        }
        with Options.log_lock:
            Options.log.write(json.dumps(entry) + "\n")
            Options.log.flush()

    # ==== Responses ====

    def send(self, code, body=b"", headers=None, content_type="application/json"):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, code, error_code, message):
        body = json.dumps({"error": message}).encode()
        self.send(code, body, {"X-Error-Code": error_code, "X-Error-Message": message})

    def json(self, value, headers=None):
        self.send(200, json.dumps(value).encode(), headers)

    # ==== Routing ====

    def do_HEAD(self):
        self.route()

    def do_GET(self):
        self.route()

    def route(self):
        self.log_request_json()
        url = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(p) for p in url.path.split("/")[1:]]
        query = urllib.parse.parse_qs(url.query)
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self.api(parts[2] + "/" + parts[3], parts[4:], query)
        if parts[:1] == ["lfs"] and len(parts) == 4:
            return self.lfs(parts[1] + "/" + parts[2], parts[3])
        if len(parts) >= 5 and parts[2] == "resolve":
            return self.resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]))
        self.error(404, "EntryNotFound", f"no route {url.path}")

    def repo(self, repo_id):
        """The repo, or None after answering 404/401."""
        repo = self.repos.get(repo_id)
        if repo is None:
            self.error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.")
            return None
        if repo.gated and self.headers.get("Authorization") != f"Bearer {self.token}":
            self.error(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in.",
            )
            return None
        return repo

    def revision_ok(self, repo, rev):
        if rev in ("main", repo.sha):
            return True
        self.error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return False

    def api(self, repo_id, rest, query):
        repo = self.repo(repo_id)
        if repo is None:
            return
        if not rest or (len(rest) == 2 and rest[0] == "revision"):
            if rest and not self.revision_ok(repo, rest[1]):
                return
            if repo_id in Options.bad_listing:
                return self.send(200, b"<html>Service Unavailable</html>", content_type="text/html")
            siblings = []
            for p, f in repo.files.items():
                s = {"rfilename": p, "size": f["size"], "blobId": f["blob"]}
                if f["sha256"]:
                    s["lfs"] = {"sha256": f["sha256"], "size": f["size"], "pointerSize": 134}
                siblings.append(s)
            siblings += [{"rfilename": p, "size": 4} for p in Options.siblings.get(repo_id, [])]
            return self.json(
                {
                    "_id": repo.sha[:24],
                    "id": repo_id,
                    "modelId": repo_id,
                    "sha": repo.sha,
                    "private": False,
                    "gated": "auto" if repo.gated else False,
                    "disabled": False,
                    "tags": [],
                    "siblings": siblings,
                }
            )
        if len(rest) >= 2 and rest[0] == "tree":
            if not self.revision_ok(repo, rest[1]):
                return
            prefix = "/".join(rest[2:])
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            return self.json(self.tree(repo, prefix, recursive))
        self.error(404, "EntryNotFound", f"no route {self.path}")

    def tree(self, repo, prefix, recursive):
        base = prefix + "/" if prefix else ""
        entries, dirs = [], set()
        for p, f in repo.files.items():
            if not p.startswith(base):
                continue
            rest = p[len(base) :].split("/")
            for i in range(1, len(rest) if recursive else min(len(rest), 2)):
                dirs.add(base + "/".join(rest[:i]))
            if len(rest) == 1 or recursive:
                e = {"type": "file", "oid": f["blob"], "size": f["size"], "path": p}
                if f["sha256"]:
                    e["lfs"] = {"oid": f["sha256"], "size": f["size"], "pointerSize": 134}
                entries.append(e)
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in dirs]
        return sorted(entries, key=lambda e: e["path"])

    def resolve(self, repo_id, rev, path):
        repo = self.repo(repo_id)
        if repo is None or not self.revision_ok(repo, rev):
            return
        f = repo.files.get(path)
        if f is None:
            return self.error(404, "EntryNotFound", f"{path} does not exist at {rev}")
        common = {"X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes"}
        if f["sha256"]:
            location = f"{Options.cdn_url or ''}/lfs/{repo_id}/{f['sha256']}"
            headers = dict(common, Location=location, ETag=f'"{f["blob"]}"')
            headers["X-Linked-Etag"] = f'"{f["sha256"]}"'
            headers["X-Linked-Size"] = str(f["size"])
            return self.send(302, b"", headers, "text/plain")
        self.file(f, dict(common, ETag=f'"{f["blob"]}"'))

    def lfs(self, repo_id, sha256):
        repo = self.repo(repo_id)
        if repo is None:
            return
        self.lfs_object(repo, sha256)

    def lfs_object(self, repo, sha256):
        for p, f in repo.files.items():
            if f["sha256"] == sha256:
                bad = f"{repo.repo_id}/{p}" in Options.corrupt
                return self.file(f, {"X-Repo-Commit": repo.sha, "ETag": f'"{sha256}"'}, lfs=True, corrupt=bad)
        self.error(404, "EntryNotFound", f"no LFS object {sha256}")

    def send_cut(self, code, body, headers, content_type, key):
        """send(), except that the first GET of key sends only --cut-after (or --stall-after)
        bytes of the body and then drops (or stalls) the connection. True if it did."""
        limit = Options.cut_after if Options.cut_after is not None else Options.stall_after
        if limit is None or self.command != "GET" or len(body) <= limit:
            return False
        with Options.cut_lock:
            if key in Options.cut_done:
                return False
            Options.cut_done.add(key)
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[:limit])
        self.wfile.flush()
        if Options.cut_after is None:  # stall: the client's low-speed limit must end it
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.2)
                try:  # a closed peer reads as EOF
                    self.connection.setblocking(False)
                    if self.connection.recv(1, socket.MSG_PEEK) == b"":
                        break
                except BlockingIOError:
                    pass
                except OSError:
                    break
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return True

    def file(self, f, headers, lfs=False, corrupt=False):
        """The file's bytes, or the part a Range header asks for."""
        with open(f["path"], "rb") as fh:
            data = fh.read()
        if corrupt:
            data = bytearray(data)
            data[len(data) // 2] ^= 0xFF
            data = bytes(data)
        size = len(data)
        rng = self.headers.get("Range")
        if lfs and Options.ignore_range:
            rng = None
        if not rng:
            if lfs and self.send_cut(200, data, headers, "application/octet-stream", f["sha256"]):
                return
            return self.send(200, data, headers, "application/octet-stream")
        try:
            unit, spec = rng.split("=", 1)
            first, last = spec.split("-", 1)
            if unit.strip() != "bytes" or "," in spec:
                raise ValueError
            if first == "":  # bytes=-N: the last N bytes
                start, end = max(size - int(last), 0), size - 1
            else:
                start, end = int(first), (int(last) if last else size - 1)
        except ValueError:
            start, end = size, size
        if start >= size or start > end:
            headers = dict(headers, **{"Content-Range": f"bytes */{size}"})
            return self.send(416, b"", headers, "text/plain")
        end = min(end, size - 1)
        headers = dict(headers, **{"Content-Range": f"bytes {start}-{end}/{size}"})
        if lfs and self.send_cut(206, data[start : end + 1], headers, "application/octet-stream", f["sha256"]):
            return
        self.send(206, data[start : end + 1], headers, "application/octet-stream")


class CdnHandler(Handler):
    """The CDN of --cdn: LFS objects only, no token asked (the redirect is the permission)."""

    server_name = "cdn"

    def route(self):
        self.log_request_json()
        parts = [urllib.parse.unquote(p) for p in urllib.parse.urlsplit(self.path).path.split("/")[1:]]
        repo = self.repos.get(parts[1] + "/" + parts[2]) if len(parts) == 4 and parts[0] == "lfs" else None
        if repo is None:
            return self.error(404, "EntryNotFound", f"no route {self.path}")
        self.lfs_object(repo, parts[3])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", help="directory of repositories: ROOT/ORG/NAME/...")
    ap.add_argument("--gated", action="append", default=[], help="ORG/NAME needing --token")
    ap.add_argument("--token", default="hf_fake_token", help="the token gated repos accept")
    ap.add_argument("--lifetime", type=float, default=600, help="stop after this many seconds")
    ap.add_argument("--verbose", action="store_true", help="log every request on stderr")
    ap.add_argument("--cdn", action="store_true", help="redirect LFS files to a second server")
    ap.add_argument("--log", help="one JSON line per request into this file")
    cut = ap.add_mutually_exclusive_group()
    cut.add_argument("--cut-after", type=int, help="cut each LFS file's first GET after BYTES")
    cut.add_argument("--stall-after", type=int, help="stall each LFS file's first GET after BYTES")
    ap.add_argument("--ignore-range", action="store_true", help="answer Range requests with 200")
    ap.add_argument("--corrupt", action="append", default=[], help="ORG/NAME/PATH served wrong")
    ap.add_argument("--sibling", action="append", default=[], help="ORG/NAME:PATH listed in addition")
    ap.add_argument("--bad-listing", action="append", default=[], help="ORG/NAME whose model info is no JSON")
    args = ap.parse_args()
    Handler.repos = load_repos(args.root, set(args.gated))
    Handler.token = args.token
    Options.log = open(args.log, "a") if args.log else None
    Options.cut_after, Options.stall_after = args.cut_after, args.stall_after
    Options.ignore_range = args.ignore_range
    Options.corrupt = set(args.corrupt)
    Options.bad_listing = set(args.bad_listing)
    for s in args.sibling:
        repo_id, path = s.split(":", 1)
        Options.siblings.setdefault(repo_id, []).append(path)
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)]
    if args.cdn:
        servers.append(http.server.ThreadingHTTPServer(("127.0.0.1", 0), CdnHandler))
        Options.cdn_url = f"http://127.0.0.1:{servers[1].server_address[1]}"
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threads = []
    for server in servers:
        server.daemon_threads = True
        server.verbose = args.verbose
        threads.append(threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}))
        threads[-1].start()
    print(f"http://127.0.0.1:{servers[0].server_address[1]}", flush=True)
    if args.cdn:
        print(Options.cdn_url, flush=True)
    stop.wait(args.lifetime)
    for server, thread in zip(servers, threads):
        server.shutdown()
        thread.join()
        server.server_close()
    if Options.log:
        Options.log.close()


if __name__ == "__main__":
    main()
