#!/usr/bin/env bash
# Runs every test program in BUILD/tests and adds up their "N passed, M failed, K skipped"
# lines, showing each FAIL and SKIP line on the way. The last line is the total; the exit
# status is non-zero on any failure or crash (skips alone do not fail the run).
set -u
build=${1:-build}
export CELER_BIN="$build/celer"
# shellcheck source=tests/summary.sh
. "$(dirname "${BASH_SOURCE[0]}")/summary.sh"
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
# The engine path a GPU takes (inputs moved up, rows moved down), on the CPU backend.
for t in test_contract test_engine test_parity test_vlm test_faults; do
    [ -x "$build/tests/$t" ] && run_one "$t (staged)" env CELER_CPU_STAGED=1 "$build/tests/$t"
done
# The reader of the CUDA trace build's timelines (tools/cuda_trace.py) on a made-up trace.
run_one "cuda_trace reader" python3 tools/cuda_trace.py --selftest "$build/cuda_trace_selftest.trace"
# Models by name: the fake Hugging Face Hub, a cache filled from it, celer resolving names.
run_one test_hub bash tests/hub/run.sh "$build"
# The end-to-end server suite (starts its own servers on loopback).
run_one test_server bash tests/server/run.sh "$build"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
