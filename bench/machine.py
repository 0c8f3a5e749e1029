"""What a benchmark report says about the machine and the code it measured: load
average, CPU model and flags, GPUs and the CUDA compiler, celer's commit, package versions.
Shared by bench/run.py, bench/vision.py, bench/serve.py and bench/cuda.py."""
import platform
import subprocess
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def loadavg():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return " ".join(f for f in CPU_FLAGS if f in flags)
    except OSError:
        pass
    return ""


def git_commit():
    """HEAD's short hash, marked when src, include or the Makefile have uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "src", "include",
                                "Makefile"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return head + (" (with uncommitted changes in src/include/Makefile)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def version_of(pkg):
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def gpu_info():
    """One line per GPU from nvidia-smi ("NVIDIA H200, 143771 MiB, driver 580.159.04"), or
    [] where there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        name, mem, driver = (x.strip() for x in line.split(",", 2))
        gpus.append(f"{name}, {mem}, driver {driver}")
    return gpus


def nvcc_version(nvcc="nvcc"):
    """"release 13.0, V13.0.88" from nvcc --version, or "not found"."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "not found"
    lines = [l for l in out.splitlines() if "release" in l]
    return lines[-1].split(",", 1)[1].strip() if lines and "," in lines[-1] else "unknown"
