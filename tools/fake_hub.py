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
"""
import argparse
import hashlib
import http.server
import json
import os
import signal
import sys
import threading
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


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    repos = {}
    token = None

    def log_message(self, fmt, *args):
        if self.server.verbose:
            sys.stderr.write("fake_hub: " + fmt % args + "\n")

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
            siblings = []
            for p, f in repo.files.items():
                s = {"rfilename": p, "size": f["size"], "blobId": f["blob"]}
                if f["sha256"]:
                    s["lfs"] = {"sha256": f["sha256"], "size": f["size"], "pointerSize": 134}
                siblings.append(s)
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
            location = f"/lfs/{repo_id}/{f['sha256']}"
            headers = dict(common, Location=location, ETag=f'"{f["blob"]}"')
            headers["X-Linked-Etag"] = f'"{f["sha256"]}"'
            headers["X-Linked-Size"] = str(f["size"])
            return self.send(302, b"", headers, "text/plain")
        self.file(f, dict(common, ETag=f'"{f["blob"]}"'))

    def lfs(self, repo_id, sha256):
        repo = self.repo(repo_id)
        if repo is None:
            return
        for f in repo.files.values():
            if f["sha256"] == sha256:
                return self.file(f, {"X-Repo-Commit": repo.sha, "ETag": f'"{sha256}"'})
        self.error(404, "EntryNotFound", f"no LFS object {sha256}")

    def file(self, f, headers):
        """The file's bytes, or the part a Range header asks for."""
        with open(f["path"], "rb") as fh:
            data = fh.read()
        size = len(data)
        rng = self.headers.get("Range")
        if not rng:
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
        self.send(206, data[start : end + 1], headers, "application/octet-stream")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", help="directory of repositories: ROOT/ORG/NAME/...")
    ap.add_argument("--gated", action="append", default=[], help="ORG/NAME needing --token")
    ap.add_argument("--token", default="hf_fake_token", help="the token gated repos accept")
    ap.add_argument("--lifetime", type=float, default=600, help="stop after this many seconds")
    ap.add_argument("--verbose", action="store_true", help="log every request on stderr")
    args = ap.parse_args()
    Handler.repos = load_repos(args.root, set(args.gated))
    Handler.token = args.token
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.verbose = args.verbose
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2})
    thread.start()
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    stop.wait(args.lifetime)
    server.shutdown()
    thread.join()
    server.server_close()


if __name__ == "__main__":
    main()
