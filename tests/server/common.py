"""Shared pieces of the `celer serve` end-to-end tests: a tiny pass/fail harness, starting
and stopping servers on free ports, raw HTTP, SSE parsing and /metrics parsing.

Every wait here is bounded and every HTTP call has a timeout. Timeouts are multiplied by
SCALE, which is larger for sanitizer builds (CELER_TEST_TIMEOUT_SCALE overrides it).
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------------------------------
# Harness


class Failure(Exception):
    pass


class Skip(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def eq(got, want, what):
    if got != want:
        raise Failure(f"{what}: got {short(got)}, want {short(want)}")


def short(v, n=300):
    s = repr(v)
    return s if len(s) <= n else s[:n] + "..."


class Results:
    def __init__(self, prefix):
        self.prefix = prefix
        self.passed = self.failed = self.skipped = 0
        self.failures = []

    def run(self, name, fn, *args, **kwargs):
        t0 = time.monotonic()
        try:
            fn(*args, **kwargs)
        except Skip as e:
            self.skipped += 1
            print(f"SKIP {name}: {e}", flush=True)
            return False
        except Failure as e:
            self.failed += 1
            self.failures.append(name)
            print(f"FAIL {name}: {e}", flush=True)
            return False
        except Exception as e:  # an exception in a test is that test's failure
            self.failed += 1
            self.failures.append(name)
            tb = traceback.format_exc(limit=3).strip().splitlines()
            print(f"FAIL {name}: {type(e).__name__}: {short(str(e), 400)}", flush=True)
            for line in tb[-4:-1]:
                print(f"     {line}", flush=True)
            return False
        self.passed += 1
        print(f"ok   {name} ({time.monotonic() - t0:.1f} s)", flush=True)
        return True

    def record(self, name, ok, msg=""):
        """A result computed outside run() (e.g. a server that did not start)."""
        if ok:
            self.passed += 1
            print(f"ok   {name}", flush=True)
        else:
            self.failed += 1
            self.failures.append(name)
            print(f"FAIL {name}: {msg}", flush=True)

    def summary(self):
        line = f"{self.prefix}: {self.passed} passed, {self.failed} failed"
        if self.skipped:
            line += f", {self.skipped} skipped"
        return line


# ---------------------------------------------------------------------------------------
# Environment


def celer_bin(build_dir):
    return os.environ.get("CELER_BIN") or os.path.join(build_dir, "celer")


def default_model():
    """Path of the default model, or None when it is not there (fetch_model.sh prints it)."""
    try:
        out = subprocess.run(["bash", os.path.join(ROOT, "tools", "fetch_model.sh")], capture_output=True,
                             text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return None
    path = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
    return path if path and os.path.isfile(path) else None


def timeout_scale(binary):
    env = os.environ.get("CELER_TEST_TIMEOUT_SCALE")
    if env:
        return float(env)
    try:
        with open(binary, "rb") as f:
            data = f.read()
        if b"__asan_init" in data or b"__ubsan_handle" in data:
            return 5.0
    except OSError:
        pass
    return 1.0


SCALE = 1.0


def set_scale(s):
    global SCALE
    SCALE = s


def T(seconds):
    """A timeout of `seconds` on a plain build, scaled for slow (sanitizer) builds."""
    return seconds * SCALE


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------
# Servers


class ServerError(Exception):
    pass


def _die_with_parent():
    """preexec_fn: the server gets SIGKILL if this Python process dies (PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


RUNNING = []  # servers to kill if this process is told to stop


def _on_sigterm(signum, frame):
    for srv in list(RUNNING):
        srv.kill()
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, _on_sigterm)


class Server:
    """One `celer serve` process on 127.0.0.1 and a free port, logging to LOG_DIR/NAME.log."""

    def __init__(self, binary, model, name, args, log_dir, env=None):
        self.binary, self.model, self.name, self.args = binary, model, name, list(args)
        self.env = dict(os.environ, **env) if env else None  # what the process adds to ours
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self.proc = None
        self.port = None
        self.exit_code = None
        self.saw_503 = False

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout=60):
        last = ""
        for _attempt in range(3):  # a port taken between probing and binding: try another
            self.port = free_port()
            cmd = [self.binary, "serve", "-m", self.model, "--host", "127.0.0.1", "--port", str(self.port)]
            cmd += self.args
            with open(self.log_path, "ab") as log:
                env = " ".join(f"{k}={v}" for k, v in self.env.items() if os.environ.get(k) != v) if self.env else ""
                log.write(("$ " + (env + " " if env else "") + " ".join(cmd) + "\n").encode())
                log.flush()
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             preexec_fn=_die_with_parent, env=self.env)
            RUNNING.append(self)
            deadline = time.monotonic() + T(ready_timeout)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    r = httpx.get(self.url + "/health", timeout=2)
                    if r.status_code == 200:
                        return self
                    if r.status_code == 503:
                        self.saw_503 = True
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            if self.proc.poll() is None:
                self.kill()
                raise ServerError(f"{self.name}: /health not 200 within {T(ready_timeout):.0f} s "
                                  f"(log {self.log_path}: {self.log_tail()})")
            last = f"exited with {self.proc.returncode} before /health was 200: {self.log_tail()}"
            if "bind" not in last.lower() and "address" not in last.lower():
                break
        raise ServerError(f"{self.name}: {last}")

    def log_tail(self, n=6):
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").strip().splitlines()
            return " | ".join(lines[-n:])
        except OSError:
            return "(no log)"

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=20):
        """SIGTERM, then SIGKILL after `timeout` s. Returns the exit status (negative: signal)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=T(timeout))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
                self.exit_code = "killed: no exit within %.0f s of SIGTERM" % T(timeout)
                if self in RUNNING:
                    RUNNING.remove(self)
                return self.exit_code
        self.exit_code = self.proc.returncode
        if self in RUNNING:
            RUNNING.remove(self)
        return self.exit_code

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass


# ---------------------------------------------------------------------------------------
# HTTP


def client(srv, headers=None, timeout=60):
    return httpx.Client(base_url=srv.url, timeout=T(timeout), headers=headers or {})


def post_json(srv, path, obj, timeout=60, headers=None):
    with client(srv, headers, timeout) as c:
        return c.post(path, json=obj)


def get(srv, path, timeout=30, headers=None):
    with client(srv, headers, timeout) as c:
        return c.get(path)


def raw_request(port, method, path, body=b"", headers=None, timeout=30, read=True):
    """Plain-socket HTTP/1.1 request that tolerates the server answering (and closing)
    before the whole body is sent. Returns (status, headers dict lower-case, body bytes)."""
    headers = dict(headers or {})
    headers.setdefault("Host", f"127.0.0.1:{port}")
    headers.setdefault("Connection", "close")
    if body is not None:
        headers.setdefault("Content-Length", str(len(body)))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    s = socket.create_connection(("127.0.0.1", port), timeout=T(timeout))
    try:
        s.settimeout(T(timeout))
        try:
            s.sendall(head.encode("latin-1"))
            view = memoryview(body or b"")
            for i in range(0, len(view), 65536):
                s.sendall(view[i:i + 65536])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer early (e.g. 413) and stop reading
        if not read:
            return None
        data = b""
        deadline = time.monotonic() + T(timeout)
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data:
                hdr, _, rest = data.partition(b"\r\n\r\n")
                m = re.search(rb"(?im)^content-length:\s*(\d+)", hdr)
                if m and len(rest) >= int(m.group(1)):
                    break
    finally:
        s.close()
    if not data.startswith(b"HTTP/"):
        raise Failure(f"no HTTP response to {method} {path} (got {short(data[:200])})")
    hdr, _, rest = data.partition(b"\r\n\r\n")
    lines = hdr.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hmap = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hmap[k.strip().lower()] = v.strip()
    if "chunked" in hmap.get("transfer-encoding", "").lower():
        rest = dechunk(rest)
    return status, hmap, rest


def dechunk(data):
    out = b""
    while data:
        line, _, data = data.partition(b"\r\n")
        try:
            n = int(line.split(b";")[0], 16)
        except ValueError:
            break
        if n == 0:
            break
        out += data[:n]
        data = data[n + 2:]
    return out


def sse_events(lines_iter):
    """Parses `data:` events from an iterator of text lines; yields payload strings."""
    for line in lines_iter:
        if line.startswith("data:"):
            yield line[5:].strip()


def error_of(resp_json):
    """The {"error": {...}} object of an error body, checked for OpenAI's shape."""
    check(isinstance(resp_json, dict) and isinstance(resp_json.get("error"), dict),
          f"error body is not {{\"error\": {{...}}}}: {short(resp_json)}")
    err = resp_json["error"]
    for k in ("message", "type", "param", "code"):
        check(k in err, f"error object lacks '{k}': {short(err)}")
    check(isinstance(err["message"], str) and err["message"], f"error.message empty: {short(err)}")
    check(isinstance(err["type"], str) and err["type"], f"error.type empty: {short(err)}")
    return err


def parse_json_body(body, what):
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise Failure(f"{what}: body is not JSON: {short(body[:300])}")


# ---------------------------------------------------------------------------------------
# /metrics


def parse_metrics(text):
    """{name: value} for unlabelled samples, {name{labels}: value} for labelled ones,
    plus {"#TYPE name": type}."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("# TYPE"):
            parts = line.split()
            if len(parts) >= 4:
                out["#TYPE " + parts[2]] = parts[3]
            continue
        if line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*(\{[^}]*\})?)\s+(\S+)", line)
        if m:
            try:
                out[m.group(1)] = float(m.group(3))
            except ValueError:
                pass
    return out


def metrics(srv, headers=None):
    r = get(srv, "/metrics", timeout=10, headers=headers)
    check(r.status_code == 200, f"/metrics status {r.status_code}")
    return parse_metrics(r.text)


def wait_until(pred, timeout, interval=0.1):
    """Polls pred() until it returns a truthy value or `timeout` (already scaled) passes."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() >= deadline:
            return last
        time.sleep(interval)


def log(msg):
    print(msg, file=sys.stdout, flush=True)
