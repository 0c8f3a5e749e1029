#!/usr/bin/env bash
# Sets up the peers of the side-by-side benchmark (docs/benchmarks.md):
#   build/bench-venv                Python venv with bench/requirements.txt (mlx[cpu], mlx-lm,
#                                   gguf, safetensors, numpy)
#   build/llama.cpp-<version>/      llama.cpp from the llama-cpp-python sdist on PyPI
#                                   (its vendor/llama.cpp tree), built Release with
#                                   GGML_NATIVE=ON: bin/llama-bench, bin/llama-quantize,
#                                   bin/llama-tokenize (tools/make_llamacpp_tokenizer_goldens.py)
# Idempotent: each part is skipped when its stamp file is present and current.
# Run: bash bench/setup.sh   (or make bench, which calls it)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${JOBS:-$(nproc)}"
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"

# ==== Python venv ====
venv="$root/build/bench-venv"
bench_venv bench-setup "$venv" "$root/bench/requirements.txt"

# ==== llama.cpp ====
ldir="$root/build/llama.cpp-$LLAMA_CPP_PYTHON_VERSION"
stamp="$ldir/.ok"
if [ "$(cat "$stamp" 2>/dev/null)" = "cflags: $(llama_cpp_cflags)" ] && [ -x "$ldir/build/bin/llama-bench" ] && [ -x "$ldir/build/bin/llama-quantize" ] && [ -x "$ldir/build/bin/llama-tokenize" ]; then
    echo "bench-setup: build/llama.cpp-$LLAMA_CPP_PYTHON_VERSION is built"
    exit 0
fi
llama_cpp_source "$ldir" "$venv/bin/pip"
commit=$(cat "$ldir/llama-cpp-commit")

GIT_CEILING_DIRECTORIES="$ldir" cmake -S "$ldir/src" -B "$ldir/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DCMAKE_C_FLAGS="$(llama_cpp_cflags)" -DCMAKE_CXX_FLAGS="$(llama_cpp_cflags)" \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_COMMIT="${commit:-unknown}" \
    > "$ldir/cmake-configure.log" 2>&1 || { tail -n 30 "$ldir/cmake-configure.log"; exit 1; }
# Only the two tools the benchmark uses; the whole tree takes far longer on 2 cores.
echo "bench-setup: building llama.cpp $commit (llama-bench, llama-quantize, llama-tokenize; minutes on 2 cores)"
cmake --build "$ldir/build" --config Release -j "$jobs" --target llama-bench llama-quantize llama-tokenize \
    > "$ldir/cmake-build.log" 2>&1 || { tail -n 30 "$ldir/cmake-build.log"; exit 1; }
echo "cflags: $(llama_cpp_cflags)" > "$stamp"  # a build with other flags is redone
echo "bench-setup: build/llama.cpp-$LLAMA_CPP_PYTHON_VERSION/build/bin/llama-bench ready"
