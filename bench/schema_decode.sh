#!/usr/bin/env bash
# Decode speed under a JSON schema against the same request free (docs/benchmarks.md,
# "Serving greedy and sampled requests; structured output's cost"): celer generate on the
# default model, 128 tokens at temperature 0.8, 2 threads, A B B A three times, the free run
# with --ignore-eos, the constrained one under a schema whose long string keeps almost every
# token allowed (the mask's widest case). Prints each run and the medians.
# Run: bash bench/schema_decode.sh [MODEL]   (after make all)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model=${1:-$(bash "$root/tools/fetch_model.sh" | tail -1)}
bin="$root/build/celer"
schema='{"type": "object", "properties": {"story": {"type": "string", "minLength": 1000}}, "required": ["story"]}'
prompt="Write a long story about a lighthouse keeper, as JSON."
run() { # prints the decode tok/s of one run
    local extra=(--ignore-eos)
    [ "$1" = schema ] && extra=(--json-schema "$schema")
    "$bin" generate -m "$model" -p "$prompt" -n 128 --temp 0.8 --seed 1 -t 2 "${extra[@]}" 2>&1 >/dev/null |
        sed -n 's/.*generated: [0-9]* tokens, \([0-9.]*\) tok\/s.*/\1/p'
}
declare -A all=([free]="" [schema]="")
for round in 1 2 3; do
    for kind in free schema schema free; do
        t=$(run $kind)
        echo "round $round $kind: $t tok/s"
        all[$kind]+="$t "
    done
done
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
f=$(echo "${all[free]}" | median); s=$(echo "${all[schema]}" | median)
echo "median: free $f tok/s, schema $s tok/s, ratio $(awk -v a="$s" -v b="$f" 'BEGIN {printf "%.2f", a / b}')"
