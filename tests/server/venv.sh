#!/usr/bin/env bash
# Sourced by the test runners that need Python packages (tests/server/run.sh, schema.sh,
# tests/hub/run.sh): venv_setup makes build/NAME from a pinned requirements file when it is
# missing or out of date and sets $venv_py. Returns non-zero (with a message on stderr)
# when it cannot.
venv_setup() {
    local name=$1 req=$2 root venv stamp py
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    venv="$root/build/$name"
    stamp="$venv/.ok"
    py="${PYTHON:-python3}"
    venv_py="$venv/bin/python"
    if [ -f "$stamp" ] && cmp -s "$req" "$stamp" && [ -x "$venv_py" ]; then
        return 0
    fi
    rm -f "$stamp"
    if ! "$py" -m venv "$venv" >&2; then
        echo "$name: '$py -m venv' failed; on Debian install python3-venv" >&2
        return 1
    fi
    if ! timeout 600 "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2; then
        echo "$name: pip install -r ${req#"$root"/} failed (no network?)" >&2
        return 1
    fi
    cp "$req" "$stamp"
}

# build/server-venv from tools/requirements-server.txt; sets $server_py.
server_venv_setup() {
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    venv_setup server-venv "$root/tools/requirements-server.txt" || return 1
    server_py=$venv_py
}
