#!/usr/bin/env bash
# Schemathesis (OpenAI's schemas for the operations celer serve implements, in
# tests/server/openapi.yaml) against a real server from BUILD_DIR/celer (or $CELER_BIN):
# no 5xx and schema-conforming responses. Uses build/server-venv (created on first run).
# Last line: "test_server_schema: N passed, M failed"; non-zero exit on any failure.
set -u
export PYTHONDONTWRITEBYTECODE=1
build=${1:-build}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tests/server/venv.sh
. "$here/venv.sh"
if ! server_venv_setup; then
    if [ -n "${CI:-}" ]; then
        echo "test_server_schema: 0 passed, 1 failed"
        exit 1
    fi
    echo "test_server_schema: skipped: no Python environment (message above)"
    echo "test_server_schema: 0 passed, 0 failed, 1 skipped"
    exit 0
fi
timeout -k 10 "${SERVER_TEST_TIMEOUT:-900}" "$server_py" "$here/schema_run.py" "$build"
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "test_server_schema: ran past ${SERVER_TEST_TIMEOUT:-900} s and was stopped"
    echo "test_server_schema: 0 passed, 1 failed"
fi
exit $rc
