#!/usr/bin/env bash
# Sets up the peers of the side-by-side benchmark (docs/benchmarks.md):
#   build/bench-venv                Python venv with bench/requirements.txt (mlx[cpu], mlx-lm,
#                                   gguf, safetensors, numpy)
#   build/llama.cpp-<version>/      llama.cpp from the llama-cpp-python sdist on PyPI
#                                   (its vendor/llama.cpp tree), built Release with
#                                   GGML_NATIVE=ON: bin/llama-bench, bin/llama-quantize
# Idempotent: each part is skipped when its stamp file is present and current.
# Run: bash bench/setup.sh   (or make bench, which calls it)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
jobs="${JOBS:-$(nproc)}"

# llama-cpp-python release whose vendored llama.cpp we build; the CHANGELOG of the
# sdist names the llama.cpp commit it vendors.
LLAMA_CPP_PYTHON_VERSION=0.3.36

# ==== Python venv ====
venv="$root/build/bench-venv"
req="$root/bench/requirements.txt"
if [ -f "$venv/.ok" ] && cmp -s "$req" "$venv/.ok"; then
    echo "bench-setup: build/bench-venv is up to date"
else
    rm -f "$venv/.ok"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --disable-pip-version-check -q -r "$req"
    cp "$req" "$venv/.ok"
    echo "bench-setup: build/bench-venv ready"
fi

# ==== llama.cpp ====
ldir="$root/build/llama.cpp-$LLAMA_CPP_PYTHON_VERSION"
stamp="$ldir/.ok"
if [ -f "$stamp" ] && [ -x "$ldir/build/bin/llama-bench" ] && [ -x "$ldir/build/bin/llama-quantize" ]; then
    echo "bench-setup: build/llama.cpp-$LLAMA_CPP_PYTHON_VERSION is built"
    exit 0
fi
mkdir -p "$ldir"
if [ ! -f "$ldir/src/CMakeLists.txt" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$venv/bin/pip" download --disable-pip-version-check -q --no-deps --no-binary :all: \
        -d "$tmp" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
    sdist="$tmp/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
    rm -rf "$ldir/src"
    cp -a "$sdist/vendor/llama.cpp" "$ldir/src"
    rm -f "$ldir/src/.git"  # a submodule pointer into the sdist's absent .git/modules
    cp "$sdist/CHANGELOG.md" "$ldir/CHANGELOG-llama-cpp-python.md"
fi

# The vendored tree has no .git; without a ceiling, llama.cpp's build-info would ask git
# and get this repository's commit. Pass the commit the sdist's CHANGELOG names instead.
commit=$(sed -n "/^## \[$LLAMA_CPP_PYTHON_VERSION\]/,/^## \[/p" "$ldir/CHANGELOG-llama-cpp-python.md" |
    grep -o 'llama\.cpp@[0-9a-f]*' | head -n1 | cut -d@ -f2 || true)
echo "${commit:-unknown}" > "$ldir/llama-cpp-commit"

GIT_CEILING_DIRECTORIES="$ldir" cmake -S "$ldir/src" -B "$ldir/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_COMMIT="${commit:-unknown}" \
    > "$ldir/cmake-configure.log" 2>&1 || { tail -n 30 "$ldir/cmake-configure.log"; exit 1; }
# Only the two tools the benchmark uses; the whole tree takes far longer on 2 cores.
echo "bench-setup: building llama.cpp $commit (llama-bench, llama-quantize; minutes on 2 cores)"
cmake --build "$ldir/build" --config Release -j "$jobs" --target llama-bench llama-quantize \
    > "$ldir/cmake-build.log" 2>&1 || { tail -n 30 "$ldir/cmake-build.log"; exit 1; }
touch "$stamp"
echo "bench-setup: build/llama.cpp-$LLAMA_CPP_PYTHON_VERSION/build/bin/llama-bench ready"
