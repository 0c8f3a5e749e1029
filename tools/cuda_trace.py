#!/usr/bin/env python3
"""Where a CUDA step's time goes, from the records of a trace build (src/backend/cuda/trace.h).

    make CUDA_TRACE=1 BUILD=build/trace build/trace/celer
    CELER_CUDA_TRACE=/tmp/step.trace CELER_CUDA_TRACE_STEP=64 \\
        build/trace/celer bench -m MODEL --device cuda -p 0 -n 128 -r 1
    python3 tools/cuda_trace.py /tmp/step.trace [--launches N]

Each launch of a traced kernel is one run of records (one per block, in stream order).
For a launch, with `prev` the end of the launch before it:
  start   its first block's start
  ready   the first block past griddepcontrol.wait (the kernel before it finished)
  end     its last block's end
  gap     ready - prev: from the last block before leaving to this launch's work starting
  span    end - prev: what the launch adds to the step
and per block (medians): wait (start to ready), work (ready to the warps' own work done;
products only), tail (work done, or ready, to the block's end: a split product's partial
sums and the last block's reduction).

The table sums the launches of each kernel and grid over the step; spans add up to the
step's time from the first traced start. Only this module's standard library is used.
"""
import argparse
import statistics
import struct
import sys
from collections import OrderedDict

REC = struct.Struct("<QQ8I")  # cuda_trace_rec: begin_ns, end_ns, ready/work/end cycles, tag, blocks, block, sm, pad


def read(path):
    """(tag names, records as tuples) of a trace file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"CELTRACE":
        raise SystemExit(f"{path}: not a celer trace")
    version, ntags, n, size = struct.unpack_from("<4I", data, 8)
    if version != 1 or size != REC.size:
        raise SystemExit(f"{path}: trace version {version}, record size {size}: this reader knows 1, {REC.size}")
    off = 24
    names = [data[off + 32 * i: off + 32 * (i + 1)].split(b"\0")[0].decode() for i in range(ntags)]
    off += 32 * ntags
    if len(data) < off + n * size:
        raise SystemExit(f"{path}: {n} records announced, the file is shorter")
    recs = [REC.unpack_from(data, off + i * size) for i in range(n)]
    return names, recs


def cycles_per_ns(recs):
    """The SMs' clock from records that ran long enough to read it (globaltimer is coarse)."""
    rates = [r[4] / (r[1] - r[0]) for r in recs if r[1] - r[0] >= 4000 and r[4] > 0]
    if not rates:
        rates = [r[4] / (r[1] - r[0]) for r in recs if r[1] > r[0] and r[4] > 0]
    return statistics.median(rates) if rates else 1.0


def launches(recs):
    """Splits the records into launches: runs of `blocks` records of one tag and grid."""
    out, i = [], 0
    while i < len(recs):
        tag, blocks = recs[i][5], recs[i][6]
        run = recs[i:i + blocks]
        if len(run) < blocks or any(r[5] != tag or r[6] != blocks for r in run):
            raise SystemExit(f"record {i}: a launch of {blocks} blocks is not whole (buffer full, or mixed streams)")
        out.append(run)
        i += blocks
    return out


def describe(run, names, f, prev_end):
    """One launch's times in ns (see the module's text)."""
    start = min(r[0] for r in run)
    ready = [r[0] + r[2] / f for r in run]
    end = max(r[1] for r in run)
    first_ready = min(ready)
    base = prev_end if prev_end is not None else start
    return {
        "name": names[run[0][5]] if run[0][5] < len(names) else f"tag{run[0][5]}",
        "blocks": run[0][6],
        "sms": len({r[8] for r in run}),
        "start": start,
        "ready": first_ready,
        "end": end,
        "gap": first_ready - base,
        "span": end - base,
        "wait": statistics.median(r[2] / f for r in run),
        "work": statistics.median(r[3] - r[2] for r in run) / f if any(r[3] for r in run) else 0.0,
        "tail": statistics.median(r[4] - (r[3] or r[2]) for r in run) / f,
    }


def us(ns):
    return f"{ns / 1000:.2f}"


def report(path, show, say=print):
    names, recs = read(path)
    if not recs:
        raise SystemExit(f"{path}: no records")
    f = cycles_per_ns(recs)
    runs = launches(recs)
    rows, prev = [], None
    for run in runs:
        d = describe(run, names, f, prev)
        rows.append(d)
        prev = d["end"]
    t0 = rows[0]["start"]
    total = rows[-1]["end"] - t0
    say(f"{path}: {len(recs)} block records, {len(rows)} launches, step {us(total)} us "
          f"(first traced start to last end), SM clock {f:.3f} GHz")

    groups = OrderedDict()
    for d in rows:
        groups.setdefault((d["name"], d["blocks"]), []).append(d)
    say(f"\n{'kernel':<18} {'blocks':>6} {'launches':>8} {'span us':>9} {'share':>6} {'gap':>6} "
          f"{'body':>6} {'wait':>6} {'work':>6} {'tail':>6}   (us; per launch: means)")
    for (name, blocks), ds in sorted(groups.items(), key=lambda kv: -sum(d["span"] for d in kv[1])):
        span = sum(d["span"] for d in ds)
        mean = lambda k: sum(d[k] for d in ds) / len(ds)
        say(f"{name:<18} {blocks:>6} {len(ds):>8} {us(span):>9} {100 * span / total:>5.1f}% {us(mean('gap')):>6} "
              f"{us(mean('end') - mean('ready')):>6} {us(mean('wait')):>6} {us(mean('work')):>6} {us(mean('tail')):>6}")
    if show:
        say(f"\n{'#':>4} {'kernel':<18} {'blocks':>6} {'SMs':>4} {'start':>9} {'ready':>9} {'end':>9} "
              f"{'gap':>6} {'span':>6}   (us from the first start)")
        for i, d in enumerate(rows[:show]):
            say(f"{i:>4} {d['name']:<18} {d['blocks']:>6} {d['sms']:>4} {us(d['start'] - t0):>9} "
                  f"{us(d['ready'] - t0):>9} {us(d['end'] - t0):>9} {us(d['gap']):>6} {us(d['span']):>6}")
    return rows


class Checks:
    """Counts checks and prints a FAIL line for each that fails; the summary line last."""

    def __init__(self, name, say=print):
        self.name, self.passed, self.failed, self.say = name, 0, 0, say

    def __call__(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            self.say(f"FAIL {what}")

    def summary(self):
        self.say(f"{self.name}: {self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0


# The global timer may tick in steps of up to a microsecond: orderings are held to this.
TICK_NS = 2000


def check(path, kernels, say=print):
    """What a trace of a decode step must show: whole launches in stream order, each block's
    times in order, and each launch's work after the launch before it ended."""
    c = Checks("cuda_trace", say)
    names, recs = read(path)
    c(len(recs) > 0, "the trace has records")
    try:
        runs = launches(recs)
    except SystemExit as e:
        c(False, str(e))
        return c.summary()
    c(True, f"{len(runs)} whole launches")
    f = cycles_per_ns(recs)
    c(0.5 < f < 3.0, f"an SM clock of {f:.3f} GHz")
    c(all(r[1] >= r[0] for r in recs), "every block ends after it starts")
    c(all(r[2] <= r[4] and r[3] <= r[4] for r in recs), "every block is ready and done before its end")
    prev, late = None, []
    for i, run in enumerate(runs):
        d = describe(run, names, f, prev)
        if prev is not None and d["ready"] < prev - TICK_NS:
            late.append(f"launch {i} ({d['name']}) ready {us(prev - d['ready'])} us before launch {i - 1} ended")
        prev = d["end"]
    c(not late, "each launch's work starts after the one before it ended" + ("".join("\n  " + m for m in late[:5])))
    seen = {names[r[5]] for r in recs if r[5] < len(names)}
    for k in kernels:
        c(any(s == k or s.startswith(k + "_") for s in seen), f"a {k} launch is in the step (saw {sorted(seen)})")
    return c.summary()


def selftest(path):
    """Writes a trace of three made-up launches and checks what the reader makes of it."""
    names = ["gemv", "rmsnorm"]
    recs = []
    ghz = 2.0
    # launch 0: 2 blocks of gemv from t=1000, ready at +500 ns, work done +2000, end +3000
    for b in range(2):
        recs.append((1000 + b, 4000, int(500 * ghz), int(2000 * ghz), int(3000 * ghz), 0, 2, b, b, 0))
    # launch 1: 1 block of rmsnorm, starts 3500 (before 0 ended: PDL), ready 4200, ends 5000
    recs.append((3500, 5000, int(700 * ghz), 0, int(1500 * ghz), 1, 1, 0, 0, 0))
    # launch 2: 2 blocks of gemv again
    for b in range(2):
        recs.append((4800, 9000, int(1000 * ghz), int(3000 * ghz), int(4200 * ghz), 0, 2, b, 5 + b, 0))
    with open(path, "wb") as f:
        f.write(b"CELTRACE" + struct.pack("<4I", 1, len(names), len(recs), REC.size))
        for n in names:
            f.write(n.encode().ljust(32, b"\0"))
        for r in recs:
            f.write(REC.pack(*r))
    c = Checks("cuda_trace reader")
    quiet = lambda line: None
    rows = report(path, 3, quiet)
    c(len(rows) == 3, "three launches")
    c([d["name"] for d in rows] == ["gemv", "rmsnorm", "gemv"], "their kernels in order")
    c(abs(rows[1]["gap"] - 200) < 1e-6, "gap: ready 4200 - the previous end 4000")
    c(abs(rows[1]["span"] - 1000) < 1e-6, "span: 5000 - 4000")
    c(abs(rows[2]["span"] - 4000) < 1e-6, "span: 9000 - 5000")
    c(abs(rows[0]["work"] - 1500) < 1e-6, "work: from ready (500 ns) to done (2000 ns)")
    c(check(path, ["gemv", "rmsnorm"], quiet) == 0, "the made-up step passes check")
    with open(path, "r+b") as f:  # one block of the last launch lost: not whole
        f.truncate(24 + 32 * len(names) + 4 * REC.size)
        f.seek(16)
        f.write(struct.pack("<I", 4))
    c(check(path, [], quiet) != 0, "a launch with a block missing fails check")
    return c.summary()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="the file CELER_CUDA_TRACE named (with --selftest: where to write one)")
    ap.add_argument("--launches", type=int, default=0, metavar="N", help="also list the first N launches")
    ap.add_argument("--check", metavar="KERNELS", help="check the trace (test-cuda): whole launches in order, and "
                    "one launch at least of each kernel in the comma-separated list")
    ap.add_argument("--selftest", action="store_true", help="write a made-up trace to TRACE and check the reader")
    a = ap.parse_args()
    if a.selftest:
        return selftest(a.trace)
    if a.check is not None:
        return check(a.trace, [k for k in a.check.split(",") if k])
    report(a.trace, a.launches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
