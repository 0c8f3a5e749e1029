#!/usr/bin/env bash
# The GPU suite (make test-cuda), on a machine with the device: every backend op against
# the reference backend (test_device_ops), every fixture against the transformers goldens
# and the model contract on the device (test_parity, test_vlm, test_contract:
# CELER_TEST_DEVICE), CUDA errors as statuses (test_faults: CELER_FAULT_STEP), the engine
# wholly on the device (test_engine: CELER_DEVICE), the real model's KL against the CPU
# reference (test_real_kl), K-quant mixes against the CPU (device_kquant.py), the server suite with every server on the device (its fault
# servers lose the device for real) (tests/server/run.sh: CELER_DEVICE), the affine product kernels'
# own test when built (BUILD/cuda/test_affine), and a decode step's trace when the trace
# build is there (BUILD/trace/celer). Same summary lines as run.sh. The test programs live
# in BUILD/tests: CELER_CUDA_MODULE names them the module beside BUILD/celer (the binaries
# find their own beside them).
#   bash tests/run_cuda.sh [BUILD] [DEVICE]      DEVICE: cuda (default), cuda:N
set -u
build=${1:-build}
device=${2:-cuda}
export CELER_BIN="$build/celer" CELER_TEST_DEVICE="$device"
module="$build/celer-cuda.so"
[ -f "$module" ] || { echo "run_cuda: $module is missing (make builds it with $build/celer)"; exit 1; }
# shellcheck source=tests/summary.sh
. "$(dirname "${BASH_SOURCE[0]}")/summary.sh"
# the module itself first: loaded on first use, cuBLAS opened by the first CUDA context
run_one "test_module ($device)" env CELER_CUDA_MODULE="$module" "$build/tests/test_module"
for t in test_device_ops test_parity test_vlm test_contract test_quant_formats test_real_kl; do
    run_one "$t ($device)" env CELER_CUDA_MODULE="$module" "$build/tests/$t"
done
# K-quant mixes of realistic scales through the dense prefill (numpy and gguf-py: make fixtures' venv)
py=${PYTHON:-build/venv/bin/python}
if "$py" -c "import gguf, numpy" 2> /dev/null; then
    run_one "device_kquant ($device)" "$py" tests/device_kquant.py "$build/celer" "$device"
else
    echo "SKIP device_kquant: $py has no numpy and gguf-py (make fixtures installs them)"; skip=$((skip + 1))
fi
run_one "test_engine ($device)" env CELER_DEVICE="$device" CELER_CUDA_MODULE="$module" "$build/tests/test_engine"
# failed steps as statuses: CELER_FAULT_STEP's real CUDA errors (the lost device last)
run_one "test_faults ($device)" env CELER_CUDA_MODULE="$module" "$build/tests/test_faults"
# the OpenAI-compatible server end to end, every model on the device (celer serve reads CELER_DEVICE)
run_one "test_server ($device)" env CELER_DEVICE="$device" bash tests/server/run.sh "$build"
[ -x "$build/cuda/test_affine" ] && run_one "test_affine ($device)" "$build/cuda/test_affine"
# the trace build's timeline of one decode step (src/backend/cuda/trace.h), when built
if [ -x "$build/trace/celer" ]; then
    trace="$build/trace/step.trace"
    rm -f "$trace"
    CELER_CUDA_TRACE="$trace" CELER_CUDA_TRACE_STEP=6 "$build/trace/celer" bench -m tests/fixtures/llama3-q4g64 \
        --device "$device" -p 0 -n 16 -r 1 > "$build/trace/bench.log" 2>&1
    run_one "cuda_trace ($device)" python3 tools/cuda_trace.py --check gemv,rmsnorm,rope_store,attention_decode "$trace"
fi
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
