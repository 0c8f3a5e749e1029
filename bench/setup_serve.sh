#!/usr/bin/env bash
# Sets up the peer and the load generator of the serving benchmark (docs/benchmarks.md,
# "Serving"):
#   build/serve-venv                 Python venv with bench/requirements-serve.txt (aiohttp)
#   build/llama.cpp-<version>/       the same llama.cpp tree bench/setup.sh builds (from the
#                                    llama-cpp-python sdist on PyPI, Release, GGML_NATIVE=ON),
#                                    here with the llama-server target: bin/llama-server
# The llama.cpp version is the one bench/lib.sh pins for both, and the build directory is
# shared: the libraries built for llama-bench are reused and the reverse.
# Idempotent: each part is skipped when its stamp file is present and current.
# Run: bash bench/setup_serve.sh   (or make bench-serve / make soak, which call it)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${JOBS:-$(nproc)}"
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

# ==== Python venv (load generator) ====
venv="$root/build/serve-venv"
bench_venv setup-serve "$venv" "$root/bench/requirements-serve.txt"

# With SETUP_SERVE_NO_LLAMA=1 only the venv is made (make soak needs no peer).
[ "${SETUP_SERVE_NO_LLAMA:-0}" = 1 ] && exit 0

# ==== llama.cpp llama-server ====
ldir="$root/build/llama.cpp-$LLAMA_CPP_PYTHON_VERSION"
stamp="$ldir/.ok-server"
if [ "$(cat "$stamp" 2>/dev/null)" = "cflags: $(llama_cpp_cflags)" ] && [ -x "$ldir/build/bin/llama-server" ]; then
    echo "setup-serve: build/llama.cpp-$LLAMA_CPP_PYTHON_VERSION/build/bin/llama-server is built"
    exit 0
fi
llama_cpp_source "$ldir" "$venv/bin/pip"
commit=$(cat "$ldir/llama-cpp-commit")

# The flags of bench/setup.sh with the server on; the other options are unchanged, so the
# ggml/llama objects already built there stay valid.
GIT_CEILING_DIRECTORIES="$ldir" cmake -S "$ldir/src" -B "$ldir/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DCMAKE_C_FLAGS="$(llama_cpp_cflags)" -DCMAKE_CXX_FLAGS="$(llama_cpp_cflags)" \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_COMMIT="${commit:-unknown}" \
    > "$ldir/cmake-configure-server.log" 2>&1 || { tail -n 30 "$ldir/cmake-configure-server.log"; exit 1; }
echo "setup-serve: building llama.cpp $commit llama-server (minutes on 2 cores)"
cmake --build "$ldir/build" --config Release -j "$jobs" --target llama-server \
    > "$ldir/cmake-build-server.log" 2>&1 || { tail -n 30 "$ldir/cmake-build-server.log"; exit 1; }
echo "cflags: $(llama_cpp_cflags)" > "$stamp"  # a build with other flags is redone
echo "setup-serve: build/llama.cpp-$LLAMA_CPP_PYTHON_VERSION/build/bin/llama-server ready"
