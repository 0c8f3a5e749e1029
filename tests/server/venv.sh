#!/usr/bin/env bash
# Sourced by tests/server/run.sh and schema.sh: makes build/server-venv from
# tools/requirements-server.txt when it is missing or out of date, and sets $server_py.
# Returns non-zero (with a message on stderr) when it cannot.
server_venv_setup() {
    local root venv req stamp py
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    venv="$root/build/server-venv"
    req="$root/tools/requirements-server.txt"
    stamp="$venv/.ok"
    py="${PYTHON:-python3}"
    server_py="$venv/bin/python"
    if [ -f "$stamp" ] && cmp -s "$req" "$stamp" && [ -x "$server_py" ]; then
        return 0
    fi
    rm -f "$stamp"
    if ! "$py" -m venv "$venv" >&2; then
        echo "server-venv: '$py -m venv' failed; on Debian install python3-venv" >&2
        return 1
    fi
    if ! timeout 600 "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2; then
        echo "server-venv: pip install -r tools/requirements-server.txt failed (no network?)" >&2
        return 1
    fi
    cp "$req" "$stamp"
}
