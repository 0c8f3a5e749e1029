#!/usr/bin/env bash
# Sets up what make bench-cuda needs besides celer (docs/benchmarks.md, "CUDA"):
#   build/bench-cuda-venv         Python venv with bench/requirements-cuda.txt (numpy, pyyaml)
#   build/llama.cpp-cuda/src      the llama.cpp tree of the llama-cpp-python sdist (the one
#                                 bench/lib.sh pins, in build/llama.cpp-<version>/src, fetched
#                                 when absent) cut down to what a CUDA or CPU build of
#                                 llama-bench reads, plus gguf-py (pure Python) to write GGUF
#   build/llama.cpp-cuda/llama-cpp-commit   the llama.cpp commit the sdist vendors
# The cut tree is small enough to carry to a GPU machine that has no network; bench/cuda.py
# builds llama-bench from it there (CMake + CUDA). Kept: the top CMakeLists.txt and cmake/,
# include/, src/, common/, ggml/ with its base files and the CPU (x86 kernels only) and
# CUDA backends, the three vendor/ libraries common/ uses, tools/llama-bench, and
# gguf-py/gguf. tools/ and vendor/ get a CMakeLists.txt of their own naming only those.
# Left out: docs, models, tests, examples, the server and its web UI, the other backends.
# Idempotent: skipped when build/llama.cpp-cuda/.ok names the same release.
# Run: bash bench/setup_cuda.sh   (or make bench-cuda, which calls it)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

venv="$root/build/bench-cuda-venv"
bench_venv setup-cuda "$venv" "$root/bench/requirements-cuda.txt"

out="$root/build/llama.cpp-cuda"
if [ -f "$out/.ok" ] && [ "$(cat "$out/.ok")" = "$LLAMA_CPP_PYTHON_VERSION" ] && [ -d "$out/src" ]; then
    echo "setup-cuda: build/llama.cpp-cuda/src is there ($(du -sh "$out/src" | cut -f1))"
    exit 0
fi
full="$root/build/llama.cpp-$LLAMA_CPP_PYTHON_VERSION"
llama_cpp_source "$full" "$venv/bin/pip"

# ==== The cut tree ====
rm -rf "$out"
mkdir -p "$out/src"
keep() {  # keep PATH...: copies each path of the full tree to the same place in the cut one
    for p in "$@"; do
        mkdir -p "$out/src/$(dirname "$p")"
        cp -a "$full/src/$p" "$out/src/$p"
    done
}
keep CMakeLists.txt LICENSE cmake include src common tools/llama-bench \
    ggml/CMakeLists.txt ggml/cmake ggml/include ggml/src/ggml-cuda \
    vendor/nlohmann vendor/sheredom vendor/cpp-httplib gguf-py/LICENSE gguf-py/gguf
# ggml/src: the base library's files (no backend directories), then the CPU backend with
# only the x86 kernels (its CMakeLists.txt reads arch/<arch>/ for the machine's arch alone).
find "$full/src/ggml/src" -maxdepth 1 -type f -exec cp -a {} "$out/src/ggml/src/" \;
mkdir -p "$out/src/ggml/src/ggml-cpu/arch"
find "$full/src/ggml/src/ggml-cpu" -mindepth 1 -maxdepth 1 \
    ! -name arch ! -name kleidiai ! -name spacemit -exec cp -a {} "$out/src/ggml/src/ggml-cpu/" \;
cp -a "$full/src/ggml/src/ggml-cpu/arch/x86" "$out/src/ggml/src/ggml-cpu/arch/"
find "$out/src/gguf-py" -name __pycache__ -prune -exec rm -rf {} +

cat > "$out/src/tools/CMakeLists.txt" <<'CMAKE'
# Written by celer's bench/setup_cuda.sh: of llama.cpp's tools, llama-bench alone.
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
CMAKE
cat > "$out/src/vendor/CMakeLists.txt" <<'CMAKE'
# Written by celer's bench/setup_cuda.sh: the vendored libraries llama-common links.
add_subdirectory(nlohmann)
add_subdirectory(sheredom)
add_subdirectory(cpp-httplib)
CMAKE
cp "$full/llama-cpp-commit" "$out/llama-cpp-commit"
echo "$LLAMA_CPP_PYTHON_VERSION" > "$out/.ok"
echo "setup-cuda: build/llama.cpp-cuda/src ready ($(du -sh "$out/src" | cut -f1), llama.cpp $(cat "$out/llama-cpp-commit"))"
