#!/usr/bin/env bash
# Sets up the peer and the load generator of the serving benchmark (docs/benchmarks.md,
# "Serving"):
#   build/serve-venv                 Python venv with bench/requirements-serve.txt (aiohttp)
#   build/llama.cpp-<version>/       the same llama.cpp tree bench/setup.sh builds (from the
#                                    llama-cpp-python sdist on PyPI, Release, GGML_NATIVE=ON),
#                                    here with the llama-server target: bin/llama-server
# The llama.cpp version is the one bench/setup.sh pins, read from it, and the build
# directory is shared: the libraries built for llama-bench are reused and the reverse.
# Idempotent: each part is skipped when its stamp file is present and current.
# Run: bash bench/setup_serve.sh   (or make bench-serve / make soak, which call it)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
jobs="${JOBS:-$(nproc)}"

LLAMA_CPP_PYTHON_VERSION=$(sed -n 's/^LLAMA_CPP_PYTHON_VERSION=\([0-9.]*\).*/\1/p' "$root/bench/setup.sh")
[ -n "$LLAMA_CPP_PYTHON_VERSION" ] || { echo "setup-serve: no LLAMA_CPP_PYTHON_VERSION in bench/setup.sh" >&2; exit 1; }

# ==== Python venv (load generator) ====
venv="$root/build/serve-venv"
req="$root/bench/requirements-serve.txt"
if [ -f "$venv/.ok" ] && cmp -s "$req" "$venv/.ok"; then
    echo "setup-serve: build/serve-venv is up to date"
else
    rm -f "$venv/.ok"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --disable-pip-version-check -q -r "$req"
    cp "$req" "$venv/.ok"
    echo "setup-serve: build/serve-venv ready"
fi

# With SETUP_SERVE_NO_LLAMA=1 only the venv is made (make soak needs no peer).
[ "${SETUP_SERVE_NO_LLAMA:-0}" = 1 ] && exit 0

# ==== llama.cpp llama-server ====
ldir="$root/build/llama.cpp-$LLAMA_CPP_PYTHON_VERSION"
stamp="$ldir/.ok-server"
if [ -f "$stamp" ] && [ -x "$ldir/build/bin/llama-server" ]; then
    echo "setup-serve: build/llama.cpp-$LLAMA_CPP_PYTHON_VERSION/build/bin/llama-server is built"
    exit 0
fi
mkdir -p "$ldir"
if [ ! -f "$ldir/src/CMakeLists.txt" ]; then
    # The same extraction as bench/setup.sh.
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$venv/bin/pip" download --disable-pip-version-check -q --no-deps --no-binary :all: \
        -d "$tmp" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
    sdist="$tmp/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
    rm -rf "$ldir/src"
    cp -a "$sdist/vendor/llama.cpp" "$ldir/src"
    rm -f "$ldir/src/.git"
    cp "$sdist/CHANGELOG.md" "$ldir/CHANGELOG-llama-cpp-python.md"
fi

commit=$(sed -n "/^## \[$LLAMA_CPP_PYTHON_VERSION\]/,/^## \[/p" "$ldir/CHANGELOG-llama-cpp-python.md" |
    grep -o 'llama\.cpp@[0-9a-f]*' | head -n1 | cut -d@ -f2 || true)
echo "${commit:-unknown}" > "$ldir/llama-cpp-commit"

# The flags of bench/setup.sh with the server on; the other options are unchanged, so the
# ggml/llama objects already built there stay valid.
GIT_CEILING_DIRECTORIES="$ldir" cmake -S "$ldir/src" -B "$ldir/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_COMMIT="${commit:-unknown}" \
    > "$ldir/cmake-configure-server.log" 2>&1 || { tail -n 30 "$ldir/cmake-configure-server.log"; exit 1; }
echo "setup-serve: building llama.cpp $commit llama-server (minutes on 2 cores)"
cmake --build "$ldir/build" --config Release -j "$jobs" --target llama-server \
    > "$ldir/cmake-build-server.log" 2>&1 || { tail -n 30 "$ldir/cmake-build-server.log"; exit 1; }
touch "$stamp"
echo "setup-serve: build/llama.cpp-$LLAMA_CPP_PYTHON_VERSION/build/bin/llama-server ready"
