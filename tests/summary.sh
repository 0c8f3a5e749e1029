# tests/summary.sh - sourced by the test runners: run_one runs a test program and adds
# its "N passed, M failed, K skipped" line to the totals pass, fail and skip.
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
