#!/usr/bin/env bash
# Time per kernel of celer's decode steps on the GPU, from Nsight Compute: every kernel of
# about one decode step (LAUNCHES kernels after the first SKIP), summed by kernel name.
# ncu runs kernels one at a time, so the total is the step's kernel time without overlap.
#   bash bench/cuda_profile.sh MODEL [SKIP] [LAUNCHES]      (celer at $CELER_BIN or build/celer)
set -eu
model=$1 skip=${2:-1100} count=${3:-520}
celer=${CELER_BIN:-build/celer}
out=$(mktemp)
ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip "$skip" --launch-count "$count" \
    "$celer" generate -m "$model" --ids 1,2,3 -n 5 --no-chat-template --device cuda > "$out" 2>&1
python3 - "$out" <<'P'
import collections, re, sys
total, calls, name = collections.defaultdict(float), collections.Counter(), None
unit = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}
for line in open(sys.argv[1]):
    m = re.match(r"\s+(\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
    if m:
        name = m.group(1).split("(")[0][:60]
        continue
    m = re.search(r"gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)", line)
    if m and name:
        total[name] += float(m.group(2).replace(",", "")) * unit.get(m.group(1), 1.0)
        calls[name] += 1
print(f"total {sum(total.values()):.1f} us over {sum(calls.values())} kernels")
for k, v in sorted(total.items(), key=lambda kv: -kv[1]):
    print(f"{v:9.1f} us {calls[k]:4d}x  {k}")
P
rm -f "$out"
