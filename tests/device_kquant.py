#!/usr/bin/env python3
"""K-quant mixes of a trained model's scales on the device against the CPU:

    python3 tests/device_kquant.py CELER DEVICE

Small models in llama-quantize's Q4_K_M and Q5_K_M mixes (bench/kquant_models.py: random
codes, factors in the range a trained model's take), their logits through `celer logits`
on the CPU and on DEVICE for a decode's few rows and a prefill's many (the device's dense
product, fp16 operands), within 2e-3 of the largest. tests/test_quant_formats.c covers every
format at fp32; this covers the prefill at realistic scales. Needs numpy and gguf-py
(tools/requirements.txt pins both); prints one line per check and the suite's summary line.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHAPE = ["--layers", "2", "--hidden", "1024", "--ffn", "2816", "--heads", "8", "--kv-heads", "2", "--vocab", "4096"]


def logits(celer, model, ids, device, out):
    cmd = [celer, "logits", "-m", str(model), "--ids", ",".join(map(str, ids)), "--all", "-o", str(out)]
    if device:
        cmd += ["--device", device]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return np.load(out)


def main():
    celer, device = sys.argv[1], sys.argv[2]
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for mix in ("q4_k_m", "q5_k_m"):
            model = Path(tmp) / f"{mix}.gguf"
            subprocess.run([sys.executable, str(ROOT / "bench/kquant_models.py"), "--out", str(model), "--mix", mix]
                           + SHAPE, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for n in (6, 150):
                ids = [(3 + 29 * i) % 4000 for i in range(n)]
                cpu = logits(celer, model, ids, None, Path(tmp) / "cpu.npy")
                dev = logits(celer, model, ids, device, Path(tmp) / "dev.npy")
                d, mx = float(np.abs(cpu - dev).max()), float(np.abs(cpu).max())
                ok = d <= 2e-3 * mx
                passed, failed = passed + ok, failed + (not ok)
                print(f"{'  ' if ok else 'FAIL: '}{mix}, {n} rows: {device} against the CPU {d:.3g} "
                      f"(max |logit| {mx:.3g})")
    print(f"device_kquant: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
