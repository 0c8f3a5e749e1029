#!/usr/bin/env bash
# Where a decode step's time goes on the GPU, in one command: the decode products alone
# (bench_affine --quick: every plan per shape, the L2-prefetch plans among them), the
# trace build's timeline of one tg128 step at depth 0 and at depth 2048
# (tools/cuda_trace.py), and celer bench's tg128 on the normal build for the speed itself.
#   bash bench/cuda_decode.sh [MODEL]     (default: /tmp/m8b, made by bench/cuda_models.py)
# Builds what is missing first: build/celer, build/cuda/bench_affine, build/trace/celer.
# Reports go to $OUT when it is set, else build/cuda-decode.
set -eu
model=${1:-/tmp/m8b}
out=${OUT:-build/cuda-decode}
mkdir -p "$out"
jobs=$(nproc)
make -j"$jobs" build/celer build/cuda/bench_affine > "$out/build.log" 2>&1
make -j"$jobs" CUDA_TRACE=1 BUILD=build/trace build/trace/celer >> "$out/build.log" 2>&1
[ -f "$model/config.json" ] || python3 bench/cuda_models.py --out "$model"

build/cuda/bench_affine --quick | tee "$out/bench_affine.txt"
for depth in 0 2048; do
    trace="$out/step-d$depth.trace"
    CELER_CUDA_TRACE="$trace" CELER_CUDA_TRACE_STEP=64 build/trace/celer bench -m "$model" --device cuda \
        -p 0 -n 128 -d "$depth" -r 1 > "$out/trace-d$depth.log" 2>&1
    echo "== trace of a decode step at depth $depth"
    python3 tools/cuda_trace.py "$trace" --launches 24 | tee "$out/trace-d$depth.txt"
done
echo "== celer bench (normal build)"
build/celer bench -m "$model" --device cuda -p 0 -n 128 -d 0,2048 -r 3 | tee "$out/bench.txt"
