#!/usr/bin/env bash
# Runs every test program in BUILD/tests and adds up their "N passed, M failed, K skipped"
# lines, showing each FAIL and SKIP line on the way. The last line is the total; the exit
# status is non-zero on any failure or crash (skips alone do not fail the run).
set -u
build=${1:-build}
export CELER_BIN="$build/celer"
pass=0; fail=0; skip=0
# run_one NAME CMD...: runs a test program and adds its summary line to the totals.
run_one() {
    local name=$1; shift
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -E '^(FAIL|SKIP|  )' || true
    last=$(printf '%s\n' "$out" | tail -n 1)
    if [[ $last =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed(,\ ([0-9]+)\ skipped)? ]]; then
        pass=$((pass + BASH_REMATCH[1])); fail=$((fail + BASH_REMATCH[2])); skip=$((skip + ${BASH_REMATCH[4]:-0}))
        echo "${last/#test_*:/$name:}"
    else
        echo "$name: crashed or printed no summary (exit $rc)"; printf '%s\n' "$out" | tail -n 20
        fail=$((fail + 1))
    fi
    if [ $rc -ne 0 ] && [[ ! $last =~ [1-9][0-9]*\ failed ]]; then
        echo "$name: exit status $rc"; fail=$((fail + 1))
    fi
}
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
# The engine path a GPU takes (inputs moved up, rows moved down), on the CPU backend.
for t in test_contract test_engine test_parity test_vlm; do
    [ -x "$build/tests/$t" ] && run_one "$t (staged)" env CELER_CPU_STAGED=1 "$build/tests/$t"
done
# The end-to-end server suite (starts its own servers on loopback).
out=$(bash tests/server/run.sh "$build" 2>&1); rc=$?
printf '%s\n' "$out" | grep -E '^(FAIL|SKIP)' || true
last=$(printf '%s\n' "$out" | tail -n 1)
if [[ $last =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed(,\ ([0-9]+)\ skipped)? ]]; then
    pass=$((pass + BASH_REMATCH[1])); fail=$((fail + BASH_REMATCH[2])); skip=$((skip + ${BASH_REMATCH[4]:-0})); echo "$last"
else
    echo "test_server: crashed or printed no summary (exit $rc)"; printf '%s\n' "$out" | tail -n 20; fail=$((fail + 1))
fi
if [ $rc -ne 0 ] && [[ ! $last =~ [1-9][0-9]*\ failed ]]; then echo "test_server: exit status $rc"; fail=$((fail + 1)); fi
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
