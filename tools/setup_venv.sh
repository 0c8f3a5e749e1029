#!/usr/bin/env bash
# Create the Python environment used by tools/make_fixtures.py in build/venv.
# Idempotent: does nothing when build/venv/.ok exists and records the same
# tools/requirements.txt as the current one.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/build/venv"
req="$root/tools/requirements.txt"
stamp="$venv/.ok"
python="${PYTHON:-python3}"

if [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
    echo "build/venv is up to date"
    exit 0
fi

rm -f "$stamp"
"$python" -m venv "$venv"
"$venv/bin/pip" install -r "$req"
cp "$req" "$stamp"
echo "build/venv ready"
