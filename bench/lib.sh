# What the benchmark set-up scripts share (sourced by bench/setup.sh, bench/setup_serve.sh
# and bench/setup_cuda.sh): the llama-cpp-python release whose vendored llama.cpp is the
# peer, a Python venv from a pinned requirements file, and that llama.cpp source tree.
# Nothing here builds llama.cpp: each script configures the targets it needs.

# llama-cpp-python release whose vendored llama.cpp we build; the CHANGELOG of the
# sdist names the llama.cpp commit it vendors.
LLAMA_CPP_PYTHON_VERSION=0.3.36

# Compiler flags for llama.cpp on this CPU. GGML_NATIVE=ON compiles ggml's AMX path where
# the CPU has AMX, and that path dies of SIGILL at its first tile instruction on these
# machines (llama.cpp 0c1e57098, Sapphire Rapids guests), so it is compiled out there:
# llama.cpp then runs its AVX-512 VNNI kernels. Empty elsewhere.
llama_cpp_cflags() {
    if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
        echo "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    fi
}

# bench_venv TAG VENV REQUIREMENTS: a venv at VENV with the pinned REQUIREMENTS installed,
# skipped when VENV/.ok holds the same requirements. TAG prefixes the messages.
bench_venv() {
    local tag=$1 venv=$2 req=$3
    if [ -f "$venv/.ok" ] && cmp -s "$req" "$venv/.ok"; then
        echo "$tag: ${venv#"$root"/} is up to date"
        return
    fi
    rm -f "$venv/.ok"
    "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/pip" install --disable-pip-version-check -q -r "$req"
    cp "$req" "$venv/.ok"
    echo "$tag: ${venv#"$root"/} ready"
}

# llama_cpp_source LDIR PIP: the llama.cpp tree vendored in the llama-cpp-python sdist
# (downloaded from PyPI with PIP, the pip of a venv) in LDIR/src, its CHANGELOG in
# LDIR/CHANGELOG-llama-cpp-python.md, and the llama.cpp commit that CHANGELOG names in
# LDIR/llama-cpp-commit ("unknown" when it names none). The download is skipped when
# LDIR/src is there.
llama_cpp_source() {
    local ldir=$1 pip=$2
    mkdir -p "$ldir"
    if [ ! -f "$ldir/src/CMakeLists.txt" ]; then
        local tmp
        tmp=$(mktemp -d)
        "$pip" download --disable-pip-version-check -q --no-deps --no-binary :all: \
            -d "$tmp" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
        tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
        local sdist="$tmp/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
        rm -rf "$ldir/src"
        cp -a "$sdist/vendor/llama.cpp" "$ldir/src"
        rm -f "$ldir/src/.git"  # a submodule pointer into the sdist's absent .git/modules
        cp "$sdist/CHANGELOG.md" "$ldir/CHANGELOG-llama-cpp-python.md"
        rm -rf "$tmp"
    fi
    # The vendored tree has no .git; without a ceiling, llama.cpp's build-info would ask
    # git and get this repository's commit. Builds pass this commit instead.
    local commit
    commit=$(sed -n "/^## \[$LLAMA_CPP_PYTHON_VERSION\]/,/^## \[/p" "$ldir/CHANGELOG-llama-cpp-python.md" |
        grep -o 'llama\.cpp@[0-9a-f]*' | head -n1 | cut -d@ -f2 || true)
    echo "${commit:-unknown}" > "$ldir/llama-cpp-commit"
}
