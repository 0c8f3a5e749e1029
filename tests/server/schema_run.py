#!/usr/bin/env python3
"""Schemathesis against a real `celer serve`: usage schema_run.py BUILD_DIR.

Starts a server (CELER_BIN or BUILD_DIR/celer, default model) on 127.0.0.1 and a free port,
runs `schemathesis run` on tests/server/openapi.yaml (OpenAI's createChatCompletion,
createCompletion and listModels, vendored by vendor_openapi.py) with the checks
not_a_server_error and response_schema_conformance, a bounded number of examples per
operation and schema_hooks.py keeping generations short, then stops the server with SIGTERM.
One result per operation and check, plus the server's survival and exit status. Last line:
`test_server_schema: N passed, M failed`. SCHEMA_MAX_EXAMPLES and SCHEMA_SEED override the
defaults.
"""
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Results, Server, ServerError, T, celer_bin, default_model, get, set_scale, timeout_scale  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OPERATIONS = {"createChatCompletion": "POST /chat/completions", "createCompletion": "POST /completions",
              "listModels": "GET /models"}
CHECKS = ("not_a_server_error", "response_schema_conformance")
# Failure codes (`st explain CODE`) of not_a_server_error; the rest of what these two checks
# report is response_schema_conformance (ST108 schema violation, ST109 malformed JSON, ...).
SERVER_ERROR_CODES = {"ST101", "ST102"}


def summarize(text):
    """The lines of a schemathesis failure worth printing: codes, violation messages, the
    schema location, the response status and the command that reproduces it."""
    lines = text.splitlines()
    keep = []
    for i, line in enumerate(lines):
        nxt = next((x for x in lines[i + 1:] if x.strip()), "")
        s = line.strip()
        if (s.startswith("- ST") or s.startswith("Schema at") or re.match(r"^\[\d{3}\]", s)
                or s.startswith("curl ") or nxt.strip().startswith("Validated against")):
            keep.append(s[:300])
    return keep[:40] or [x[:300] for x in lines[:20]]


def har_counts(path):
    """{"POST /completions": requests sent}, {same: responses with status 200} from the HAR."""
    sent, served = {}, {}
    try:
        with open(path) as f:
            entries = json.load(f)["log"]["entries"]
    except (OSError, ValueError, KeyError):
        return sent, served
    for e in entries:
        url = e["request"]["url"]
        key = e["request"]["method"] + " " + url[url.find("/v1") + 3:] if "/v1" in url else url
        sent[key] = sent.get(key, 0) + 1
        if e["response"]["status"] == 200:
            served[key] = served.get(key, 0) + 1
    return sent, served


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    binary = celer_bin(build)
    res = Results("test_server_schema")
    if not os.path.isfile(binary):
        res.record("celer_binary", False, f"{binary} not found")
        print(res.summary())
        return 1
    set_scale(timeout_scale(binary))
    model = default_model()
    if model is None:
        if os.environ.get("CI"):
            res.record("default_model", False, "the default model is missing: CI must fetch it")
        else:
            res.skipped += 1
            print("SKIP all: default model not found (run tools/fetch_model.sh with network access)")
        print(res.summary())
        return 1 if res.failed else 0
    out_dir = os.path.abspath(os.path.join(build, "server-tests"))
    os.makedirs(out_dir, exist_ok=True)
    junit = os.path.join(out_dir, "schema-junit.xml")
    har = os.path.join(out_dir, "schema-requests.har")
    for f in (junit, har):
        if os.path.exists(f):
            os.remove(f)
    srv = Server(binary, model, "schema", ["-np", "2", "-c", "4096", "--max-queue", "64"], out_dir)
    t0 = time.monotonic()
    try:
        srv.start()
    except ServerError as e:
        for op in OPERATIONS:
            for chk in CHECKS:
                res.record(f"{chk}[{op}]", False, f"server did not start: {e}")
        print(res.summary())
        return 1
    max_examples = os.environ.get("SCHEMA_MAX_EXAMPLES", "25")
    cmd = [os.path.join(os.path.dirname(sys.executable), "schemathesis"), "run", os.path.join(HERE, "openapi.yaml"),
           "--url", srv.url + "/v1", "--checks", ",".join(CHECKS),
           "--max-examples", max_examples, "--seed", os.environ.get("SCHEMA_SEED", "20240601"),
           "--generation-database", "none", "--request-timeout", str(T(60)), "--workers", "2",
           "--continue-on-failure", "--report", "junit,har", "--report-junit-path", junit,
           "--report-har-path", har, "--no-color", "--output-truncate", "true", "--output-sanitize", "false"]
    for op in OPERATIONS:
        cmd += ["--include-operation-id", op]
    env = dict(os.environ, SCHEMATHESIS_HOOKS="schema_hooks",
               PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log_path = os.path.join(out_dir, "schemathesis.log")
    timed_out = False
    try:
        with open(log_path, "w") as log:
            try:
                p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out_dir,
                                   timeout=T(300))
                st_rc = p.returncode
            except subprocess.TimeoutExpired:
                timed_out, st_rc = True, None
        alive = srv.alive() and get(srv, "/health", timeout=10).status_code == 200
        res.record("server_alive_after_schemathesis", alive,
                   f"the server died or stopped answering /health (log {srv.log_path}: {srv.log_tail()})")
    finally:
        rc = srv.stop()
    res.record("sigterm_exit_0[schema]", rc == 0, f"exit status {rc!r} after SIGTERM: {srv.log_tail(3)}")

    if timed_out:
        res.record("schemathesis_run", False, f"schemathesis ran past {T(300):.0f} s (log {log_path})")
    cases = {}
    if os.path.exists(junit):
        for tc in ET.parse(junit).getroot().iter("testcase"):
            cases[tc.get("name")] = tc
    elif not timed_out:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-2000:]
        res.record("schemathesis_run", False, f"no JUnit report (exit {st_rc}); log tail:\n{tail}")
    sent, served = har_counts(har)
    print("requests sent (200s): " + ", ".join(f"{k} {sent[k]} ({served.get(k, 0)})" for k in sorted(sent)), flush=True)
    for op, label in OPERATIONS.items():
        tc = cases.get(label)
        codes, texts = set(), []
        if tc is not None:
            for el in list(tc.iter("failure")) + list(tc.iter("error")):
                text = (el.get("message") or "") + "\n" + (el.text or "")
                found = set(re.findall(r"\bST\d{3}\b", text))
                codes |= found or {"error"}
                texts.append(summarize(text))
        for chk in CHECKS:
            if tc is None:
                if cases or not timed_out:
                    res.record(f"{chk}[{op}]", False, f"{label} not in the schemathesis report")
                continue
            if chk == "not_a_server_error":
                bad = codes & (SERVER_ERROR_CODES | {"error"})
            else:
                bad = codes - SERVER_ERROR_CODES - {"error"}
            detail = ""
            if bad:
                detail = f"{sorted(bad)}:\n" + "\n".join("    " + line for t in texts for line in t)
            res.record(f"{chk}[{op}]", not bad, detail)
        # Not vacuous: some generated requests were served, so responses had a schema to meet.
        if label.startswith("POST") and tc is not None:
            n_ok = served.get(label, 0)
            res.record(f"some_requests_served[{op}]", n_ok > 0,
                       f"none of {sent.get(label, 0)} requests got a 200 (steering in schema_hooks.py?)")
    print(f"schemathesis log {log_path}, server log {srv.log_path}; {time.monotonic() - t0:.0f} s", flush=True)
    with open(log_path, errors="replace") as f:
        m = re.findall(r"Test cases:\s*\n\s*(.*)", f.read())
    if m:
        print("schemathesis: " + m[-1].strip(), flush=True)
    print(res.summary(), flush=True)
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
