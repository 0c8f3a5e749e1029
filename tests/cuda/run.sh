#!/bin/bash
# tests/cuda/run.sh - builds the CUDA affine test and benchmark into build/cuda and runs
# them: the test first (its last line: "N passed, N failed"), then the benchmark, then
# (NCU=1, the default where ncu exists) Nsight Compute on three decode products.
# Logs go to $OUT when set (the GPU machine), else build/cuda.
set -u
cd "$(dirname "$0")/../.."
LOG=${OUT:-build/cuda}
NVCC=${NVCC:-nvcc}
FLAGS="-O3 -std=c++20 -Iinclude -Isrc -Xcompiler -Wall,-Wextra,-Wno-unused-parameter -gencode arch=compute_90,code=sm_90"
mkdir -p build/cuda "$LOG"
# the warpgroup prefill product exists only for sm_90a (as in the Makefile)
$NVCC $FLAGS -c src/backend/cuda/affine.cu -o build/cuda/affine.o &&
    $NVCC ${FLAGS/arch=compute_90,code=sm_90/arch=compute_90a,code=sm_90a} -c src/backend/cuda/affine_gemm.cu -o build/cuda/affine_gemm.o || exit 1
$NVCC $FLAGS tests/cuda/test_affine.cu build/cuda/affine.o build/cuda/affine_gemm.o -o build/cuda/test_affine &
$NVCC $FLAGS tests/cuda/bench_affine.cu build/cuda/affine.o build/cuda/affine_gemm.o -lcublas -o build/cuda/bench_affine &
wait
[ -x build/cuda/test_affine ] && [ -x build/cuda/bench_affine ] || exit 1
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee "$LOG/gpu.txt"
echo "test start $(date +%T)"; ./build/cuda/test_affine > "$LOG/test.log" 2>&1
rc=$?
grep -v "^FAIL" "$LOG/test.log" | tail -20
grep "^FAIL" "$LOG/test.log" | head -20
echo "bench start $(date +%T)"; ./build/cuda/bench_affine 2>&1 | tee "$LOG/bench.log"; echo "bench end $(date +%T)"
if [ "${NCU:-1}" = 1 ] && command -v ncu > /dev/null; then
    timeout 100 ncu --clock-control none -k regex:affine_gemv --launch-skip 53 --launch-count 3 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section WarpStateStats --section LaunchStats --section SchedulerStats --section InstructionStats \
        ./build/cuda/bench_affine --profile > "$LOG/ncu.log" 2>&1
    grep -E "affine_gemv|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers|Block Limit|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall|Compute \(SM\)" "$LOG/ncu.log" | head -60
fi
exit $rc
