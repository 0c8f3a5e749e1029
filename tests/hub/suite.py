"""Models by name end to end (run by tests/hub/run.sh with build/hub-venv's Python).

Starts tools/fake_hub.py on 127.0.0.1 with repositories made from committed fixtures (a
GGUF repo of two quants plus a projector, one of two quants neither Q4_K_M, an MLX-layout
repo, a gated repo, a split GGUF in a folder, and repos whose listing is bad), its LFS
files redirected to a second port as the Hub's CDN, and every request logged. Then:
  - fills a temporary Hugging Face cache with the pinned huggingface_hub's snapshot_download
    and checks what `celer` makes of ORG/NAME[:QUANT] there and `celer ls`, with no request
    to the hub for a cached name;
  - `celer pull` (and -m NAME) into fresh caches: the files a name picks, the layout
    huggingface_hub reads back with local_files_only=True, the token (never to the CDN,
    never printed), the errors (401 gated, 404 repo/revision/file, bad listings, a port
    nothing listens on, offline mode), resuming a cut or stalled transfer with Range, a
    200 answer to a Range restarting the file, a corrupt file refused, a full disk (a
    small tmpfs, as root; skipped where it cannot be mounted), a progress line on a tty.
More hubs are started for the fault options (--cut-after, --stall-after, --ignore-range,
--corrupt). Every hub is stopped at the end; every wait is bounded.
Last line: "test_hub: N passed, M failed, K skipped".
"""
import hashlib
import json
import os
import pty
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
CELER = os.path.abspath(os.environ.get("CELER_BIN", os.path.join(ROOT, BUILD, "celer")))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
TOKEN = "hf_fake_token_for_tests"
GGUF = os.path.join(FIXTURES, "llama-tied-gguf-q8_0", "model.gguf")
passed = failed = skipped = 0


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {what}" + (f": {detail}" if detail else ""), flush=True)
    return ok


def skip(what, why):
    global skipped
    skipped += 1
    print(f"SKIP {what}: {why}", flush=True)


def make_repos(repos):
    gguf = GGUF
    mlx = os.path.join(FIXTURES, "llama-tied-q4g64")
    with open(gguf, "rb") as f:
        data = f.read()
    half = len(data) // 2
    layout = {
        "org/tiny-GGUF": {
            "tiny-Q4_K_M.gguf": gguf,
            "tiny-Q8_0.gguf": gguf,
            "mmproj-tiny-F16.gguf": gguf,
            "README.md": None,
        },
        "org/tiny-multi": {"tiny-Q8_0.gguf": gguf, "tiny-F16.gguf": gguf},
        "mlx-community/tiny-4bit": dict(
            {n: os.path.join(mlx, n) for n in ("config.json", "model.safetensors", "model.safetensors.index.json")},
            **{"chat_template.jinja": b"{{ messages }}", "pytorch_model.bin": b"weights celer never reads",
               "README.md": None}),
        "org/gated": {"README.md": None, "gated-Q8_0.gguf": gguf},
        # a split GGUF in a folder, another quant, a projector
        "org/split-GGUF": {
            "Q8_0/tiny-Q8_0-00001-of-00002.gguf": data[:half],
            "Q8_0/tiny-Q8_0-00002-of-00002.gguf": data[half:],
            "F16/tiny-F16.gguf": gguf,
            "mmproj-F16.gguf": gguf,
        },
        # repos the hub lists wrongly (--sibling, --bad-listing): never snapshot_download'ed
        "org/ghost": {"a-Q8_0.gguf": gguf},
        "org/evil": {"a-Q8_0.gguf": gguf},
        "org/badjson": {"a-Q8_0.gguf": gguf},
    }
    for repo, files in layout.items():
        for name, src in files.items():
            dst = os.path.join(repos, repo, name)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if isinstance(src, bytes):
                with open(dst, "wb") as f:
                    f.write(src)
            elif src:
                shutil.copyfile(src, dst)
            else:
                with open(dst, "w") as f:
                    f.write(f"# {repo}\n")


class Hub:
    """One fake hub process with --cdn and a request log (--log), plus any other options."""

    def __init__(self, repos, tmp, name, *extra):
        self.log_path = os.path.join(tmp, f"{name}.requests")
        self.stderr = open(os.path.join(tmp, f"{name}.log"), "w")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tools", "fake_hub.py"), repos, "--gated", "org/gated",
             "--token", TOKEN, "--lifetime", "280", "--verbose", "--cdn", "--log", self.log_path, *extra],
            stdout=subprocess.PIPE, stderr=self.stderr)
        got, deadline = b"", time.monotonic() + 30
        while got.count(b"\n") < 2 and time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(deadline - time.monotonic(), 0))
            chunk = os.read(self.proc.stdout.fileno(), 4096) if ready else b""
            if not chunk:
                break
            got += chunk
        urls = got.decode().split()
        if len(urls) < 2 or not all(u.startswith("http://127.0.0.1:") for u in urls):
            self.stop()
            raise SystemExit(f"test_hub: the fake hub did not start (printed {urls!r})\ntest_hub: 0 passed, 1 failed")
        self.url, self.cdn = urls
        self.n = 0

    def requests(self):
        try:
            with open(self.log_path) as f:
                return [json.loads(l) for l in f if l.strip()]
        except FileNotFoundError:
            return []

    def mark(self):
        self.n = len(self.requests())

    def since(self):
        """The requests since the last mark()."""
        return self.requests()[self.n:]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.stderr.close()


def celer(args, env, cwd=None):
    r = subprocess.run([CELER] + args, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def model_line(out):
    return next((l.split(None, 1)[1] for l in out.splitlines() if l.startswith("model:")), "")


def check_fails(what, args, env, needles):
    rc, out, err = celer(args, env)
    lines = err.strip().splitlines()
    check(rc != 0, f"{what}: non-zero exit", f"exit {rc}")
    check(len(lines) == 1, f"{what}: one line", repr(err))
    for n in needles:
        check(n in err, f"{what}: names {n!r}", err.strip())


def main():
    tmp = tempfile.mkdtemp(prefix="celer-hub-")
    repos, cache, home = (os.path.join(tmp, d) for d in ("repos", "cache", "home"))
    make_repos(repos)
    # the hub's listing lies about three repos (see make_repos)
    hub = Hub(repos, tmp, "hub", "--sibling", "org/ghost:ghost-Q4_K_M.gguf",
              "--sibling", "org/evil:../../evil-Q4_K_M.gguf", "--bad-listing", "org/badjson")
    hubs = [hub]
    try:
        for k in [k for k in os.environ if k.startswith("HF_") or k.lower().endswith("_proxy")]:
            del os.environ[k]
        os.environ.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=cache, HF_HOME=home, HF_HUB_DISABLE_TELEMETRY="1",
                          HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_XET="1", NO_PROXY="127.0.0.1",
                          no_proxy="127.0.0.1")
        run(hub, tmp, cache)
        pull_tests(hub, repos, tmp, hubs)
    finally:
        for h in hubs:
            h.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"test_hub: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


def check_http(url):
    """What a downloader reads besides huggingface_hub's path: Range and the error headers."""
    import urllib.error
    import urllib.request

    with open(os.path.join(FIXTURES, "llama-tied-gguf-q8_0", "model.gguf"), "rb") as f:
        data = f.read()
    req = urllib.request.Request(f"{url}/org/tiny-GGUF/resolve/main/tiny-Q8_0.gguf", headers={"Range": "bytes=4-11"})
    with urllib.request.urlopen(req, timeout=30) as r:  # follows the 302 to the LFS route
        check(r.status == 206 and r.read() == data[4:12] and
              r.headers["Content-Range"] == f"bytes 4-11/{len(data)}", "Range request: 206 with the bytes")
    for path, headers, code, error_code in (
            ("/org/tiny-GGUF/resolve/main/nope.gguf", {}, 404, "EntryNotFound"),
            ("/api/models/org/nope", {}, 404, "RepoNotFound"),
            ("/api/models/org/tiny-GGUF/revision/v9", {}, 404, "RevisionNotFound"),
            ("/org/gated/resolve/main/README.md", {"Authorization": "Bearer wrong"}, 401, "GatedRepo"),
            ("/org/tiny-GGUF/resolve/main/tiny-Q8_0.gguf", {"Range": f"bytes={len(data)}-"}, 416, None)):
        try:
            urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=30)
            check(False, f"{path}: {code}", "answered 2xx")
        except urllib.error.HTTPError as e:
            check(e.code == code and e.headers.get("X-Error-Code") == error_code, f"{path}: {code} {error_code}",
                  f"{e.code} {e.headers.get('X-Error-Code')}")


def run(hub, tmp, cache):
    url = hub.url
    import huggingface_hub
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    snaps = {}
    for repo in ("org/tiny-GGUF", "org/tiny-multi", "mlx-community/tiny-4bit"):
        snaps[repo] = snapshot_download(repo)
        check(snaps[repo].startswith(cache), f"snapshot_download {repo} into the cache", snaps[repo])
    # the gated repo: refused without a token, served with HF_TOKEN
    try:
        snapshot_download("org/gated")
        check(False, "gated repo without a token is refused")
    except GatedRepoError:
        check(True, "gated")
    os.environ["HF_TOKEN"] = TOKEN
    try:
        p = snapshot_download("org/gated")
        check(os.path.exists(os.path.join(p, "README.md")), "gated repo with HF_TOKEN", p)
    except Exception as e:  # noqa: BLE001 - any failure here is the test's failure
        check(False, "gated repo with HF_TOKEN", repr(e))
    del os.environ["HF_TOKEN"]
    try:
        snapshot_download("org/nope")
        check(False, "a missing repo is refused")
    except RepositoryNotFoundError:
        check(True, "missing")
    check_http(url)
    f = huggingface_hub.hf_hub_download("org/tiny-GGUF", "tiny-Q8_0.gguf", cache_dir=os.path.join(tmp, "c2"))
    check(os.path.getsize(f) == os.path.getsize(os.path.join(FIXTURES, "llama-tied-gguf-q8_0", "model.gguf")),
          "hf_hub_download of an LFS file", f)

    hub.mark()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HUB_CACHE=cache, HF_ENDPOINT=url)
    gguf = snaps["org/tiny-GGUF"]

    # the file a name picks
    for name, want in (("org/tiny-GGUF", "tiny-Q4_K_M.gguf"), ("org/tiny-GGUF:Q8_0", "tiny-Q8_0.gguf"),
                       ("org/tiny-GGUF:q8_0", "tiny-Q8_0.gguf"), ("org/tiny-GGUF:Q4_K_M", "tiny-Q4_K_M.gguf"),
                       ("org/tiny-multi:F16", "tiny-F16.gguf")):
        rc, out, err = celer(["inspect", "-m", name], env)
        got = model_line(out)
        check(rc == 0 and got.endswith("/" + want), f"inspect -m {name} opens {want}", got or err.strip())
    rc, out, err = celer(["inspect", "-m", "mlx-community/tiny-4bit"], env)
    check(rc == 0 and model_line(out) == snaps["mlx-community/tiny-4bit"] and "4-bit" in out,
          "inspect -m an MLX repo opens its snapshot", out + err)
    rc, out, err = celer(["generate", "-m", "org/tiny-GGUF:Q8_0", "--ids", "1,2", "-n", "3", "--temp", "0",
                          "--print-ids"], env)
    rc2, out2, _ = celer(["generate", "-m", os.path.join(gguf, "tiny-Q8_0.gguf"), "--ids", "1,2", "-n", "3",
                          "--temp", "0", "--print-ids"], env)
    check(rc == 0 and out == out2 and out.strip(), "generate -m NAME:QUANT equals the file's output", out + err)

    # errors: one line, non-zero
    check_fails("no default quant", ["inspect", "-m", "org/tiny-multi"], env,
                ["org/tiny-multi", "none is Q4_K_M", "Q8_0", "F16"])
    check_fails("ambiguous quant", ["inspect", "-m", "org/tiny-multi:tiny"], env, ["ambiguous"])
    offline = dict(env, HF_HUB_OFFLINE="1")
    check_fails("missing repo offline", ["generate", "-m", "org/missing:Q8_0", "--ids", "1"], offline,
                ["org/missing", "not in the Hugging Face cache", cache])
    rc, out, err = celer(["inspect", "-m", "org/tiny-GGUF"], offline)
    check(rc == 0 and model_line(out).endswith("/tiny-Q4_K_M.gguf"), "HF_HUB_OFFLINE=1 resolves from the cache",
          err)

    # a local path wins over the name
    local = os.path.join(tmp, "cwd")
    shutil.copytree(os.path.join(FIXTURES, "llama-tied-q4g64"), os.path.join(local, "org", "tiny-GGUF"))
    rc, out, err = celer(["inspect", "-m", "org/tiny-GGUF"], env, cwd=local)
    check(rc == 0 and model_line(out) == "org/tiny-GGUF", "a local path wins over a name", out + err)

    # HF_HOME/hub when HF_HUB_CACHE is unset; HOME/.cache/huggingface/hub after that
    hf_home = os.path.join(tmp, "hfhome")
    os.makedirs(hf_home)
    os.symlink(cache, os.path.join(hf_home, "hub"))
    env_home = {k: v for k, v in env.items() if k != "HF_HUB_CACHE"}
    rc, out, err = celer(["inspect", "-m", "org/tiny-GGUF:Q8_0"], dict(env_home, HF_HOME=hf_home))
    check(rc == 0 and model_line(out).endswith("/tiny-Q8_0.gguf"), "HF_HOME/hub fallback", err)
    user = os.path.join(tmp, "user")
    os.makedirs(os.path.join(user, ".cache", "huggingface"))
    os.symlink(cache, os.path.join(user, ".cache", "huggingface", "hub"))
    rc, out, err = celer(["inspect", "-m", "org/tiny-GGUF:Q8_0"], dict(env_home, HOME=user))
    check(rc == 0 and model_line(out).endswith("/tiny-Q8_0.gguf"), "~/.cache/huggingface/hub fallback", err)

    # celer ls
    rc, out, err = celer(["ls"], env)
    lines = out.splitlines()
    names = [l.split()[0] for l in lines]
    check(rc == 0 and names == ["mlx-community/tiny-4bit", "org/gated", "org/tiny-GGUF", "org/tiny-multi"],
          "ls lists the cached repos sorted", out + err)
    for repo, fmt in (("org/tiny-GGUF", "gguf: Q4_K_M (tiny-Q4_K_M.gguf), Q8_0 (tiny-Q8_0.gguf)"),
                      ("org/tiny-multi", "gguf: F16 (tiny-F16.gguf), Q8_0 (tiny-Q8_0.gguf)"),
                      ("mlx-community/tiny-4bit", "mlx 4-bit")):
        line = next((l for l in lines if l.split()[0] == repo), "")
        commit = os.path.basename(snaps[repo])
        check(line.split()[1:2] == [commit[:8]] and line.endswith(fmt), f"ls: {repo}", line)
    rc, out, err = celer(["ls"], dict(env, HF_HUB_CACHE=os.path.join(tmp, "empty")))
    check(rc == 0 and out == "" and err == "", "ls of an absent cache prints nothing", out + err)
    check_fails("ls of a cache that is a file", ["ls"], dict(env, HF_HUB_CACHE=hub.log_path), [hub.log_path])

    after = hub.since()
    check(not after, "celer made no request to the hub", repr(after[:3]))

    # a name the cache lacks is asked of the hub (-m downloads it); these the hub lacks too
    check_fails("an absent quant", ["inspect", "-m", "org/tiny-GGUF:Q5_K_M"], env,
                ["Q5_K_M", "Q4_K_M, Q8_0"])
    check_fails("missing repo", ["inspect", "-m", "org/missing"], env,
                ["org/missing", "not in the Hugging Face cache", cache, "RepoNotFound"])
    asked = [r["path"] for r in hub.since()]
    check(any("/api/models/org/missing/" in p for p in asked) and any("/api/models/org/tiny-GGUF/" in p for p in asked),
          "a name not in the cache is asked of the hub", repr(asked))
    rc, out, err = celer(["ls"], env)
    check(rc == 0 and [l.split()[0] for l in out.splitlines()] == names, "a failed pull adds nothing to the cache",
          out + err)



# ==== celer pull ====


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def pull_env(hub, cache, tmp, **kw):
    """celer's environment for a pull into cache from hub: no token anywhere (HF_HOME empty)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    home = os.path.join(tmp, "empty-home")
    os.makedirs(home, exist_ok=True)
    env.update(HF_HUB_CACHE=cache, HF_ENDPOINT=hub.url, HF_HOME=home)
    env.update(kw)
    return env


def repo_dir(cache, repo):
    return os.path.join(cache, "models--" + repo.replace("/", "--"))


def layout(cache, repo):
    """{path below the snapshot: link target} of every snapshot of repo, and its blobs."""
    d = repo_dir(cache, repo)
    links = {}
    for dirpath, _, files in os.walk(os.path.join(d, "snapshots")):
        for n in files:
            full = os.path.join(dirpath, n)
            links[os.path.relpath(full, os.path.join(d, "snapshots"))] = os.readlink(full) if os.path.islink(full) else None
    blobs = sorted(os.listdir(os.path.join(d, "blobs"))) if os.path.isdir(os.path.join(d, "blobs")) else []
    return links, blobs


def pull(name, env):
    return celer(["pull", name], env)


def check_pull_fails(what, name, env, needles, secret=None):
    rc, out, err = pull(name, env)
    lines = err.strip().splitlines()
    check(rc != 0 and out == "", f"{what}: non-zero exit, nothing on stdout", f"exit {rc}: {out!r}")
    check(len(lines) == 1, f"{what}: one line", repr(err))
    for n in needles:
        check(n in err, f"{what}: names {n!r}", err.strip())
    if secret:
        check(secret not in out + err, f"{what}: the token is not printed", err.strip())
    return err


def pull_tests(hub, repos, tmp, hubs):
    from huggingface_hub import hf_hub_download, snapshot_download

    gguf_sha = sha256_of(GGUF)
    c1 = os.path.join(tmp, "pull1")
    env = pull_env(hub, c1, tmp)

    # a GGUF repo by quant: one file, from the CDN, in huggingface_hub's layout
    hub.mark()
    rc, out, err = pull("org/tiny-GGUF:Q8_0", env)
    path = out.strip()
    commit = os.path.basename(os.path.dirname(path))
    d = repo_dir(c1, "org/tiny-GGUF")
    check(rc == 0 and path == os.path.join(d, "snapshots", commit, "tiny-Q8_0.gguf") and len(commit) == 40,
          "pull ORG/NAME:QUANT prints the snapshot path", out + err)
    check(err == "", "pull is quiet when stderr is no terminal", err)
    links, blobs = layout(c1, "org/tiny-GGUF")
    check(links == {f"{commit}/tiny-Q8_0.gguf": f"../../blobs/{gguf_sha}"} and blobs == [gguf_sha],
          "pull writes blobs/<sha256> and one relative link", repr((links, blobs)))
    check(os.path.isfile(path) and sha256_of(path) == gguf_sha, "the pulled file has the right bytes")
    with open(os.path.join(d, "refs", "main")) as f:
        check(f.read() == commit, "refs/main holds the commit, no newline")
    reqs = hub.since()
    cdn = [r for r in reqs if r["server"] == "cdn"]
    check(len(cdn) == 1 and cdn[0]["path"].endswith("/" + gguf_sha) and cdn[0]["method"] == "GET",
          "the LFS file came from the second host (the redirect was followed)", repr(reqs))
    check(not any("mmproj" in r["path"] or "README" in r["path"] or "Q4_K_M" in r["path"] for r in reqs),
          "pull asks for nothing but the picked quant", repr(reqs))

    # the default quant (Q4_K_M): same bytes, so no second download of the blob
    hub.mark()
    rc, out, err = pull("org/tiny-GGUF", env)
    check(rc == 0 and out.strip().endswith(f"/{commit}/tiny-Q4_K_M.gguf"), "pull ORG/NAME picks Q4_K_M", out + err)
    check(not [r for r in hub.since() if r["server"] == "cdn" or r["method"] == "GET" and "/resolve/" in r["path"]],
          "a blob already cached is not fetched again", repr(hub.since()))

    # an MLX repo: config, weights, json and template files; no .bin, no README
    rc, out, err = pull("mlx-community/tiny-4bit", env)
    mlx_snap = out.strip()
    files = sorted(os.listdir(mlx_snap)) if rc == 0 and os.path.isdir(mlx_snap) else []
    check(files == ["chat_template.jinja", "config.json", "model.safetensors", "model.safetensors.index.json"],
          "pull of an MLX repo fetches its checkpoint files only", repr(files) + err)
    rc, out, err = celer(["inspect", "-m", "mlx-community/tiny-4bit"], dict(env, HF_HUB_OFFLINE="1"))
    check(rc == 0 and model_line(out) == mlx_snap and "4-bit" in out, "inspect opens the pulled MLX repo", out + err)

    # a split GGUF in a folder: every part, links one ../ deeper
    rc, out, err = pull("org/split-GGUF:Q8_0", env)
    check(rc == 0 and out.strip().endswith("/Q8_0/tiny-Q8_0-00001-of-00002.gguf"), "pull of a split GGUF",
          out + err)
    links, blobs = layout(c1, "org/split-GGUF")
    targets = sorted(v for v in links.values())
    check(sorted(os.path.basename(k) for k in links) == ["tiny-Q8_0-00001-of-00002.gguf",
                                                          "tiny-Q8_0-00002-of-00002.gguf"]
          and all(t.startswith("../../../blobs/") for t in targets) and len(blobs) == 2,
          "every part of the split, linked ../../../blobs/<sha256>", repr(links))
    check_pull_fails("split repo without a quant", "org/split-GGUF", env, ["none is Q4_K_M", "F16", "Q8_0"])

    # a commit as the revision: no ref written, resolved offline
    rc, out, err = pull(f"org/tiny-multi:F16@{commit}", env)
    check(rc != 0 and "no revision" in err, "another repo's commit is no revision of this one", out + err)
    rc, out, err = pull("org/tiny-multi:F16", env)
    multi_commit = os.path.basename(os.path.dirname(out.strip()))
    c_rev = os.path.join(tmp, "pull-rev")
    rc, out, err = pull(f"org/tiny-multi:F16@{multi_commit}", pull_env(hub, c_rev, tmp))
    check(rc == 0 and out.strip().endswith(f"/{multi_commit}/tiny-F16.gguf") and
          not os.path.exists(os.path.join(repo_dir(c_rev, "org/tiny-multi"), "refs")),
          "pull NAME:QUANT@COMMIT writes no ref", out + err)
    rc, out, err = celer(["inspect", "-m", f"org/tiny-multi:F16@{multi_commit}"],
                         pull_env(hub, c_rev, tmp, HF_HUB_OFFLINE="1"))
    check(rc == 0 and model_line(out).endswith("/tiny-F16.gguf"), "-m NAME@COMMIT resolves offline", out + err)

    # huggingface_hub reads what celer pulled, offline, at the same paths
    try:
        p = hf_hub_download("org/tiny-GGUF", "tiny-Q8_0.gguf", cache_dir=c1, local_files_only=True)
        check(p == path, "hf_hub_download(local_files_only) finds celer's GGUF", p)
        p = snapshot_download("mlx-community/tiny-4bit", cache_dir=c1, local_files_only=True)
        check(p == mlx_snap, "snapshot_download(local_files_only) finds celer's MLX snapshot", p)
        p = hf_hub_download("org/split-GGUF", "Q8_0/tiny-Q8_0-00002-of-00002.gguf", cache_dir=c1,
                            local_files_only=True)
        with open(os.path.join(repos, "org/split-GGUF/Q8_0/tiny-Q8_0-00002-of-00002.gguf"), "rb") as f:
            check(open(p, "rb").read() == f.read(), "hf_hub_download(local_files_only) reads a nested part", p)
    except Exception as e:  # noqa: BLE001 - any failure here is the test's failure
        check(False, "huggingface_hub reads celer's cache", repr(e))
    # ... and the layout is the one huggingface_hub wrote for the same repo
    hf_links, hf_blobs = layout(os.environ["HF_HUB_CACHE"], "mlx-community/tiny-4bit")
    links, blobs = layout(c1, "mlx-community/tiny-4bit")
    check(links and all(hf_links.get(k) == v for k, v in links.items()) and set(blobs) <= set(hf_blobs),
          "celer's links and blob names equal huggingface_hub's", repr((links, hf_links)))

    # celer ls lists what pull wrote
    rc, out, err = celer(["ls"], env)
    lines = {l.split()[0]: l for l in out.splitlines()}
    check(rc == 0 and sorted(lines) == ["mlx-community/tiny-4bit", "org/split-GGUF", "org/tiny-GGUF", "org/tiny-multi"],
          "ls lists the pulled repos", out + err)
    check(lines.get("org/tiny-GGUF", "").endswith("gguf: Q4_K_M (tiny-Q4_K_M.gguf), Q8_0 (tiny-Q8_0.gguf)") and
          lines.get("mlx-community/tiny-4bit", "").endswith("mlx 4-bit") and
          lines.get("org/split-GGUF", "").endswith("gguf: Q8_0 (Q8_0/tiny-Q8_0-00001-of-00002.gguf)"),
          "ls shows the pulled formats", out)

    # -m NAME downloads when the cache lacks it, once
    c2 = os.path.join(tmp, "pull2")
    env2 = pull_env(hub, c2, tmp)
    rc, out, err = celer(["inspect", "-m", "org/tiny-multi:Q8_0"], env2)
    check(rc == 0 and model_line(out).endswith("/tiny-Q8_0.gguf") and model_line(out).startswith(c2),
          "-m NAME downloads a model the cache lacks", out + err)
    hub.mark()
    rc, out, err = celer(["inspect", "-m", "org/tiny-multi:Q8_0"], env2)
    check(rc == 0 and not hub.since(), "the second -m NAME reads the cache only", repr(hub.since()))

    pull_auth_tests(hub, tmp)
    pull_error_tests(hub, tmp)
    pull_resume_tests(hub, repos, tmp, hubs, gguf_sha)
    pull_disk_full_test(hub, tmp, gguf_sha)
    pull_progress_test(hub, tmp)


def pull_auth_tests(hub, tmp):
    """The gated repo: 401 naming HF_TOKEN; HF_TOKEN or the token file work; the token never
    reaches the CDN and is never printed."""
    c = os.path.join(tmp, "gated")
    env = pull_env(hub, c, tmp)
    hub.mark()
    check_pull_fails("gated repo without a token", "org/gated", env, ["org/gated", "401", "HF_TOKEN"])
    check(os.listdir(c) == [] if os.path.isdir(c) else True, "a refused pull writes nothing")
    wrong = "hf_wrong_token_0123456789"
    check_pull_fails("gated repo with a wrong token", "org/gated", dict(env, HF_TOKEN=wrong),
                     ["org/gated", "401", "HF_TOKEN"], secret=wrong)
    hub.mark()
    rc, out, err = pull("org/gated", dict(env, HF_TOKEN=TOKEN))
    check(rc == 0 and out.strip().endswith("/gated-Q8_0.gguf"), "gated repo with HF_TOKEN", out + err)
    check(TOKEN not in out + err, "the token is not printed")
    reqs = hub.since()
    hub_reqs = [r for r in reqs if r["server"] == "hub"]
    cdn_reqs = [r for r in reqs if r["server"] == "cdn"]
    check(hub_reqs and all(r["authorization"] for r in hub_reqs), "the token goes to the hub", repr(hub_reqs))
    check(cdn_reqs and not any(r["authorization"] for r in cdn_reqs),
          "Authorization never reaches the second host after the redirect", repr(cdn_reqs))
    home = os.path.join(tmp, "token-home")
    os.makedirs(home)
    with open(os.path.join(home, "token"), "w") as f:
        f.write(TOKEN + "\n")
    rc, out, err = pull("org/gated", pull_env(hub, os.path.join(tmp, "gated2"), tmp, HF_HOME=home))
    check(rc == 0 and out.strip().endswith("/gated-Q8_0.gguf") and TOKEN not in out + err,
          "the token file $HF_HOME/token is read", out + err)


def pull_error_tests(hub, tmp):
    c = os.path.join(tmp, "errors")
    env = pull_env(hub, c, tmp)
    check_pull_fails("404 repo", "org/nope", env, ["org/nope", "no such repository", "404 RepoNotFound"])
    check_pull_fails("404 revision", "org/tiny-GGUF@v9", env, ["org/tiny-GGUF", "no revision v9", "RevisionNotFound"])
    check_pull_fails("404 file", "org/ghost:Q4_K_M", env, ["org/ghost", "ghost-Q4_K_M.gguf", "404 EntryNotFound"])
    check_pull_fails("a listing path with ..", "org/evil", env, ["org/evil", "../../evil-Q4_K_M.gguf", "relative path"])
    check_pull_fails("a listing that is no JSON", "org/badjson", env, ["org/badjson", "not the JSON expected"])
    check_pull_fails("no model name", "not-a-name", env, ["not a model name"])
    rc, out, err = celer(["pull", "--help"], env)
    check(rc == 0 and out.startswith("usage: celer pull ORG/NAME[:QUANT][@REV]") and "HF_TOKEN" in out and err == "",
          "pull --help: usage on stdout, exit 0", out + err)
    check(not os.path.exists(os.path.join(c, "models--org--evil")) and
          not os.path.exists(os.path.join(c, "models--org--ghost", "snapshots")),
          "refused pulls write no snapshot")
    # a port nothing listens on
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    down = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    check_pull_fails("network down", "org/tiny-GGUF", dict(env, HF_ENDPOINT=down), ["cannot reach", down])
    check(time.monotonic() - t0 < 30, "network down fails fast")
    # offline: not even a request
    hub.mark()
    check_pull_fails("offline, not cached", "org/tiny-multi", dict(env, HF_HUB_OFFLINE="1"),
                     ["org/tiny-multi", "HF_HUB_OFFLINE", "not in the Hugging Face cache"])
    rc, out, err = celer(["inspect", "-m", "org/tiny-multi"], dict(env, HF_HUB_OFFLINE="1"))
    check(rc != 0 and "HF_HUB_OFFLINE" in err, "-m NAME offline names offline mode", err)
    check(not hub.since(), "HF_HUB_OFFLINE=1 makes no request", repr(hub.since()))


def seed_incomplete(cache, repo, sha, data):
    blobs = os.path.join(repo_dir(cache, repo), "blobs")
    os.makedirs(blobs, exist_ok=True)
    with open(os.path.join(blobs, sha + ".incomplete"), "wb") as f:
        f.write(data)


def check_blob(cache, repo, sha, what):
    blob = os.path.join(repo_dir(cache, repo), "blobs", sha)
    check(os.path.isfile(blob) and sha256_of(blob) == sha and not os.path.exists(blob + ".incomplete"),
          f"{what}: the blob's sha256 is right, no .incomplete left")


def pull_resume_tests(hub, repos, tmp, hubs, sha):
    with open(GGUF, "rb") as f:
        data = f.read()
    # a transfer cut in the middle: resumed with Range in the same pull
    cut = Hub(repos, tmp, "hub-cut", "--cut-after", "40000")
    hubs.append(cut)
    c = os.path.join(tmp, "cut")
    rc, out, err = pull("org/tiny-GGUF:Q8_0", pull_env(cut, c, tmp))
    gets = [r for r in cut.requests() if r["server"] == "cdn" and r["method"] == "GET"]
    check(rc == 0 and out.strip().endswith("/tiny-Q8_0.gguf"), "a cut transfer is resumed", out + err)
    check(len(gets) == 2 and gets[0]["range"] is None and gets[1]["range"] == "bytes=40000-",
          "the second GET asks Range: bytes=40000-", repr(gets))
    check_blob(c, "org/tiny-GGUF", sha, "cut then resumed")

    # a stalled transfer ends (HF_HUB_DOWNLOAD_TIMEOUT) and is resumed
    stall = Hub(repos, tmp, "hub-stall", "--stall-after", "30000")
    hubs.append(stall)
    c = os.path.join(tmp, "stall")
    t0 = time.monotonic()
    rc, out, err = pull("org/tiny-GGUF:Q8_0", pull_env(stall, c, tmp, HF_HUB_DOWNLOAD_TIMEOUT="2"))
    took = time.monotonic() - t0
    gets = [r for r in stall.requests() if r["server"] == "cdn" and r["method"] == "GET"]
    check(rc == 0 and took < 30, f"a stalled transfer ends and is resumed ({took:.1f} s)", out + err)
    check(len(gets) == 2 and gets[1]["range"] == "bytes=30000-", "after a stall, Range: bytes=30000-", repr(gets))
    check_blob(c, "org/tiny-GGUF", sha, "stalled then resumed")

    # a .incomplete from an earlier pull is continued
    c = os.path.join(tmp, "resume")
    seed_incomplete(c, "org/tiny-GGUF", sha, data[:50000])
    hub.mark()
    rc, out, err = pull("org/tiny-GGUF:Q8_0", pull_env(hub, c, tmp))
    gets = [r for r in hub.since() if r["method"] == "GET" and "/api/" not in r["path"]]
    check(rc == 0 and gets and all(r["range"] == "bytes=50000-" for r in gets),
          "an earlier .incomplete is resumed with Range", repr(gets) + err)
    check_blob(c, "org/tiny-GGUF", sha, "resumed from an earlier pull")

    # a whole .incomplete is checked, not fetched again
    c = os.path.join(tmp, "whole")
    seed_incomplete(c, "org/tiny-GGUF", sha, data)
    hub.mark()
    rc, out, err = pull("org/tiny-GGUF:Q8_0", pull_env(hub, c, tmp))
    check(rc == 0 and not [r for r in hub.since() if r["server"] == "cdn"], "a whole .incomplete is not fetched again",
          repr(hub.since()) + err)
    check_blob(c, "org/tiny-GGUF", sha, "whole .incomplete")

    # a server that answers 200 to a Range request: the file starts over
    odd = Hub(repos, tmp, "hub-odd", "--ignore-range", "--corrupt", "org/tiny-multi/tiny-F16.gguf")
    hubs.append(odd)
    c = os.path.join(tmp, "norange")
    seed_incomplete(c, "org/tiny-GGUF", sha, b"\0" * 50000)  # wrong bytes: kept, the sha would fail
    rc, out, err = pull("org/tiny-GGUF:Q8_0", pull_env(odd, c, tmp))
    gets = [r for r in odd.requests() if r["server"] == "cdn"]
    check(rc == 0 and gets and gets[0]["range"] == "bytes=50000-", "a 200 answer to Range restarts the file",
          repr(gets) + err)
    check_blob(c, "org/tiny-GGUF", sha, "restarted on a 200")

    # a corrupt file: refused, removed, no link
    c = os.path.join(tmp, "corrupt")
    check_pull_fails("checksum mismatch", "org/tiny-multi:F16", pull_env(odd, c, tmp),
                     ["org/tiny-multi", "tiny-F16.gguf", "checksum mismatch", sha])
    links, blobs = layout(c, "org/tiny-multi")
    check(not links and blobs == [], "a corrupt file leaves no blob, no .incomplete, no link", repr((links, blobs)))


def pull_disk_full_test(hub, tmp, sha):
    """A cache on a 64 KiB tmpfs (as root; skipped where it cannot be mounted)."""
    full = os.path.join(tmp, "full")
    os.makedirs(full)
    if os.geteuid() != 0:
        return skip("disk full", "mounting a small tmpfs needs root")
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", full], capture_output=True,
                           text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return skip("disk full", f"mount failed: {e}")
    if r.returncode != 0:
        return skip("disk full", f"mount failed: {r.stderr.strip()}")
    try:
        c = os.path.join(full, "cache")
        err = check_pull_fails("disk full", "org/tiny-GGUF:Q8_0", pull_env(hub, c, tmp),
                               ["org/tiny-GGUF", "disk full", ".incomplete", "resume"])
        blobs = os.path.join(repo_dir(c, "org/tiny-GGUF"), "blobs")
        part = os.path.join(blobs, sha + ".incomplete")
        check(os.path.isfile(part) and os.path.getsize(part) > 0 and not os.path.exists(os.path.join(blobs, sha)),
              "disk full: the .incomplete is kept, no blob", err)
        check(not os.path.exists(os.path.join(repo_dir(c, "org/tiny-GGUF"), "snapshots")), "disk full: no snapshot link")
    finally:
        subprocess.run(["umount", full], capture_output=True, timeout=20)


def pull_progress_test(hub, tmp):
    """On a terminal, one progress line per file on stderr."""
    master, slave = pty.openpty()
    env = pull_env(hub, os.path.join(tmp, "tty"), tmp)
    try:
        p = subprocess.Popen([CELER, "pull", "mlx-community/tiny-4bit"], env=env, stdout=subprocess.PIPE,
                             stderr=slave, stdin=subprocess.DEVNULL)
        os.close(slave)
        got, deadline = b"", time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                break
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the other side closed
                break
            if not chunk:
                break
            got += chunk
        out, _ = p.communicate(timeout=60)
    finally:
        os.close(master)
    text = got.decode(errors="replace")
    done = [l for l in text.replace("\r", "\n").split("\n") if "100%" in l]
    check(p.returncode == 0 and out.strip(), "pull on a terminal succeeds", text)
    check(all(any(n in l for l in done) for n in ("config.json", "model.safetensors", "chat_template.jinja")),
          "a progress line per file on a terminal", repr(text[:400]))


if __name__ == "__main__":
    sys.exit(main())
