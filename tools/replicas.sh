#!/usr/bin/env bash
# Several `celer serve` replicas behind an existing OpenAI-compatible router
# (docs/serving.md, "Several replicas behind a router"). celer has no router of its own.
#
#   bash tools/replicas.sh [MODEL]
#
# 1. Installs the router pinned in tools/requirements-router.txt (LiteLLM's proxy) into
#    build/router-venv from PyPI, once (redone when that file changes).
# 2. Starts REPLICAS (2) `celer serve` processes on free 127.0.0.1 ports with SERVE_FLAGS
#    (-np 2 -c 2048 --batch-tokens 256 -t 1), /metrics on and an API key that only the
#    router holds.
# 3. Writes the router's config with every replica as a deployment of one model name
#    (routing_strategy ROUTING, default simple-shuffle: random) and a master key for
#    clients, starts the router on 127.0.0.1 and waits for its readiness endpoint.
# 4. Sends REQUESTS (12) chat completions (max_tokens MAX_TOKENS, 16; CONCURRENCY, 3, at
#    a time) to the router, reads each replica's /metrics, prints what each served.
# 5. Stops everything (trap on exit; every wait has a limit). Exits 0 when every request
#    succeeded and every replica served at least one, 1 when not, 2 when set-up failed.
#
# MODEL defaults to the path tools/fetch_model.sh prints. Everything listens on 127.0.0.1;
# the only download is pip's from PyPI into the venv. Logs and the router's config stay in
# build/replicas/. Both keys are made anew each run; the replicas read theirs from a file
# (mode 600) and the router gets both through its environment, so neither shows in `ps`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
n_replicas=${REPLICAS:-2}
n_requests=${REQUESTS:-12}
max_tokens=${MAX_TOKENS:-16}
concurrency=${CONCURRENCY:-3}
routing=${ROUTING:-simple-shuffle}    # or least-busy, latency-based-routing, ...
read -r -a serve_flags <<<"${SERVE_FLAGS:--np 2 -c 2048 --batch-tokens 256 -t 1}"
celer=${CELER:-build/celer}
venv=build/router-venv
req=tools/requirements-router.txt
work=build/replicas
name=smollm2            # the model name clients ask the router for

say() { printf 'replicas: %s\n' "$*"; }
die() { printf 'replicas: %s\n' "$*" >&2; exit 2; }

# ---- Processes we start, and stopping them ----------------------------------------------
pids=()
client=                 # the request-sending Python, while it runs
stop_all() {
    local rc=$? p i
    trap - EXIT INT TERM
    [ -n "$client" ] && { kill -TERM "$client" 2>/dev/null || true; }
    for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
    # celer drains for up to 10 s; give every process 15 s in all, then SIGKILL.
    for ((i = 0; i < 150; i++)); do
        local alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for p in "${pids[@]}"; do
        if kill -0 "$p" 2>/dev/null; then
            say "process group $p did not stop in 15 s: SIGKILL"
            kill -KILL -- "-$p" 2>/dev/null || true
        fi
    done
    [ "${#pids[@]}" -gt 0 ] && say "stopped ${#pids[@]} processes"
    exit "$rc"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# Starts "$@" in its own process group (so the router's workers stop with it), output to
# log file $1; appends the leader's pid to pids.
start() {
    local log=$1
    shift
    setsid "$@" >"$log" 2>&1 </dev/null &
    pids+=("$!")
}

# wait_http URL SECONDS PID: until URL answers 200 (true), PID exits or SECONDS pass (false).
wait_http() {
    local url=$1 limit=$2 pid=$3 t0=$SECONDS
    while ((SECONDS - t0 < limit)); do
        kill -0 "$pid" 2>/dev/null || return 1
        [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$url" || true)" = 200 ] && return 0
        sleep 0.5
    done
    return 1
}

# ---- The router's venv --------------------------------------------------------------------
python=${PYTHON:-python3}
if [ -f "$venv/.ok" ] && cmp -s "$req" "$venv/.ok" && [ -x "$venv/bin/litellm" ]; then
    say "router venv $venv is up to date"
else
    say "installing $(grep -v '^#' "$req" | tr '\n' ' ')into $venv (minutes, once)"
    rm -f "$venv/.ok"
    mkdir -p build
    "$python" -m venv "$venv" || die "cannot create $venv with $python"
    timeout 1200 "$venv/bin/pip" install --disable-pip-version-check -q -r "$req" \
        >build/router-install.log 2>&1 || {
        tail -5 build/router-install.log >&2
        die "pip install -r $req failed (log: build/router-install.log)"
    }
    cp "$req" "$venv/.ok"
fi
router_version=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("litellm"))')

# ---- celer and the model ------------------------------------------------------------------
if ! [ -x "$celer" ]; then
    say "building $celer"
    timeout 1800 make -j2 all >/dev/null || die "make all failed"
fi
case "$("$celer" serve --help 2>&1 || true)" in
*"usage: celer serve"*) ;;
*) die "$celer has no serve command" ;;
esac
model=${1:-$(timeout 600 bash tools/fetch_model.sh)} || die "no model (tools/fetch_model.sh failed)"
[ -e "$model" ] || die "model $model does not exist"

rm -rf "$work"
mkdir -p "$work"
# Free loopback ports, all bound at once so they differ; the servers bind them right after.
read -r -a ports < <("$python" -c '
import socket, sys
n = int(sys.argv[1])
socks = [socket.socket() for _ in range(n)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
' $((n_replicas + 1)))
router_port=${ports[$n_replicas]}
replica_key=$("$python" -c 'import secrets; print(secrets.token_hex(16))')
master_key=sk-$("$python" -c 'import secrets; print(secrets.token_hex(16))')
(umask 077 && echo "$replica_key" >"$work/replica.key")

# ---- Replicas -----------------------------------------------------------------------------
for ((i = 0; i < n_replicas; i++)); do
    start "$work/replica-$((i + 1)).log" "$celer" serve -m "$model" --host 127.0.0.1 \
        --port "${ports[$i]}" "${serve_flags[@]}" --alias "$name" \
        --api-key-file "$work/replica.key" --metrics
done
for ((i = 0; i < n_replicas; i++)); do
    wait_http "http://127.0.0.1:${ports[$i]}/health" 120 "${pids[$i]}" || {
        tail -3 "$work/replica-$((i + 1)).log" >&2
        die "replica $((i + 1)) on port ${ports[$i]} did not become healthy"
    }
    say "replica $((i + 1)): http://127.0.0.1:${ports[$i]} ($(grep -o 'ready: .*' "$work/replica-$((i + 1)).log" | cut -c8-))"
done

# ---- Router -------------------------------------------------------------------------------
{
    echo "# written by tools/replicas.sh: ${n_replicas} celer replicas as deployments of one model"
    echo "model_list:"
    for ((i = 0; i < n_replicas; i++)); do
        cat <<EOF
  - model_name: $name
    litellm_params:
      model: openai/$name                  # OpenAI-compatible provider; celer's --alias
      api_base: http://127.0.0.1:${ports[$i]}/v1
      api_key: os.environ/CELER_REPLICA_KEY
      timeout: 120
    model_info:
      id: replica-$((i + 1))
EOF
    done
    cat <<EOF
router_settings:
  routing_strategy: $routing
  num_retries: 1
  allowed_fails: 3                        # failures in a minute before a replica cools down
  cooldown_time: 30
litellm_settings:
  telemetry: false
general_settings:
  master_key: os.environ/ROUTER_MASTER_KEY
EOF
} >"$work/router.yaml"

# LITELLM_LOCAL_MODEL_COST_MAP: use the cost map in the wheel instead of fetching it.
start "$work/router.log" env CELER_REPLICA_KEY="$replica_key" ROUTER_MASTER_KEY="$master_key" \
    LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY=False NO_DOCS=True \
    "$venv/bin/litellm" --config "$work/router.yaml" --host 127.0.0.1 --port "$router_port" \
    --num_workers 1
router_pid=${pids[$n_replicas]}
say "router: LiteLLM $router_version proxy on http://127.0.0.1:$router_port ($routing), starting"
wait_http "http://127.0.0.1:$router_port/health/readiness" 240 "$router_pid" || {
    tail -20 "$work/router.log" >&2
    die "the router did not become ready in 240 s (log: $work/router.log)"
}
say "router ready after ${SECONDS}s of this script"

# ---- Requests through the router, then each replica's /metrics -----------------------------
replica_urls=()
for ((i = 0; i < n_replicas; i++)); do replica_urls+=("http://127.0.0.1:${ports[$i]}"); done
# In the background with `wait`, so that a signal to this script runs the trap at once.
"$python" - "$router_port" "$master_key" "$replica_key" "$name" "$n_requests" "$max_tokens" \
    "$concurrency" "${replica_urls[@]}" <<'PY' &
import concurrent.futures as cf
import json
import sys
import time
import urllib.error
import urllib.request

port, master_key, replica_key, name = sys.argv[1:5]
n_requests, max_tokens, concurrency = map(int, sys.argv[5:8])
replicas = sys.argv[8:]
router = f"http://127.0.0.1:{port}"
topics = ["the sea", "a lamp", "bread", "the moon", "a violin", "snow", "a bicycle",
          "tea", "a library", "rain", "a clock", "a garden"]


def get(url, key, timeout=10):
    rq = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(rq, timeout=timeout) as r:
        return r.read().decode()


def chat(i):
    body = {"model": name, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user",
                          "content": f"Write one sentence about {topics[i % len(topics)]}."}]}
    rq = urllib.request.Request(f"{router}/v1/chat/completions", json.dumps(body).encode(),
                                {"Authorization": f"Bearer {master_key}",
                                 "Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(rq, timeout=180) as r:
            out = json.load(r)
            base = r.headers.get("x-litellm-model-api-base", "?")
            text = out["choices"][0]["message"]["content"]
            return i, 200, base, out["usage"]["completion_tokens"], time.monotonic() - t0, text
    except urllib.error.HTTPError as e:
        return i, e.code, "-", 0, time.monotonic() - t0, e.read().decode()[:200]
    except Exception as e:  # refused, timed out
        return i, 0, "-", 0, time.monotonic() - t0, repr(e)[:200]


models = json.loads(get(f"{router}/v1/models", master_key))
print(f"router /v1/models: {[m['id'] for m in models['data']]}")
print(f"sending {n_requests} chat completions (max_tokens {max_tokens}, {concurrency} at a time)")
t0 = time.monotonic()
with cf.ThreadPoolExecutor(concurrency) as pool:
    results = sorted(pool.map(chat, range(n_requests)))
wall = time.monotonic() - t0
ok = 0
for i, code, base, n, dt, text in results:
    ok += code == 200
    print(f"  #{i + 1:<2} {code} {base:<28} {n:>3} tokens {dt:5.2f}s  {text.strip()[:60]!r}")
print(f"{ok}/{n_requests} succeeded in {wall:.1f}s")

keys = ["celer_requests_total", "celer_prompt_tokens_total", "celer_generation_tokens_total",
        "celer_requests_running", "celer_requests_waiting", "celer_kv_cache_usage_ratio"]
served = []
print("replica metrics (GET /metrics with the replica key):")
for k, url in enumerate(replicas):
    vals = {}
    try:
        for line in get(f"{url}/metrics", replica_key).splitlines():
            if line and not line.startswith("#"):
                key, _, v = line.partition(" ")
                vals[key] = float(v)
    except Exception as e:
        print(f"  replica {k + 1} {url}: /metrics failed: {e!r}")
    served.append(vals.get("celer_requests_total", 0))
    print(f"  replica {k + 1} {url}: " +
          " ".join(f"{key.removeprefix('celer_')}={vals.get(key, float('nan')):g}" for key in keys))
print("summary: " + ", ".join(f"replica {k + 1} served {int(s)}" for k, s in enumerate(served)) +
      f" of {n_requests}; {ok} succeeded through the router")
idle = [k + 1 for k, s in enumerate(served) if s <= 0]
if idle:
    print(f"FAIL: replica(s) {idle} served nothing")
if ok < n_requests:
    print(f"FAIL: {n_requests - ok} request(s) failed")
sys.exit(1 if idle or ok < n_requests else 0)
PY
client=$!
rc=0
wait "$client" || rc=$?
client=
[ "$rc" = 0 ] && say "OK: every replica served requests through the router" || say "FAILED (rc $rc)"
exit "$rc"
