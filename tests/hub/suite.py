"""Models by name end to end (run by tests/hub/run.sh with build/hub-venv's Python).

Starts tools/fake_hub.py on 127.0.0.1 with repositories made from committed fixtures (a
GGUF repo of two quants plus a projector, one of two quants neither Q4_K_M, an MLX-layout
repo, a gated repo), fills a temporary Hugging Face cache with the pinned huggingface_hub's
snapshot_download, then checks what `celer` makes of ORG/NAME[:QUANT] there, `celer ls`,
and that celer itself never asks the hub for anything. The hub is stopped at the end.
Last line: "test_hub: N passed, M failed".
"""
import os
import select
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
CELER = os.path.abspath(os.environ.get("CELER_BIN", os.path.join(ROOT, BUILD, "celer")))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
TOKEN = "hf_fake_token_for_tests"
passed = failed = 0


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {what}" + (f": {detail}" if detail else ""), flush=True)
    return ok


def make_repos(repos):
    gguf = os.path.join(FIXTURES, "llama-tied-gguf-q8_0", "model.gguf")
    mlx = os.path.join(FIXTURES, "llama-tied-q4g64")
    layout = {
        "org/tiny-GGUF": {
            "tiny-Q4_K_M.gguf": gguf,
            "tiny-Q8_0.gguf": gguf,
            "mmproj-tiny-F16.gguf": gguf,
            "README.md": None,
        },
        "org/tiny-multi": {"tiny-Q8_0.gguf": gguf, "tiny-F16.gguf": gguf},
        "mlx-community/tiny-4bit": {
            n: os.path.join(mlx, n) for n in ("config.json", "model.safetensors", "model.safetensors.index.json")
        },
        "org/gated": {"README.md": None},
    }
    for repo, files in layout.items():
        os.makedirs(os.path.join(repos, repo))
        for name, src in files.items():
            dst = os.path.join(repos, repo, name)
            if src:
                shutil.copyfile(src, dst)
            else:
                with open(dst, "w") as f:
                    f.write(f"# {repo}\n")


def start_hub(repos, log):
    hub = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tools", "fake_hub.py"), repos, "--gated", "org/gated",
         "--token", TOKEN, "--lifetime", "240", "--verbose"],
        stdout=subprocess.PIPE, stderr=log, text=True)
    ready, _, _ = select.select([hub.stdout], [], [], 30)
    url = hub.stdout.readline().strip() if ready else ""
    if not url.startswith("http://127.0.0.1:"):
        hub.kill()
        hub.wait(10)
        raise SystemExit(f"test_hub: the fake hub did not start (printed {url!r})\ntest_hub: 0 passed, 1 failed")
    return hub, url


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
    log_path = os.path.join(tmp, "hub.log")
    log = open(log_path, "w")
    hub, url = start_hub(repos, log)
    try:
        for k in [k for k in os.environ if k.startswith("HF_")]:
            del os.environ[k]
        os.environ.update(HF_ENDPOINT=url, HF_HUB_CACHE=cache, HF_HOME=home, HF_HUB_DISABLE_TELEMETRY="1",
                          HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_XET="1")
        run(url, tmp, cache, log_path)
    finally:
        hub.terminate()
        try:
            hub.wait(15)
        except subprocess.TimeoutExpired:
            hub.kill()
            hub.wait(5)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"test_hub: {passed} passed, {failed} failed")
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


def run(url, tmp, cache, log_path):
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

    with open(log_path) as lf:
        requests_before = len(lf.readlines())
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
    check_fails("an absent quant", ["inspect", "-m", "org/tiny-GGUF:Q5_K_M"], env,
                ["Q5_K_M", "Q4_K_M, Q8_0"])
    check_fails("ambiguous quant", ["inspect", "-m", "org/tiny-multi:tiny"], env, ["ambiguous"])
    check_fails("missing repo", ["inspect", "-m", "org/missing"], env,
                ["org/missing", "not in the Hugging Face cache", cache])
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
    check_fails("ls of a cache that is a file", ["ls"], dict(env, HF_HUB_CACHE=log_path), [log_path])

    with open(log_path) as lf:
        after = lf.readlines()[requests_before:]
    check(not after, "celer made no request to the hub", "".join(after[:3]))


if __name__ == "__main__":
    sys.exit(main())
