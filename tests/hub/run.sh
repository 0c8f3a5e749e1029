#!/usr/bin/env bash
# Models by name end to end (tests/hub/suite.py): the fake Hugging Face Hub
# (tools/fake_hub.py) on 127.0.0.1, a cache filled from it by the pinned huggingface_hub
# (tools/requirements-hub.txt, installed into build/hub-venv on the first run), and
# BUILD_DIR/celer (or $CELER_BIN) resolving ORG/NAME[:QUANT] there.
# Last line: "test_hub: N passed, M failed[, K skipped]"; non-zero exit on any failure.
# Skips only where Python or its packages cannot be had, and never under CI.
set -u
export PYTHONDONTWRITEBYTECODE=1
build=${1:-build}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tests/server/venv.sh
. "$here/../server/venv.sh"
if ! venv_setup hub-venv "$here/../../tools/requirements-hub.txt"; then
    if [ -n "${CI:-}" ]; then
        echo "test_hub: 0 passed, 1 failed"
        exit 1
    fi
    echo "test_hub: skipped: no Python environment for the hub tests (message above)"
    echo "test_hub: 0 passed, 0 failed, 1 skipped"
    exit 0
fi
# The suite bounds every wait itself; this is a last resort against a hang.
timeout -k 10 "${HUB_TEST_TIMEOUT:-300}" "$venv_py" "$here/suite.py" "$build"
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "test_hub: the suite ran past ${HUB_TEST_TIMEOUT:-300} s and was stopped"
    echo "test_hub: 0 passed, 1 failed"
fi
exit $rc
