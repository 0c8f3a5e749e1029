#!/usr/bin/env bash
# End-to-end tests of `celer serve` (tests/server/suite.py) against BUILD_DIR/celer
# (or $CELER_BIN). Creates build/server-venv from tools/requirements-server.txt on the
# first run. Every server it starts listens on 127.0.0.1 and a free port and is stopped
# with SIGTERM at the end. Server logs: BUILD_DIR/server-tests/*.log.
# Last line: "test_server: N passed, M failed[, K skipped]"; non-zero exit on any failure.
set -u
export PYTHONDONTWRITEBYTECODE=1
build=${1:-build}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tests/server/venv.sh
. "$here/venv.sh"
if ! server_venv_setup; then
    if [ -n "${CI:-}" ]; then
        echo "test_server: 0 passed, 1 failed"
        exit 1
    fi
    echo "test_server: skipped: no Python environment for the server tests (message above)"
    echo "test_server: 0 passed, 0 failed, 1 skipped"
    exit 0
fi
# The suite bounds every wait itself; this is a last resort against a hang.
timeout -k 10 "${SERVER_TEST_TIMEOUT:-900}" "$server_py" "$here/suite.py" "$build"
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "test_server: the suite ran past ${SERVER_TEST_TIMEOUT:-900} s and was stopped"
    echo "test_server: 0 passed, 1 failed"
fi
exit $rc
